"""What egresses on a launch: rank 0's session transport, the file, a rank's forwarding."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rxstream._exceptions import CodecError, ItemRefused, PipelineError
from rxstream._kernel._options import PaceOptions
from rxstream.item import PipelineItem
from rxstream.pipeline import Pipeline
from rxstream.runtime._threaded import ThreadedRun
from rxstream.timing import TimingRecord
from rxstream.transport import MemoryTransport, Session, Transport

# --- what egresses -----------------------------------------------------------------------------


def _pipeline_of(session: Session) -> Pipeline | None:
    """The pipeline whose run opened ``session`` (its ``feed`` is that pipeline's method)."""
    owner = getattr(session.feed, "__self__", None)
    return owner if isinstance(owner, Pipeline) else None


def _pace_fps(pipeline: Pipeline | None) -> float:
    """The frame rate of the pipeline's first ``pace`` stage (24 without one)."""
    if pipeline is not None:
        for stage in pipeline.stages.values():
            if isinstance(stage.options, PaceOptions):
                return float(stage.options.fps)
    return 24.0


class Egress(Transport):
    """Rank 0's session transport: the caller's (or an in-memory one) and the ``out`` file.

    It opens them with the first session and closes them when the launch ends. It passes at
    most ``frames`` items on, then ends the session (``connected`` turns false), as
    :meth:`end` does and as the caller's transport does when its client leaves.
    """

    def __init__(
        self,
        primary: Transport | None,
        *,
        out: str | Path | None,
        out_stream: str | None,
        frames: int | None,
        on_open: Callable[[], None] | None,
        stop: threading.Event | None = None,
    ) -> None:
        self._primary = primary if primary is not None else MemoryTransport(keep=1)
        self._stop = stop if stop is not None else threading.Event()
        self._out = out
        self._out_stream = out_stream
        self._on_open = on_open
        self.on_session: Callable[[Pipeline | None], None] = lambda _pipeline: None
        """Called with the first session's pipeline, before the transports open."""
        self.forwards = primary is not None or out is not None
        """Whether anything reads what egresses (else a rank > 0 keeps it to itself)."""
        self._inner: Transport | None = None
        self._gate = _Gate(frames, self.end)
        self._ended = False
        self.sent = 0
        """Items rank 0's sinks sent on (their ``out``, over every run of the launch)."""
        self.refused = 0
        """Items a rank > 0's sink forwarded (and counted ``out``) that the gate refused past
        ``frames``: :attr:`LaunchResult.refused <rxstream.ranks._common.LaunchResult.refused>`."""
        self.pipeline: Pipeline | None = None
        """The pipeline of the first session."""
        self.file: Any = None
        """The ``FileTransport`` writing ``out``, once open."""
        self.on_record: Callable[[TimingRecord], None] | None = None
        """Called with every timing record rank 0 sees (its sinks', and those a rank > 0
        forwards), session or not: the launch's exports (``ranks/_telemetry.py``)."""

    @property
    def connected(self) -> bool:
        return not self.stopping and not self._ended and self._primary.connected

    @property
    def stopping(self) -> bool:
        """Whether the launch's ``stop`` was set (a signal): the session ends now."""
        return self._stop.is_set()

    @property
    def ended(self) -> bool:
        """Whether the session is over: ended, stopped, its frames passed on, or — once it
        opened — its client gone (a page that has not come yet keeps it)."""
        return (
            self._ended
            or self.stopping
            or (self._inner is not None and not self._primary.connected)
        )

    def end(self) -> None:
        """End the session: ``connected`` turns false, and a ``run()`` holding on it returns."""
        self._ended = True

    def halt_at_frames(self, run: ThreadedRun) -> None:
        """Halt ``run`` as soon as the last of ``frames`` items passed."""

        def full() -> None:
            self.end()
            run.halt()

        self._gate.on_full = full

    def open(self, session: Session) -> None:
        if self._inner is not None:
            return  # one session transport a launch: a second run goes on in the first's
        pipeline = self.pipeline = _pipeline_of(session)
        self.on_session(pipeline)
        inner = self._primary
        if self._out is not None:
            from rxstream.transport import FileTransport, Tee

            self.file = FileTransport(self._out, stream=self._out_stream, fps=_pace_fps(pipeline))
            inner = Tee(self._primary, self.file)
        inner.open(session)
        self._inner = inner
        if self._on_open is not None:
            self._on_open()

    def send(self, stream: str, item: PipelineItem) -> None:
        inner = self._inner
        if inner is not None:
            self._gate.admit()
            inner.send(stream, item)
            self.sent += 1

    def forward(self, stream: str, item: PipelineItem) -> None:
        """Send an item a rank > 0's sink forwarded (the controller's watch). Its sink counted
        it ``out`` already, so one past ``frames`` (sinks on several ranks together past it)
        is not raised back but counted in :attr:`refused`."""
        try:
            self.send(stream, item)
        except ItemRefused:
            self.refused += 1
        except CodecError as exc:  # the file's encoder refused it: said as its sink would
            raise self._refusal(stream, item, exc) from None
        else:
            self.sent -= 1  # a rank > 0's, counted there

    def _refusal(self, stream: str, item: PipelineItem, exc: CodecError) -> PipelineError:
        """The failure of the sink ``stream`` on ``item``, which rank 0's encoder refused:
        naming the item and the stage that made its payload, as on one rank."""
        from rxstream.operators._sink import producer_of

        stages = self.pipeline.stages if self.pipeline is not None else {}
        maker = producer_of(item.metadata.timeline, {n: s.declared for n, s in stages.items()})
        cause = exc if maker is None else CodecError(f"{exc} from stage {maker!r}")
        md = item.metadata
        return PipelineError(stream, cause, pts=md.pts, input_seq=md.input_seq)

    def on_timing(self, record: TimingRecord) -> None:
        if self.on_record is not None:
            self.on_record(record)
        if self._inner is not None:
            self._inner.on_timing(record)

    def close(self) -> None:
        """A run stopped; the launch closes what it opened when it ends (:meth:`finish`)."""

    def finish(self) -> None:
        """Close the session transport and the file (finished, playable)."""
        inner, self._inner = self._inner, None
        self._ended = True
        if inner is not None:
            inner.close()


class _Gate:
    """Admits at most ``frames`` items (all of them for ``None``); ``on_full`` after the last.

    An item past them is refused with :class:`ItemRefused` (reason ``frames``): its sink
    counts it as dropped, so the books balance and the sinks' ``out`` is what was sent. That
    holds for rank 0's sinks and, on its own gate, for each rank > 0's; an item a rank > 0
    forwarded that passed its own gate but not rank 0's (sinks on several ranks, together past
    ``frames``) was counted ``out`` by its sink already: :meth:`Egress.forward` counts it in
    ``Egress.refused``, which the launch's ``LaunchResult.refused`` reports.
    """

    def __init__(self, frames: int | None, on_full: Callable[[], object]) -> None:
        self._left = self._frames = frames
        self._lock = threading.Lock()
        self.on_full = on_full

    def admit(self) -> None:
        """Let one more item pass, or raise :class:`ItemRefused` (reason ``frames``)."""
        if self._left is None:
            return
        with self._lock:
            if self._left <= 0:
                raise ItemRefused("frames", f"past the {self._frames} frames asked for")
            self._left -= 1
            full = self._left == 0
        if full:
            self.on_full()


class Sender:
    """A rank's end of its control pipe, shared by its threads (a send is not thread-safe)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._conn.send(message)


class Forward(Transport):
    """A rank > 0's transport: passes at most ``frames`` items on — to the controller's
    session when ``sender`` is given and ``items``, else nowhere — and calls ``gate.on_full``
    after the last; its sinks' timing records go to the controller whenever ``sender`` is.
    """

    def __init__(self, sender: Sender | None, frames: int | None, *, items: bool = True) -> None:
        self._sender = sender
        self._items = sender if items else None
        self.gate = _Gate(frames, lambda: None)

    @property
    def connected(self) -> bool:
        return True

    def send(self, stream: str, item: PipelineItem) -> None:
        self.gate.admit()
        if self._items is not None:
            self._items.send(("egress", stream, item))

    def on_timing(self, record: TimingRecord) -> None:
        if self._sender is not None:
            self._sender.send(("timing", record))


def apply_serving(pipeline: Pipeline, serving: Mapping[str, Any] | None) -> None:
    """Check the serving config against the app's topology; lower its inputs' limits to it."""
    from rxstream.operators._input import InputFeed
    from rxstream.topology import client_stream_limits

    limits = client_stream_limits(pipeline.topology(), serving)  # validates, listing problems
    for name, stage in pipeline._inputs().items():  # its input stages and the inputs read
        if name in limits and isinstance(stage.source, InputFeed):
            stage.source.limits = limits[name]


def pipeline_has_sink(pipeline: Pipeline, rank: int) -> bool:
    plan = pipeline.plan
    return any(node.stage.is_sink and plan.ranks[node] == rank for node in plan.nodes)


def start_log(log: str | Path) -> None:
    """Start the timing log afresh (the controller, before any rank writes to it)."""
    path = Path(log)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")


def configure_log(log: str | Path | None, quiet: bool = False) -> None:
    """The timing log ``log``; ``quiet`` (a launcher's): its warnings and errors said on
    stderr too, as without a log."""
    if log is not None:
        from rxstream.timing import configure_logging
        from rxstream.timing._emit import configure_launch_logging

        if quiet:
            configure_launch_logging(log)
        else:
            configure_logging(log)


def configure_quiet(quiet: bool) -> None:
    """Only warnings and errors, as text on stderr (until a timing log is configured)."""
    if quiet:
        from rxstream.timing._emit import configure_quiet_logging

        configure_quiet_logging()
