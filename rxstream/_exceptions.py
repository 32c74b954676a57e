"""The exceptions rxstream raises, under one root.

::

    RxStreamError
    ├── ArgumentError            an argument, option or environment setting its rule refuses
    │                            (a range, a choice, a combination; also a ValueError)
    ├── ArgumentTypeError        an argument of the wrong type or name (also a TypeError)
    ├── AppEntryError            an app entry with no build(ctx) or main(ctx) to call
    │                            (also an AttributeError)
    ├── PipelineError            a stage failed while the pipeline ran (run, drive, wait raise it)
    ├── TaskError                a task the app spawned with ``ctx.spawn`` failed (run raises it)
    ├── ResourceError            a resource's loader raised (``ctx.resource``; also a RuntimeError)
    ├── StageBuildError          a pipeline was composed wrongly (also a ValueError)
    │   └── StageReuseError      one stage object placed at two positions in a graph
    ├── PipelineStateError       a lifecycle call out of order (start twice, wait before start;
    │                            also a RuntimeError)
    ├── RankLost                 a rank or a host's ranks went away (also a RuntimeError;
    │                            the cause of the PipelineError that ends a launch)
    ├── UnknownInputError        a feed to an input stream the pipeline does not have
    │                            (also a LookupError)
    ├── SampleRefused            a client sample ``feed`` refused (also a ValueError)
    │   ├── ClientStreamLimitExceeded  past the stream's ``ClientStreamLimits``
    │   └── InvalidSample        a sample that breaks its stream's schema
    ├── SelfTestError            the block of ``ctx.self_test()`` raised (also an AssertionError)
    ├── DocPathError             a doc path that does not exist (also a LookupError)
    ├── DocValidationError       a doc write its rules refuse (also a ValueError)
    │   └── SettingError         a ``--set KEY=VALUE`` that cannot be typed or that the doc refuses
    ├── FramingError             a payload that cannot cross a rank boundary (also a TypeError)
    ├── PayloadTooLarge          a framed item larger than a ring slot (also a ValueError)
    ├── RingClosed               put or get on a closed shared-memory ring (get: once drained)
    ├── RingConflict             a second producer or consumer on a ring (also a RuntimeError)
    ├── TopologyError            a partition topology declared against a rule (also a ValueError)
    │   └── DeploymentError      a serving config the model's topology refuses, every problem listed
    ├── StreamBufferClosed       an item put into a closed StreamBuffer (also a RuntimeError)
    ├── CodecError               a payload an egress codec cannot encode (also a ValueError)
    ├── ItemRefused              a transport declined an item: its sink counts a drop (not a
    │                            failure; in rxstream.transport)
    └── CudaIpcError             the CUDA IPC bridge refused a call (``rxstream.ipc``)
        ├── CudaDeviceError      export of a tensor that is not on a CUDA device (also a ValueError)
        ├── CudaUnavailableError a CUDA tensor in a process without CUDA (also a RuntimeError)
        └── CudaRefError         a ref id not held by the exporter or not open (also a LookupError)

Every error rxstream raises at a user (a bad argument, a refused write, a failed run) is one
of these; where one refines a builtin's meaning it is that builtin too, so ``except
ValueError`` keeps working. An exception raised inside a running stage reaches the user as
the ``__cause__`` of a :class:`PipelineError`, whatever its type. Left builtin on purpose:
``TimeoutError`` from a ``get(timeout=)`` or a wait that ran out, ``OSError`` from the system,
``AttributeError`` of attribute access, and assertions of the engine's own invariants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "NO_VALUE",
    "AppEntryError",
    "ArgumentError",
    "ArgumentTypeError",
    "ClientStreamLimitExceeded",
    "CodecError",
    "CudaDeviceError",
    "CudaIpcError",
    "CudaRefError",
    "CudaUnavailableError",
    "DeploymentError",
    "DocPathError",
    "DocValidationError",
    "FramingError",
    "InvalidSample",
    "ItemRefused",
    "PayloadTooLarge",
    "PipelineError",
    "PipelineStateError",
    "RankLost",
    "ResourceError",
    "RingClosed",
    "RingConflict",
    "RxStreamError",
    "SampleRefused",
    "SelfTestError",
    "SettingError",
    "StageBuildError",
    "StageReuseError",
    "StreamBufferClosed",
    "TaskError",
    "TopologyError",
    "UnknownInputError",
    "shown",
]


class RxStreamError(Exception):
    """The root of every error rxstream raises on purpose."""


class ArgumentError(RxStreamError, ValueError):
    """An argument, option or environment setting its rule refuses: out of range, not one of
    the choices, or a combination that cannot work; names it, the rule and the value."""


class ArgumentTypeError(RxStreamError, TypeError):
    """An argument of the wrong type (or a keyword that names no field); names it, what it
    must be and what was given."""


class AppEntryError(RxStreamError, AttributeError):
    """An app entry (``app.py[:func]``, ``module[:func]``) that names nothing to run: no
    ``build(ctx)``, no ``async def main(ctx)``, or no callable ``func``."""


class PipelineError(RxStreamError):
    """A stage failed while the pipeline ran; names the stage, the item and the cause.

    ``stage`` is the stage's name, ``pts`` and ``input_seq`` identify the item it was
    working on (``None`` when the failure was not about an item, e.g. a source that
    raised on start), and ``__cause__`` holds the original exception.
    """

    def __init__(
        self,
        stage: str,
        cause: BaseException,
        *,
        pts: int | None = None,
        input_seq: int | None = None,
    ) -> None:
        self.stage = stage
        self.pts = pts
        self.input_seq = input_seq
        self.cause = cause
        where = "" if pts is None else f" on item pts={pts} input_seq={input_seq}"
        super().__init__(f"stage {stage!r} failed{where}: {type(cause).__name__}: {cause}")
        self.__cause__ = cause

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_pipeline_error, (self.stage, self.cause, self.pts, self.input_seq))


def _rebuild_pipeline_error(
    stage: str, cause: BaseException, pts: int | None, input_seq: int | None
) -> PipelineError:
    return PipelineError(stage, cause, pts=pts, input_seq=input_seq)


class TaskError(RxStreamError):
    """A task the app spawned with ``ctx.spawn`` raised; names the task and the cause.

    ``task`` is the task's name and ``__cause__`` the exception it raised. It ends every
    ``pipeline.run()`` of the task's context under way, each raising it (``rxstream run``
    exits 1 with its message).
    """

    def __init__(self, task: str, cause: BaseException) -> None:
        self.task = task
        self.cause = cause
        super().__init__(f"task {task!r} failed: {type(cause).__name__}: {cause}")
        self.__cause__ = cause

    def __reduce__(self) -> tuple[object, ...]:
        return (TaskError, (self.task, self.cause))


class ResourceError(RxStreamError, RuntimeError):
    """The loader of a resource (``ctx.resource(name, loader)``) raised; names the resource,
    its loader and the cause. In a run it is the cause of the :class:`PipelineError` naming
    the stage that needed the resource."""

    def __init__(self, resource: str, loader: str, cause: BaseException) -> None:
        self.resource = resource
        self.loader = loader
        self.cause = cause
        super().__init__(
            f"resource {resource!r}: its loader {loader} raised {type(cause).__name__}: {cause}"
        )
        self.__cause__ = cause

    def __reduce__(self) -> tuple[object, ...]:
        return (ResourceError, (self.resource, self.loader, self.cause))


class StageBuildError(RxStreamError, ValueError):
    """A pipeline was composed against a rule; the message names the stage and the rule."""


class StageReuseError(StageBuildError):
    """One stage object sits at two positions of a graph (fan-out shares the upstream instead)."""


class PipelineStateError(RxStreamError, RuntimeError):
    """A lifecycle method was called in a state that does not allow it."""


class RankLost(RxStreamError, RuntimeError):
    """A rank (or a host's ranks) went away: a connection broke or its heartbeats stopped."""

    def __init__(self, ranks: tuple[int, ...], message: str) -> None:
        super().__init__(message)
        self.ranks = ranks
        """The ranks that went away, ascending."""

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.ranks, str(self))


class UnknownInputError(RxStreamError, LookupError):
    """A sample fed to an input stream the pipeline (or the session) does not have; names the
    stream and the inputs there are."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0])


NO_VALUE: Any = object()
"""What :attr:`InvalidSample.value` is when the rule is about a key (missing, unknown)."""


def shown(value: Any, limit: int = 60) -> str:
    """How an error message names the value it refuses: its ``repr``, never a flood. An int
    too long to print (or to read) is named by its size, ``<int of N bits>``; a ``repr``
    longer than ``limit`` characters is cut to its start and end (``'abc…xyz'``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<int of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}…{text[-4:]}"


class SampleRefused(RxStreamError, ValueError):
    """A sample ``feed`` refused (nothing was queued or charged); ``code`` says which kind."""

    code = "refused"
    """What the web transport's error reply calls it: ``limit`` or ``invalid``."""

    def __init__(self, stream: str, message: str) -> None:
        self.stream = stream
        super().__init__(message)


class ClientStreamLimitExceeded(SampleRefused):
    """A client fed a stream past its bound; names the stream, the bound, the unit and amount."""

    code = "limit"

    def __init__(self, stream: str, bound: int, unit: str, amount: float) -> None:
        self.bound = bound
        self.unit = unit
        self.amount = amount
        super().__init__(
            stream,
            f"client stream {stream!r} is limited to {bound} {unit} per session; "
            f"this sample would bring it to {amount:g} {unit}",
        )


class InvalidSample(SampleRefused):
    """A sample (or its ``at_ms``, or its ``item_size``) that breaks a rule of its stream;
    names the stream, where in the sample, the rule and the value."""

    code = "invalid"

    def __init__(self, stream: str, where: str, rule: str, value: Any = NO_VALUE) -> None:
        self.where = where
        self.rule = rule
        self.value = value
        """The value refused (:data:`NO_VALUE` for a rule about a key: missing, unknown)."""
        got = "" if value is NO_VALUE else f", got {shown(value)}"
        super().__init__(stream, f"{where} {rule}{got} for client stream {stream!r}")


class ItemRefused(RxStreamError):
    """A transport declined an item (:meth:`~rxstream.transport.Transport.send` raised it):
    the sink counts the item as dropped with ``reason`` and passes it no further. Not a
    failure: the run goes on."""

    def __init__(self, reason: str, message: str = "") -> None:
        self.reason = reason
        super().__init__(message or f"item refused ({reason})")


class SelfTestError(RxStreamError, AssertionError):
    """The app's ``ctx.self_test()`` block raised; ``__cause__`` holds why."""


class DocPathError(RxStreamError, LookupError):
    """A doc path that does not exist; the message names it and the keys that do."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0])


class DocValidationError(RxStreamError, ValueError):
    """A write the doc's rules refuse; names the field, the rule and the value."""


class SettingError(DocValidationError):
    """A ``--set KEY=VALUE`` that is malformed, cannot be typed, or that the doc refuses."""


class FramingError(RxStreamError, TypeError):
    """A payload that cannot be framed to cross a rank boundary; names its type and why."""


class PayloadTooLarge(RxStreamError, ValueError):
    """A framed item larger than a ring slot; names both sizes and the ``slot_bytes=`` knob."""

    def __init__(self, message: str, *, size: int = 0, slot_bytes: int = 0) -> None:
        super().__init__(message)
        self.size = size
        """The framed item's bytes."""
        self.slot_bytes = slot_bytes
        """The bytes a slot of the ring holds."""


class RingClosed(RxStreamError):
    """A put on a closed ring, or a get on a closed ring that has been drained."""

    waited_ns: int = 0
    """For a put: the nanoseconds it waited for a free slot before the close (its caller's
    stall, as the wait of a put that returns)."""


class RingConflict(RxStreamError, RuntimeError):
    """A second thread or process used a ring as producer (or consumer) beside the first one."""


class TopologyError(RxStreamError, ValueError):
    """A partition topology declared against a rule; names the connection, the rule, the value."""


class DeploymentError(TopologyError):
    """A serving config (or topology) that cannot be deployed; ``problems`` lists every one."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        count = len(self.problems)
        lines = "".join(f"\n- {problem}" for problem in self.problems)
        super().__init__(f"the deployment has {count} problem{'s' if count != 1 else ''}:{lines}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.problems,))


class StreamBufferClosed(RxStreamError, RuntimeError):
    """An item put into a :class:`~rxstream.topology.StreamBuffer` after ``close()``."""


class CodecError(RxStreamError, ValueError):
    """A payload an egress codec cannot encode; names the stream, the rule and the value."""


class CudaIpcError(RxStreamError):
    """The CUDA IPC bridge refused a call; the message names the tensor or ref and the rule."""


class CudaDeviceError(CudaIpcError, ValueError):
    """A tensor given to the CUDA bridge that is not on a CUDA device; names its device."""


class CudaUnavailableError(CudaIpcError, RuntimeError):
    """A CUDA tensor or ref met a process where CUDA is not available."""


class CudaRefError(CudaIpcError, LookupError):
    """A ref id the exporter does not hold, or a ref the importer has not opened."""
