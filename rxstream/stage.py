"""``Stage``: a declaration plus a factory for its Rx operator; ``|`` builds graphs of them.

A stage is a stream transducer with 0..N inputs. Composition never runs anything: ``a | b``
makes an immutable graph of nodes (a node is a stage and the nodes feeding it) held by a
:class:`~rxstream.pipeline.Pipeline`. A list head is fan-in: ``[a, b] | stage``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, get_args

from rxstream._exceptions import ArgumentTypeError, StageBuildError
from rxstream._kernel._inbox import InboxSpec
from rxstream._kernel._kind import StageKind
from rxstream._kernel._resources import Resource
from rxstream._kernel._shell import StageShell
from rxstream.typing import OnError, Operator

if TYPE_CHECKING:
    from rxstream.context import Context
    from rxstream.pipeline import Pipeline

__all__ = ["Node", "Stage", "StageKind", "cuda_path"]

_ON_ERROR = get_args(OnError)
_DEVICE = re.compile(r"cpu|cuda(:(0|[1-9][0-9]*))?")


class Stage:
    """One stage of a pipeline: what it is (name, kind, placement, inbox) and how it runs.

    ``kind`` is the kind's declaration (:class:`StageKind`: its shape and how the runtime
    treats it), which the stage keeps as ``declared``; ``stage.kind`` is its name.

    ``build(shell)`` returns the stage's Rx operator for one run. ``inputs`` is the range of
    input counts it accepts. ``target`` is the user's object behind it (the function or the
    source): its ``reset()`` runs on a flush, its ``close()`` when ``doc.bind`` replaces it.
    ``uses`` are the resources it reads (``ctx.resource``), which a run loads on its rank.
    ``device`` (``None``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``) is where the stage declares
    its tensors live; it chooses the boundaries at the stage's ends (a ``"cpu"`` end: the
    shared-memory ring alone, no CUDA crossing). Stages are made by the builders of
    :class:`~rxstream.Context`.
    """

    __slots__ = (
        "build",
        "context",
        "declared",
        "device",
        "explicit_name",
        "inbox",
        "kind",
        "max_inputs",
        "min_inputs",
        "name",
        "on_error",
        "options",
        "rank",
        "source",
        "target",
        "uses",
    )

    def __init__(
        self,
        *,
        kind: StageKind,
        name: str,
        build: Callable[[StageShell], Operator],
        context: Context,
        explicit_name: bool = False,
        inputs: tuple[int, int | None] = (1, 1),
        rank: int | None = None,
        device: str | None = None,
        inbox: InboxSpec | None = None,
        on_error: OnError = "raise",
        source: object = None,
        target: object = None,
        options: object = None,
        uses: tuple[Resource[Any], ...] = (),
    ) -> None:
        if not isinstance(kind, StageKind):
            raise StageBuildError(
                f"stage kind {kind!r} has no declared shape: a Stage is built with a "
                f"StageKind (its shape, 1:1, N:1, 1:N, ...), got {type(kind).__name__} "
                f"for stage {name!r}"
            )
        if kind.is_source != (inputs[1] == 0):
            raise StageBuildError(
                f"stage {name!r}: a {kind.name} stage is shaped {kind.shape!r}, which "
                f"{'takes no' if kind.is_source else 'takes an'} input, got inputs={inputs!r}"
            )
        if not isinstance(name, str) or not name or "." in name:
            raise StageBuildError(
                f"stage name must be a non-empty str without '.', got {name!r} for a "
                f"{kind.name} stage"
            )
        if on_error not in _ON_ERROR:
            raise StageBuildError(
                f"on_error must be one of {', '.join(_ON_ERROR)}, got {on_error!r} "
                f"for stage {name!r}"
            )
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise StageBuildError(f"rank must be an int >= 0, got {rank!r} for stage {name!r}")
        if device is not None and (not isinstance(device, str) or not _DEVICE.fullmatch(device)):
            raise StageBuildError(
                f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r} for stage {name!r}"
            )
        try:
            self.inbox = (inbox or InboxSpec()).check(name)
        except ValueError as exc:
            raise StageBuildError(str(exc)) from None
        self.declared = kind
        self.kind = kind.name
        self.name = name
        self.explicit_name = explicit_name
        self.build = build
        self.context = context
        self.min_inputs, self.max_inputs = inputs
        self.rank = rank
        self.device = device
        self.on_error: OnError = on_error
        self.source = source
        self.target = target if target is not None else source
        if options is None:
            options = kind.options()
        if type(options) is not kind.options:
            raise StageBuildError(
                f"stage {name!r}: options must be a {kind.options.__name__} (what a "
                f"{kind.name} stage declares), got {type(options).__name__}"
            )
        self.options: object = options
        """The options its builder gave it: an instance of its kind's options class
        (``StageKind.options``)."""
        self.uses = uses
        """The resources (``ctx.resource``) the stage reads, as found in what it is made
        from: a run loads them on the stage's rank before its first item."""

    @property
    def is_source(self) -> bool:
        """Whether the stage takes no input and produces items."""
        return self.declared.is_source

    @property
    def is_sink(self) -> bool:
        """Whether the stage egresses (``ctx.stream``) and so must end a pipeline."""
        return self.declared.sink

    def __repr__(self) -> str:
        return f"<Stage {self.kind} {self.name!r}>"

    def latest(self, default: Any = None) -> Any:
        """An input's newest sample fed so far (taken or not); ``default`` before the first
        (a threaded run starts without one).

        For a source that reads it (``ctx.source(tick, reads=pointer)``, then
        ``pointer.latest()`` in ``tick``): the source's item carries that sample's
        correlation. Only a ``ctx.input`` stage has one.
        """
        if self.kind != "input":
            raise ArgumentTypeError(
                f"latest() reads an input's newest sample: stage {self.name!r} is a "
                f"{self.kind} stage, not a ctx.input"
            )
        return self.source.latest(default)  # type: ignore[attr-defined]

    # ``stage | x`` builds the stage's context's Pipeline class: this layer, below it, never
    # imports it, and every stage has the Context that made it.
    def __or__(self, other: Stage | Pipeline) -> Pipeline:
        return self.context._composes.of(self) | other

    def __ror__(self, left: Sequence[Stage | Pipeline]) -> Pipeline:
        return self.context._composes.fan_in(left, self)


def cuda_path(upstream: Stage, downstream: Stage) -> bool:
    """Whether a same-host boundary from ``upstream`` to ``downstream`` carries CUDA tensors
    through the CUDA IPC path (where the process has CUDA): unless either end declares
    ``device="cpu"``, which makes it the shared-memory ring alone."""
    return upstream.device != "cpu" and downstream.device != "cpu"


@dataclass(frozen=True)
class Node:
    """A stage at one place of a graph: the stage and the nodes that feed it, in port order.

    Nodes compare by structure (the same stage fed by the same nodes is the same node), so an
    upstream used in two compositions is one node with two consumers: a fan-out.
    """

    stage: Stage
    inputs: tuple[Node, ...] = ()
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((id(self.stage), self.inputs)))

    def __hash__(self) -> int:
        return self._hash
