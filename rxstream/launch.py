"""SPMD launch: one app, N rank processes, each running its own stages.

An app is a file or module with ``build(ctx) -> Pipeline``, ``async def main(ctx)``, or both
(see :func:`load_app`).

``launch("app.py", ranks=2)`` runs a ``build`` app: rank 0 — the controller — in this process,
ranks 1..N-1 spawned (``spawn``, never ``fork``: CUDA cannot be re-initialised in a forked
child). Every rank imports the app and calls its ``build(ctx)``, so every rank builds the same
graph with the same stage names; each runs only the stages placed on it. The controller
creates a shared-memory ring per boundary and hands the rings to the ranks; it replicates
every doc write and generation change to them, watches them (a rank that dies ends the run
with an error naming it, within a second on every rank), and waits until every rank
completed — or stops them all at ``frames`` egressed, the ``timeout``, the session's end, or
an error — then joins them and unlinks every ring.

A ``main`` app's coroutine runs in an event loop in this process, rank 0. On one rank its
pipeline's ``run()``/``start()`` runs every rank's stages here, through in-process rings. On
several, each start of one of its pipelines spawns ranks 1..N-1 for that run (through the
context's launcher hook, :class:`_MainRanks`); they call the app's ``build(ctx)`` — so such an
app needs one, building the same graph — and the run ends on every rank when it stops.

The session transport lives on rank 0, the controller: the page of a ``WebTransport`` is
served there, and the ``out`` file is written there. A sink on a rank > 0 forwards what it
egresses to the controller over the rank's control pipe when there is a session transport
or a file to reach.
"""

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import structlog

from rxstream._exceptions import (
    AppEntryError,
    ArgumentError,
    PipelineError,
    PipelineStateError,
    SettingError,
)
from rxstream._settings import apply_settings
from rxstream.context import Context
from rxstream.doc import Doc, GenerationState, Snapshot
from rxstream.doc._snapshot import thaw
from rxstream.ipc import RingHandle, ShmRing
from rxstream.item import PipelineItem
from rxstream.pipeline import Pipeline
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._run import Run
from rxstream.runtime._stats import StageStatistics, egressed, stats_from_wire, stats_to_wire
from rxstream.timing import TimingRecord
from rxstream.transport import MemoryTransport, Session, Transport

__all__ = ["App", "LaunchResult", "SettingError", "launch", "load_app", "run_self_test"]

_log = structlog.get_logger("rxstream")

JOIN_S = 2.0
"""Seconds a stopping controller waits for a rank process (or a ``main`` coroutine)."""
READY_S = 120.0
"""How long the controller waits for a spawned rank to build its graph and start."""
WATCH_S = 0.05
"""How often the controller checks on its ranks (a dead rank is noticed within ~this)."""
STATUS_S = 0.5
"""How often ``on_status`` gets the statistics of every rank."""
HEARTBEAT_ENV = "RXSTREAM_HEARTBEAT_S"
"""Sets :data:`HEARTBEAT_S` for a launch (seconds, > 0)."""
HEARTBEAT_S = 5.0
"""A running rank that sends the controller nothing for this long (it reports every
``WATCH_S``: its egress count is the heartbeat) has stopped answering — stopped (SIGSTOP),
hung, swapped out: the run fails naming it, and it is killed (SIGKILL reaches a stopped
process). Start-up is bounded by ``READY_S`` instead."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""The signals a spawned rank takes as "stop now": it halts its run and reports the signal
(SIGINT, the terminal's Ctrl-C that reaches the whole process group, it ignores: the
controller stops it)."""


_live_ranks: set[Any] = set()
"""The rank processes spawned and not yet joined, for :func:`kill_ranks`."""


def kill_ranks() -> None:
    """SIGKILL every spawned rank process still running (a forced exit's last act; safe in a
    signal handler: it only sends signals)."""
    for proc in tuple(_live_ranks):
        with contextlib.suppress(OSError, TypeError):
            os.kill(proc.pid, signal.SIGKILL)


def heartbeat_s() -> float:
    """:data:`HEARTBEAT_S`, or the seconds ``RXSTREAM_HEARTBEAT_S`` gives."""
    text = os.environ.get(HEARTBEAT_ENV)
    if text is None:
        return HEARTBEAT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ArgumentError(f"{HEARTBEAT_ENV} must be a number of seconds > 0, got {text!r}")
    return value


Build = Callable[[Context], Pipeline]
Main = Callable[[Context], Coroutine[Any, Any, Any]]
Statistics = Mapping[int, Mapping[str, StageStatistics]]


@dataclass(frozen=True)
class LaunchResult:
    """How a launched pipeline ended: statistics per rank, and egressed frames."""

    ranks: int
    """How many rank processes ran (the controller included)."""
    statistics: Statistics = field(default_factory=dict)
    """Each rank's stage statistics when it stopped, by rank."""
    egressed: int = 0
    """Items all sinks egressed, over every rank."""


# --- the app ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class App:
    """An app as :func:`load_app` found it: its ``build``, its ``main``, or both.

    Calling it is calling ``build`` (so ``load_app(entry)(ctx)`` builds the pipeline).
    """

    entry: str
    """What was loaded: ``path/app.py[:func]`` or ``module[:func]``."""
    build: Build | None
    """``build(ctx) -> Pipeline``, which every rank calls."""
    main: Main | None
    """``async def main(ctx)``: the app's own session, run on rank 0 (the other ranks of its
    runs call ``build``)."""

    def check_ranks(self, ranks: int) -> None:
        """Refuse a main app without a build on several ranks: ranks 1..N-1 call ``build``."""
        if self.main is not None and self.build is None and ranks > 1:
            raise ArgumentError(
                f"an async main(ctx) app runs on {ranks} ranks only with a build(ctx) -> "
                f"Pipeline too (ranks 1..{ranks - 1} call it to build the graph main runs); "
                f"{self.entry!r} has none"
            )

    def __call__(self, ctx: Context) -> Pipeline:
        if self.build is None:
            raise AppEntryError(
                f"app {self.entry!r} has no build(ctx) -> Pipeline, only an async main(ctx)"
            )
        return self.build(ctx)


def load_app(entry: str) -> App:
    """The app ``entry``: ``path/app.py[:func]`` or ``module[:func]``.

    Without ``func`` it finds ``build(ctx)`` and ``async def main(ctx)`` (a coroutine function
    of one argument; another ``main`` is ignored); with ``func``, that function alone — a main
    when it is a coroutine function, else a build.
    """
    target, _, attr = entry.partition(":")
    module = _import_app(entry, target)
    if attr:
        chosen = getattr(module, attr, None)
        if not callable(chosen):
            raise AppEntryError(
                f"app {entry!r} has no callable {attr!r} "
                f"(def {attr}(ctx) -> Pipeline or async def {attr}(ctx))"
            )
        if inspect.iscoroutinefunction(chosen):
            return App(entry, None, chosen)
        return App(entry, chosen, None)
    build = getattr(module, "build", None)
    main = getattr(module, "main", None)
    app = App(entry, build if callable(build) else None, main if _is_main(main) else None)
    if app.build is None and app.main is None:
        raise AppEntryError(
            f"app {entry!r} has neither a build(ctx) -> Pipeline nor an async def main(ctx)"
        )
    return app


def _import_app(entry: str, target: str) -> Any:
    if not (target.endswith(".py") or os.sep in target):
        return importlib.import_module(target)
    path = Path(target).resolve()
    if not path.exists():
        raise FileNotFoundError(f"app file {entry!r} does not exist")
    name = f"rxstream_app_{path.stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import app file {entry!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # a failed import leaves no half-made module behind
            raise
    return module


def _is_main(fn: object) -> bool:
    """Whether ``fn`` is an app's ``async def main(ctx)``."""
    if not inspect.iscoroutinefunction(fn):
        return False
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    return True


class _AppContext(Context):
    """The launcher's context: writes the ``--set`` settings as the app makes the control doc."""

    def __init__(self, *, settings: Sequence[str] = (), **options: Any) -> None:
        super().__init__(**options)
        self._settings = tuple(settings)

    def doc(
        self,
        name: str = "control",
        *,
        defaults: Mapping[str, Any] | None = None,
        schema: object = None,
    ) -> Doc:
        fresh = name not in self.docs
        made = super().doc(name, defaults=defaults, schema=schema)
        if fresh and name == "control" and self._settings:
            apply_settings(made, self._settings)
        return made

    def check_settings(self) -> None:
        """Fail when there are settings and the app made no control doc to take them."""
        if self._settings and "control" not in self.docs:
            shown = " ".join(f"--set {text}" for text in self._settings)
            raise SettingError(
                f"{shown}: the app made no control doc (ctx.doc('control')) to write to"
            )


# --- what egresses -----------------------------------------------------------------------------


def _pipeline_of(session: Session) -> Pipeline | None:
    """The pipeline whose run opened ``session`` (its ``feed`` is that pipeline's method)."""
    owner = getattr(session.feed, "__self__", None)
    return owner if isinstance(owner, Pipeline) else None


def _pace_fps(pipeline: Pipeline | None) -> float:
    """The frame rate of the pipeline's first ``pace`` stage (24 without one)."""
    if pipeline is not None:
        for stage in pipeline.stages.values():
            if stage.kind == "pace":
                return float(stage.options["fps"])
    return 24.0


class _Egress(Transport):
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
        self.pipeline: Pipeline | None = None
        """The pipeline of the first session."""
        self.file: Any = None
        """The ``FileTransport`` writing ``out``, once open."""

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

    def halt_at_frames(self, run: Run) -> None:
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
        if inner is not None and self._gate.admit():
            inner.send(stream, item)

    def on_timing(self, record: TimingRecord) -> None:
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
    """Admits at most ``frames`` items (all of them for ``None``); ``on_full`` after the last."""

    def __init__(self, frames: int | None, on_full: Callable[[], object]) -> None:
        self._left = frames
        self._lock = threading.Lock()
        self.on_full = on_full

    def admit(self) -> bool:
        """Whether one more item may pass."""
        if self._left is None:
            return True
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            full = self._left == 0
        if full:
            self.on_full()
        return True


class _Sender:
    """A rank's end of its control pipe, shared by its threads (a send is not thread-safe)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._conn.send(message)


class _Forward(Transport):
    """A rank > 0's transport: passes at most ``frames`` items on — to the controller's
    session when ``sender`` is given, else nowhere — and calls ``gate.on_full`` after the last.
    """

    def __init__(self, sender: _Sender | None, frames: int | None) -> None:
        self._sender = sender
        self.gate = _Gate(frames, lambda: None)

    @property
    def connected(self) -> bool:
        return True

    def send(self, stream: str, item: PipelineItem) -> None:
        if self.gate.admit() and self._sender is not None:
            self._sender.send(("egress", stream, item))

    def on_timing(self, record: TimingRecord) -> None:
        if self._sender is not None:
            self._sender.send(("timing", record))


def _apply_serving(pipeline: Pipeline, serving: Mapping[str, Any] | None) -> None:
    """Check the serving config against the app's topology; lower its inputs' limits to it."""
    from rxstream.operators._input import InputFeed
    from rxstream.topology import client_stream_limits

    limits = client_stream_limits(pipeline.topology(), serving)  # validates, listing problems
    for name, stage in pipeline.stages.items():
        if stage.kind == "input" and name in limits and isinstance(stage.source, InputFeed):
            stage.source.limits = limits[name]


def _has_sink(pipeline: Pipeline, rank: int) -> bool:
    plan = pipeline.plan
    return any(node.stage.is_sink and plan.ranks[node] == rank for node in plan.nodes)


def _start_log(log: str | Path) -> None:
    """Start the timing log afresh (the controller, before any rank writes to it)."""
    path = Path(log)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")


def _configure_log(log: str | Path | None) -> None:
    if log is not None:
        from rxstream.timing import configure_logging

        configure_logging(log)


def _configure_quiet(quiet: bool) -> None:
    """Only warnings and errors, as text on stderr (until a timing log is configured)."""
    if quiet:
        from rxstream.timing import configure_logging

        configure_logging(None, json=False, level=logging.WARNING)


# --- statistics ---------------------------------------------------------------------------------


# --- a rank process ----------------------------------------------------------------------------


def _rank_run(
    pipeline: Pipeline,
    rank: int,
    rings: Mapping[str, ShmRing],
    releases: Mapping[str, tuple[Connection, Connection]],
    bridge: AsyncBridge | None = None,
) -> Run:
    """The run of ``pipeline``'s stages on ``rank``, over the launcher's rings."""
    ctx = pipeline.context
    return Run(
        pipeline.plan,
        mode="threads",
        bridge=bridge if bridge is not None else AsyncBridge(),
        generations=ctx.generations,
        timing=ctx.timing,
        rank=rank,
        rings=rings,
        releases=releases,
        cuda_api=ctx.cuda_api,
        replica=rank != 0,  # rank 0 steers; the others replicate its doc and generations
        ring_spec=ctx.ring_spec,
    )


@dataclass(frozen=True)
class _Spawn:
    """How the controller spawns the other ranks: the same for every run of a launch."""

    entry: str
    world: int
    forward: bool
    frames: int | None
    quiet: bool
    serving: Mapping[str, Any] | None
    log: str | None


@dataclass(frozen=True)
class _RankSetup:
    """What the controller hands a rank process besides its pipes (it pickles)."""

    spawn: _Spawn
    rank: int
    handles: Mapping[str, RingHandle]
    docs: Mapping[str, tuple[dict[str, Any], int]]
    layout: tuple[str, ...]
    """Every stage as ``name@rank``: the graph the controller runs, which this rank must build."""


def _layout(pipeline: Pipeline) -> tuple[str, ...]:
    plan = pipeline.plan
    return tuple(f"{plan.names[node]}@{plan.ranks[node]}" for node in plan.nodes)


class _Signalled(BaseException):
    """A stop signal reached a rank before its run started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _RankSignals:
    """A spawned rank's :data:`STOP_SIGNALS`: the first halts its run (once there is one;
    before, it raises :class:`_Signalled`) and is reported; a second one kills. A signal the
    rank inherited as ignored (the launch runs under ``nohup``) stays ignored."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.run: Run | None = None
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_DFL)
        self.signum = signum
        run = self.run
        if run is None:
            raise _Signalled(signum)
        run.halt()
        run.done.set()


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15, …"""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _rank_main(
    setup: _RankSetup,
    releases: Mapping[str, tuple[Connection, Connection]],
    conn: Connection,
) -> None:
    """The body of rank ``setup.rank`` > 0 (in a spawned process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the controller, which stops us
    signals = _RankSignals()
    rank, spawn = setup.rank, setup.spawn
    sender = _Sender(conn)
    rings: dict[str, ShmRing] = {}
    try:
        # first of all, so that the controller can unlink the rings' names at once
        rings = {name: ShmRing.attach(handle) for name, handle in setup.handles.items()}
        sender.send(("attached", rank))
        _configure_quiet(spawn.quiet)
        transport = _Forward(sender if spawn.forward else None, spawn.frames)
        ctx = Context(rank=rank, world=spawn.world, replicas=setup.docs, transport=transport)
        pipeline = load_app(spawn.entry)(ctx)
        if _layout(pipeline) != setup.layout:
            raise PipelineStateError(
                f"rank {rank}'s build(ctx) made the stages {' | '.join(_layout(pipeline))}, "
                f"but rank 0 runs {' | '.join(setup.layout)}: every rank must build the same graph"
            )
        if spawn.serving is not None:
            _apply_serving(pipeline, spawn.serving)
        if _has_sink(pipeline, rank):
            _configure_log(spawn.log)
        run = _rank_run(pipeline, rank, rings, releases)
        signals.run = run  # a stop signal from now on halts the run, reported below
        transport.gate.on_full = run.halt  # this rank's sinks egressed `frames`: stop early
        listener = threading.Thread(
            target=_listen, args=(conn, ctx, run), name="rxstream:control", daemon=True
        )
        listener.start()
        run.start()
        sender.send(("ready", rank))
        reported = time.monotonic()
        while not run.done.wait(WATCH_S):
            stats = run.statistics()
            sender.send(("egressed", rank, egressed(stats)))
            if time.monotonic() - reported >= STATUS_S:
                reported = time.monotonic()
                sender.send(("stats", rank, stats_to_wire(stats)))
        run.stop(0.45)
        stats = run.statistics()
        if signals.signum is not None:
            sender.send(("stopped", rank, signals.signum, egressed(stats), stats_to_wire(stats)))
        elif run.error is not None:
            sender.send(("error", rank, describe(run.error), stats_to_wire(stats)))
        else:
            sender.send(("done", rank, egressed(stats), stats_to_wire(stats)))
    except _Signalled as exc:
        with contextlib.suppress(OSError):
            sender.send(("stopped", rank, exc.signum, 0, {}))
    except BaseException as exc:
        with contextlib.suppress(OSError):
            sender.send(("error", rank, describe(exc), {}))
    finally:
        for ring in rings.values():
            ring.close()
        conn.close()


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    """Send to a rank, ignoring one that is gone (the watcher reports it)."""
    with contextlib.suppress(OSError):
        conn.send(message)


def describe(exc: BaseException) -> str:
    """An error as one line for another process: a PipelineError as it reads, else its type
    and message (the torchrun control plane uses it too)."""
    if isinstance(exc, PipelineError):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _listen(conn: Connection, ctx: Context, run: Run) -> None:
    """Apply what the controller sends (doc writes, generations, stop) until it goes away."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the controller is gone: stop
            run.fail(PipelineError("controller", RuntimeError("rank 0 went away")))
            return
        if apply_replica(ctx, message):
            continue
        if message[0] == "stop":
            run.halt()
            run.done.set()
            return


# --- the controller ------------------------------------------------------------------------------


def launch(
    entry: str,
    ranks: int,
    *,
    frames: int | None = None,
    config: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    settings: Sequence[str] = (),
    serving: Mapping[str, Any] | None = None,
    transport: Transport | None = None,
    out: str | Path | None = None,
    out_stream: str | None = None,
    log: str | Path | None = None,
    on_open: Callable[[], None] | None = None,
    on_status: Callable[[Statistics], None] | None = None,
    quiet: bool = False,
    stop: threading.Event | None = None,
) -> LaunchResult:
    """Run the app ``entry`` on ``ranks`` processes until it ends; its statistics.

    ``frames`` stops every rank once the sinks egressed that many items (and passes no more
    on to the session); ``timeout`` (seconds) stops a run that has not ended by then; the run
    also ends when ``transport`` — the session transport, served by rank 0 — disconnects.
    ``config`` is the initial desired state of the control doc, and ``settings``
    (``KEY=VALUE`` strings, typed against the doc) are written over it; ``serving`` (a
    serving config) is checked against the app's topology and lowers its client streams'
    limits for this run. ``out`` also writes the egress (stream ``out_stream``, or the only
    one) to an MP4 file; ``log`` is the timing log every rank with a sink writes (started
    afresh). ``on_open`` is called once the session transport opened, ``on_status`` every
    half second with every rank's statistics. ``quiet`` leaves only warnings and errors in
    every rank's console log (the timing records still go to ``log``). ``stop``, once set
    (from a signal handler, another thread), ends the run as the ``timeout`` does: the session
    ends, every rank stops and reports, and the statistics come back (set before every rank
    is ready, nothing runs; not under torchrun, which stops its workers with SIGTERM).
    A failure on any rank raises
    :class:`PipelineError` naming it; a refused setting :class:`SettingError`; a refused
    serving config :class:`~rxstream.topology.DeploymentError`. A rank that sends nothing for
    :data:`HEARTBEAT_S` seconds is killed and named in that error.
    """
    from rxstream.distributed import launch_torchrun, torchrun_env

    if torchrun_env() is not None:  # under torchrun: this process runs its own rank only
        return launch_torchrun(
            entry,
            ranks,
            frames=frames,
            config=config,
            timeout=timeout,
            settings=settings,
            serving=serving,
            transport=transport,
            out=out,
            out_stream=out_stream,
            log=log,
            on_open=on_open,
            on_status=on_status,
            quiet=quiet,
        )
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ArgumentError(f"ranks must be an int >= 1, got {ranks!r}")
    app = load_app(entry)
    app.check_ranks(ranks)
    egress = _Egress(
        transport, out=out, out_stream=out_stream, frames=frames, on_open=on_open, stop=stop
    )
    spawn = _Spawn(
        app.entry,
        ranks,
        egress.forwards,
        frames,
        quiet,
        None if serving is None else dict(serving),
        None if log is None else str(log),
    )
    if log is not None:
        _start_log(log)
    _configure_quiet(quiet)
    try:
        ctx = _AppContext(settings=settings, config=config, transport=egress, rank=0, world=ranks)
        if app.main is not None:
            return _launch_main(app.main, ctx, spawn, egress, serving, timeout, on_status)
        return _launch_build(app, ctx, spawn, egress, serving, timeout, on_status)
    finally:
        egress.finish()


def _launch_main(
    main: Main,
    ctx: _AppContext,
    spawn: _Spawn,
    egress: _Egress,
    serving: Mapping[str, Any] | None,
    timeout: float | None,
    on_status: Callable[[Statistics], None] | None,
) -> LaunchResult:
    """Run an ``async def main(ctx)`` app in this process until it returns or the session ends.

    On several ranks, the context's launcher hook spawns the other ranks for each run.
    """

    def on_session(pipeline: Pipeline | None) -> None:
        ctx.check_settings()
        if pipeline is not None and serving is not None:
            _apply_serving(pipeline, serving)

    egress.on_session = on_session
    _configure_log(spawn.log)
    launcher = ctx._launcher = _MainRanks(spawn, egress) if spawn.world > 1 else None
    deadline = None if timeout is None else time.monotonic() + timeout
    reported = [time.monotonic()]

    def tick() -> None:
        now = time.monotonic()
        if deadline is not None and now > deadline:
            egress.end()
        pipeline = egress.pipeline
        if on_status is not None and pipeline is not None and now - reported[0] >= STATUS_S:
            reported[0] = now
            others = {} if launcher is None else launcher.live()
            on_status({0: pipeline.statistics(), **others})

    try:
        asyncio.run(_supervise(main(ctx), should_end=lambda: egress.ended, tick=tick))
    finally:
        if egress.pipeline is not None:
            egress.pipeline.stop()
        if launcher is not None:
            launcher.close()
    stats = dict(egress.pipeline.statistics()) if egress.pipeline is not None else {}
    statistics: dict[int, Mapping[str, StageStatistics]] = {0: stats}
    total = egressed(stats)
    ranked = None if launcher is None else launcher.last_of(egress.pipeline)
    if ranked is not None:
        watch = ranked.watch
        statistics.update((rank, s) for rank, s in watch.stats.items() if rank != 0)
        total += sum(watch.egressed.values())
    return LaunchResult(spawn.world, MappingProxyType(statistics), total)


async def _supervise(
    coroutine: Coroutine[Any, Any, Any],
    *,
    should_end: Callable[[], bool],
    tick: Callable[[], None] = lambda: None,
) -> None:
    """Await an app's ``main``; cancel it ``JOIN_S`` after ``should_end()`` turned true."""
    task = asyncio.ensure_future(coroutine)
    ending: float | None = None
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCH_S)
            if done:
                task.result()
                return
            tick()
            now = time.monotonic()
            if ending is None and should_end():
                ending = now
            if ending is not None and now - ending > JOIN_S:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels us; main goes too
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise


def _launch_build(
    app: App,
    ctx: _AppContext,
    spawn: _Spawn,
    egress: _Egress,
    serving: Mapping[str, Any] | None,
    timeout: float | None,
    on_status: Callable[[Statistics], None] | None,
) -> LaunchResult:
    """Run a ``build`` app: this process is rank 0, ranks 1..N-1 are spawned."""
    pipeline = app(ctx)
    ctx.check_settings()
    if serving is not None:
        _apply_serving(pipeline, serving)
    if _has_sink(pipeline, 0):
        _configure_log(spawn.log)
    ranks = _Ranks(spawn, pipeline)
    run: Run | None = None
    try:
        run = _rank_run(pipeline, 0, ranks.rings, ranks.releases)
        if not ranks.wait_ready(stopping=lambda: egress.stopping):
            return LaunchResult(spawn.world)  # stopped before it started: nothing ran
        egress.halt_at_frames(run)
        egress.open(pipeline.session())
        replicas = _replicate(ctx, ranks.conns)
        run.start()
        try:
            return _Watch(run, ranks, egress, on_status).until_end(spawn.frames, timeout)
        finally:
            for subscription in replicas:
                subscription.dispose()
    finally:
        if run is not None:
            run.stop(0.45)
        ranks.close()


class _Ranks:
    """Ranks 1..N-1 of one run, spawned by rank 0, and a ring per boundary between the ranks.

    Made and released together: :meth:`close` stops every rank, joins it (killing one still
    there ``JOIN_S`` later), closes the pipes and unlinks every ring.
    """

    def __init__(self, spawn: _Spawn, pipeline: Pipeline) -> None:
        plan = pipeline.plan
        if plan.world > spawn.world:
            raise PipelineStateError(
                f"the app places stages on {plan.world} ranks, but only {spawn.world} were launched"
            )
        self.rings: dict[str, ShmRing] = {}
        self.releases: dict[str, tuple[Connection, Connection]] = {}  # CUDA ref ids coming back
        self.conns: dict[int, Connection] = {}
        self.procs: dict[int, Any] = {}
        context = multiprocessing.get_context("spawn")
        try:
            spec = pipeline.context.ring_spec
            for up, down in plan.boundaries:
                name = plan.edge_name(up, down)
                self.rings[name] = ShmRing.create(slots=spec.slots, slot_bytes=spec.slot_bytes)
                self.releases[name] = context.Pipe(duplex=False)
            touching: dict[int, dict[str, RingHandle]] = {r: {} for r in range(spawn.world)}
            for up, down in plan.boundaries:  # a rank opens only its own boundaries' rings:
                name = plan.edge_name(up, down)  # its close at the end closes them for both
                for r in {plan.ranks[up], plan.ranks[down]}:
                    touching[r][name] = self.rings[name].handle()
            docs = {n: (thaw(d.snapshot()), d.version) for n, d in pipeline.context.docs.items()}
            layout = _layout(pipeline)
            for rank in range(1, spawn.world):
                parent, child = context.Pipe()
                self.conns[rank] = parent
                setup = _RankSetup(spawn, rank, touching[rank], docs, layout)
                proc = context.Process(
                    target=_rank_main,
                    args=(setup, self.releases, child),
                    name=f"rxstream-rank-{rank}",
                    daemon=True,
                )
                try:
                    proc.start()
                finally:
                    child.close()
                self.procs[rank] = proc
                _live_ranks.add(proc)
        except BaseException:
            self.close()
            raise

    def wait_ready(
        self, timeout: float = READY_S, stopping: Callable[[], bool] = lambda: False
    ) -> bool:
        """Wait until every rank built its graph and started its run, so that rank 0 starts
        its sources only once the whole pipeline can take their items (a rank importing
        torch takes seconds); ``False`` when ``stopping()`` turned true first (a signal).
        A rank that fails, dies or is stopped by a signal first raises ``PipelineError``."""
        waiting = dict(self.conns)
        attached: set[int] = set()
        deadline = time.monotonic() + timeout
        while waiting:
            if stopping():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                raise PipelineError(
                    f"rank {min(waiting)}",
                    TimeoutError(f"not ready after {timeout:g} s (ranks {sorted(waiting)})"),
                )
            sentinels = {self.procs[rank].sentinel: rank for rank in waiting}
            ready = multiprocessing.connection.wait(
                [*waiting.values(), *sentinels], timeout=min(left, WATCH_S)
            )
            for rank, conn in list(waiting.items()):
                if conn in ready:
                    try:
                        message = conn.recv()
                    except (EOFError, OSError):
                        message = ("error", rank, "its process ended before it was ready", {})
                    if message[0] == "attached":
                        attached.add(rank)
                        if len(attached) == len(self.conns):
                            self.unlink_rings()
                    elif message[0] == "ready":
                        del waiting[rank]
                    elif message[0] == "error":
                        raise PipelineError(f"rank {rank}", RuntimeError(message[2]))
                    elif message[0] == "stopped" and not stopping():
                        raise _stopped_by(rank, message[2])
                elif self.procs[rank].sentinel in ready and not conn.poll():
                    self.procs[rank].join(0.5)
                    code = self.procs[rank].exitcode
                    raise PipelineError(
                        f"rank {rank}",
                        RuntimeError(f"rank {rank} died (exit code {code}) before it was ready"),
                    )
        return True

    def unlink_rings(self) -> None:
        """Remove the rings' names: every rank has attached (the mappings stay), and a run
        killed even by SIGKILL leaves nothing in ``/dev/shm``. Idempotent."""
        for ring in self.rings.values():
            ring.unlink()

    def close(self) -> None:
        """Stop every rank, join it (kill it after ``JOIN_S``), close pipes, unlink rings."""
        for conn in self.conns.values():
            _send(conn, ("stop",))
        deadline = time.monotonic() + JOIN_S
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
            _live_ranks.discard(proc)
        for conn in self.conns.values():
            conn.close()
        for pair in self.releases.values():
            for end in pair:
                end.close()
        for ring in self.rings.values():
            ring.close()
            ring.unlink()


class _MainRanks:
    """A main app's launcher hook (``ctx._launcher``) on several ranks.

    Each start of a pipeline of the app's context calls it: it spawns ranks 1..N-1 for that run
    (each calls the app's ``build(ctx)``) and hands :class:`Pipeline` a :class:`_RankRun`.
    """

    def __init__(self, spawn: _Spawn, egress: _Egress) -> None:
        self._spawn = spawn
        self._egress = egress
        self._runs: list[tuple[Pipeline, _RankRun]] = []

    def __call__(self, pipeline: Pipeline, bridge: AsyncBridge) -> "_RankRun":
        ranks = _Ranks(self._spawn, pipeline)
        try:
            run = _rank_run(pipeline, 0, ranks.rings, ranks.releases, bridge)
            if not ranks.wait_ready(stopping=lambda: self._egress.stopping):
                raise PipelineStateError("the launch was stopped before every rank was ready")
        except BaseException:
            ranks.close()
            raise
        ranked = _RankRun(pipeline.context, run, ranks, self._egress, self._spawn.frames)
        self._runs.append((pipeline, ranked))
        return ranked

    def last_of(self, pipeline: Pipeline | None) -> "_RankRun | None":
        """The latest run of ``pipeline``."""
        runs = [ranked for made, ranked in self._runs if made is pipeline]
        return runs[-1] if runs else None

    def live(self) -> dict[int, Mapping[str, StageStatistics]]:
        """The latest statistics of ranks 1..N-1 in the latest run."""
        return dict(self._runs[-1][1].watch.live) if self._runs else {}

    def close(self) -> None:
        """Stop every run whose pipeline was never stopped (its main returned, or failed)."""
        for _, ranked in self._runs:
            if not ranked.stopped:
                ranked.run.stop(0.45)
                ranked.stop()


class _RankRun:
    """One run of a main app's pipeline on every rank: rank 0's ``run`` here, the others spawned.

    :meth:`start` replicates the docs and generations to the ranks and watches them on a thread
    (egress they forward reaches the session transport; a rank that fails or dies fails
    ``run`` with a ``PipelineError`` naming it). ``done`` is set once every rank ended or the
    run failed; :meth:`stop` stops and releases the ranks.
    """

    def __init__(
        self, ctx: Context, run: Run, ranks: _Ranks, egress: _Egress, frames: int | None
    ) -> None:
        self.run = run
        self.done = threading.Event()
        self.stopped = False
        self._ctx = ctx
        self._frames = frames
        self._ranks = ranks
        self._closing = threading.Event()
        self.watch = _Watch(run, ranks, egress, None, closing=self._closing)
        self._replicas: list[Any] = []
        self._thread: threading.Thread | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Replicate to the ranks and watch them (call before ``run.start()``)."""
        self._replicas = _replicate(self._ctx, self._ranks.conns)
        self._thread = threading.Thread(target=self._watch, name="rxstream:ranks", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            self.watch.until_end(self._frames, None)  # and the session's end (--timeout too)
        except BaseException as exc:  # a rank's error is the run's already; anything else too
            self.run.fail(exc)
        finally:
            self._finish()

    def _finish(self) -> None:
        self.done.set()
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) once every rank ended or the run failed."""
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def stop(self) -> None:
        """Stop every rank, collect its statistics, join it and unlink the rings; idempotent."""
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
        self._closing.set()
        if self._thread is not None:
            self._thread.join(2 * JOIN_S)
        for subscription in self._replicas:
            subscription.dispose()
        self._ranks.close()
        self._finish()


def _replicate(ctx: Context, conns: Mapping[int, Connection]) -> list[Any]:
    """Send every doc write and generation change to every spawned rank, as it happens."""

    def broadcast(message: tuple[Any, ...]) -> None:
        for conn in conns.values():
            _send(conn, message)

    return replicate(ctx, broadcast)


def replicate(ctx: Context, send: Callable[[tuple[Any, ...]], None]) -> list[Any]:
    """``send`` every doc write and generation change of ``ctx`` as it happens (the messages
    ranks apply with ``doc.replicate`` and ``generations.replicate``), and the generations as
    they are now; the subscriptions to dispose. The spawn launch and the torchrun control
    plane both use it."""
    subscriptions: list[Any] = []

    def doc_writer(name: str, doc: Doc) -> Callable[[Snapshot], None]:
        return lambda snapshot: send(("doc", name, thaw(snapshot), doc.version))

    for name, doc in ctx.docs.items():
        subscriptions.append(doc.snapshots.subscribe(doc_writer(name, doc)))
    gens = ctx.generations

    def on_generations(state: GenerationState) -> None:
        send(("generations", state, gens.steered_at))

    gens.listeners.append(on_generations)
    subscriptions.append(_Unlisten(gens.listeners, on_generations))
    on_generations(gens.state())  # as they are now: a steer made before the ranks started
    return subscriptions


def apply_replica(ctx: Context, message: tuple[Any, ...]) -> bool:
    """Apply a message :func:`replicate` sent (a doc write, the generations) to this rank's
    ``ctx``; whether it was one."""
    kind = message[0]
    if kind == "doc":
        _, name, state, version = message
        ctx.doc(name).replicate(state, version)
    elif kind == "generations":
        _, state, steered_at = message
        ctx.generations.replicate(state, steered_at)
    else:
        return False
    return True


class _Unlisten:
    def __init__(self, listeners: list[Any], listener: Any) -> None:
        self._listeners, self._listener = listeners, listener

    def dispose(self) -> None:
        if self._listener in self._listeners:
            self._listeners.remove(self._listener)


_DRAIN = 64
"""Messages read from one rank per watch round (egress can arrive frame by frame)."""


class _Watch:
    """The controller's loop: reads every rank's messages until every rank has ended."""

    def __init__(
        self,
        run: Run,
        ranks: _Ranks,
        egress: _Egress,
        on_status: Callable[[Statistics], None] | None,
        *,
        closing: threading.Event | None = None,
    ) -> None:
        self.run = run
        self.conns: Mapping[int, Connection] = ranks.conns
        self.procs: Mapping[int, Any] = ranks.procs
        self.egress = egress
        self.on_status = on_status
        self.closing = closing
        """Set by a stopping pipeline (a main app's run): stop every rank as at the end."""
        self.egressed = dict.fromkeys(ranks.conns, 0)
        self.stats: dict[int, dict[str, StageStatistics]] = {}
        self.live: dict[int, dict[str, StageStatistics]] = {}
        self.finished: set[int] = set()
        self.heartbeat = heartbeat_s()
        self.heard: dict[int, float] = {}
        """When each rank was last heard from (any message)."""

    def until_end(self, frames: int | None, timeout: float | None) -> LaunchResult:
        """Wait for every rank to end; fail fast naming a rank that died, failed or stopped
        answering (nothing from it for ``heartbeat`` seconds)."""
        run, conns, procs = self.run, self.conns, self.procs
        deadline = None if timeout is None else time.monotonic() + timeout
        self.heard = dict.fromkeys(conns, time.monotonic())
        reported = time.monotonic()
        stopping_until: float | None = None  # set once the run ends: ranks report, then go
        while True:
            ready = multiprocessing.connection.wait(
                [*conns.values(), *(p.sentinel for p in procs.values())], timeout=WATCH_S
            )
            for rank, conn in conns.items():
                if conn in ready and rank not in self.finished:
                    self._read(rank, conn)
            for rank, proc in procs.items():
                if rank not in self.finished and proc.sentinel in ready and not conns[rank].poll():
                    _died(run, rank, proc)
            self._check_heartbeats()
            run.raise_error()
            if len(self.finished) == len(conns) and (
                run.done.is_set() or stopping_until is not None
            ):
                break
            now = time.monotonic()
            if self.on_status is not None and now - reported >= STATUS_S:
                reported = now
                self.on_status({0: run.statistics(), **self.live})
            if stopping_until is not None:
                if now > stopping_until:
                    break  # a rank that does not report in time is killed by the caller
                continue
            total = sum(self.egressed.values()) + egressed(run.statistics())
            # a finite run ends by itself: every rank completes once the end reaches it
            ended = (
                (frames is not None and total >= frames)
                or (deadline is not None and now > deadline)
                or self.egress.ended
            )
            if ended:
                self.egress.end()
            if ended or (self.closing is not None and self.closing.is_set()):
                run.halt()  # stop every rank, then collect their final statistics
                for rank, conn in conns.items():
                    if rank not in self.finished:
                        _send(conn, ("stop",))
                stopping_until = now + JOIN_S
        self.stats[0] = dict(run.statistics())
        total = sum(self.egressed.values()) + egressed(self.stats[0])
        return LaunchResult(len(conns) + 1, MappingProxyType(self.stats), total)

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for rank, conn in self.conns.items():
            silent = now - self.heard[rank]
            if rank not in self.finished and silent > self.heartbeat and not conn.poll():
                _unanswering(self.run, rank, self.procs[rank], silent, self.heartbeat)

    def _read(self, rank: int, conn: Connection) -> None:
        self.heard[rank] = time.monotonic()
        for _ in range(_DRAIN):
            try:
                message = conn.recv()
            except (EOFError, OSError):  # its end of the pipe closed: the process is gone
                _died(self.run, rank, self.procs[rank])
            kind = message[0]
            if kind == "egress":
                self.egress.send(message[1], message[2])
            elif kind == "timing":
                self.egress.on_timing(message[1])
            elif kind == "egressed":
                self.egressed[rank] = message[2]
            elif kind == "stats":
                self.live[rank] = stats_from_wire(message[2])
            elif kind == "done":
                self.egressed[rank], self.stats[rank] = message[2], stats_from_wire(message[3])
                self.finished.add(rank)
                return
            elif kind == "error":
                self.stats[rank] = stats_from_wire(message[3])
                error = PipelineError(f"rank {rank}", RuntimeError(message[2]))
                self.run.fail(error)
                raise error
            elif kind == "stopped":  # a signal stopped it: the launch's own stop, or a failure
                self.egressed[rank], self.stats[rank] = message[3], stats_from_wire(message[4])
                self.finished.add(rank)
                if not self.egress.stopping:
                    error = _stopped_by(rank, message[2])
                    self.run.fail(error)
                    raise error
                return
            if not conn.poll():
                return


def _stopped_by(rank: int, signum: int) -> PipelineError:
    """The error of a rank that a signal stopped while the launch itself was not stopping."""
    return PipelineError(
        f"rank {rank}",
        RuntimeError(f"rank {rank} was stopped by {signal_name(signum)} (sent to it alone)"),
    )


def _unanswering(run: Run, rank: int, proc: Any, silent: float, allowed: float) -> NoReturn:
    """A rank that sends nothing any more (stopped, hung): kill it, fail the run naming it."""
    with contextlib.suppress(OSError):
        proc.kill()  # SIGKILL: the one signal a stopped process does not wait for
    proc.join(1.0)
    error = PipelineError(
        f"rank {rank}",
        RuntimeError(
            f"rank {rank} stopped answering: nothing from it for {silent:.1f} s "
            f"(the heartbeat allows {allowed:g} s, {HEARTBEAT_ENV}); it was killed"
        ),
    )
    run.fail(error)
    raise error


def _died(run: Run, rank: int, proc: Any) -> NoReturn:
    """A rank process ended without reporting: fail the run, naming it."""
    proc.join(0.5)
    error = PipelineError(
        f"rank {rank}", RuntimeError(f"rank {rank} died (exit code {proc.exitcode})")
    )
    run.fail(error)
    raise error


# --- the CPU harness -----------------------------------------------------------------------------


class _UntilSelfTest(MemoryTransport):
    """The harness's session: attached until the app's self test has finished."""

    def __init__(self, finished: Callable[[], bool]) -> None:
        super().__init__(keep=8)
        self._finished = finished

    @property
    def connected(self) -> bool:
        return super().connected and not self._finished()


def run_self_test(entry: str, *, timeout: float = 60.0) -> bool | None:
    """Run the ``with ctx.self_test():`` block of the app ``entry`` under the CPU harness.

    The app gets ``Context(harness=True)`` with an in-memory transport. A ``build`` app is
    built (its block runs as ``build`` does); a ``main`` app runs until its block finished —
    its transport disconnects then, so a ``run()`` after the block returns at once — and is
    cancelled if it has not returned ``JOIN_S`` later. Returns ``True`` when the block
    passed, ``None`` when the app ran none (``False`` when the app caught its failure).
    Raises :class:`~rxstream.SelfTestError` (the cause attached) when it failed, what the app
    raised outside the block, and ``TimeoutError`` when no block finished in ``timeout`` s.
    """
    app = load_app(entry)
    main = app.main
    if main is None:
        ctx = Context(harness=True, transport=MemoryTransport(keep=8))
        app(ctx)
        return ctx.self_test_passed
    holder: list[Context] = []

    def finished() -> bool:
        return holder[0].self_test_passed is not None

    ctx = Context(harness=True, transport=_UntilSelfTest(finished))
    holder.append(ctx)
    deadline = time.monotonic() + timeout

    def over() -> bool:
        return finished() or time.monotonic() > deadline

    asyncio.run(_supervise(main(ctx), should_end=over))
    if ctx.self_test_passed is None and time.monotonic() > deadline:
        raise TimeoutError(f"the app's self test did not finish within {timeout:g} s")
    return ctx.self_test_passed
