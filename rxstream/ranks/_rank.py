"""A spawned rank process: builds the app's graph, runs its stages, reports to the controller."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TextIO, cast

from rxstream._exceptions import PipelineError, PipelineStateError
from rxstream._kernel._stats import egressed, stats_to_wire
from rxstream._util import StdoutGuard
from rxstream.context import Context
from rxstream.ipc import RingHandle, ShmRing
from rxstream.pipeline import Pipeline
from rxstream.ranks._app import app_files, describe, load_app
from rxstream.ranks._common import JOIN_S, STATUS_S, STOP_SIGNALS, WATCH_S, LaunchOptions
from rxstream.ranks._egress import (
    Forward,
    Sender,
    apply_serving,
    configure_log,
    configure_quiet,
    pipeline_has_sink,
)
from rxstream.ranks._factory import RingBoundaries
from rxstream.ranks._replicate import apply_replica
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._threaded import ThreadedRun

# --- a rank process ----------------------------------------------------------------------------


def rank_run(
    pipeline: Pipeline,
    rank: int,
    rings: Mapping[str, ShmRing],
    releases: Mapping[str, tuple[Connection, Connection]],
    bridge: AsyncBridge | None = None,
    run_id: str = "",
) -> ThreadedRun:
    """The run of ``pipeline``'s stages on ``rank``, over the launcher's rings; ``run_id`` is
    the launch's (every rank's run the same; ``""``: a fresh one)."""
    ctx = pipeline.context
    run = ThreadedRun(
        pipeline.plan,
        bridge=bridge if bridge is not None else AsyncBridge(),
        generations=ctx.generations,
        timing=ctx.timing,
        rank=rank,
        boundaries=RingBoundaries(
            rings=rings, releases=releases, cuda_api=ctx.cuda_api, spec=ctx.ring_spec
        ),
        replica=rank != 0,  # rank 0 steers; the others replicate its doc and generations
        busy_limit_s=ctx.busy_limit_s,
        cuda_api=ctx.cuda_api,
        nvtx=ctx.nvtx,
    )
    if run_id:
        run.run_id = run_id
    return run


@dataclass(frozen=True)
class Spawn:
    """How the controller spawns the other ranks: the same for every run of a launch."""

    entry: str
    world: int
    forward: bool
    options: LaunchOptions
    """The launch's options a rank uses (:meth:`LaunchOptions.for_ranks`: they pickle)."""
    timing: bool = False
    """Whether a rank's sinks send their timing records to the controller even when their
    items go nowhere (the launch exports traces or metrics)."""


@dataclass(frozen=True)
class RankSetup:
    """What the controller hands a rank process besides its pipes (it pickles)."""

    spawn: Spawn
    rank: int
    handles: Mapping[str, RingHandle]
    docs: Mapping[str, tuple[dict[str, Any], int]]
    layout: tuple[str, ...]
    """Every stage as ``name@rank``: the graph the controller runs, which this rank must build."""
    run_id: str = ""
    """The run's id, chosen by the controller: every rank's timing lines carry the same."""


def layout_of(pipeline: Pipeline) -> tuple[str, ...]:
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
        self.run: ThreadedRun | None = None
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


def rank_main(
    setup: RankSetup,
    releases: Mapping[str, tuple[Connection, Connection]],
    conn: Connection,
) -> None:
    """The body of rank ``setup.rank`` > 0 (in a spawned process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the controller, which stops us
    # stdout is the controller's (``rxstream run … | head``): a print once its reader left
    # goes to devnull, as in the controller, instead of failing the stage that printed
    sys.stdout = cast(TextIO, StdoutGuard(sys.stdout))
    signals = _RankSignals()
    rank, spawn = setup.rank, setup.spawn
    sender = Sender(conn)
    rings: dict[str, ShmRing] = {}
    listener: threading.Thread | None = None
    try:
        # first of all, so that the controller can unlink the rings' names at once
        rings = {name: ShmRing.attach(handle) for name, handle in setup.handles.items()}
        sender.send(("attached", rank))
        configure_quiet(spawn.options.quiet)
        transport = Forward(
            sender if spawn.forward or spawn.timing else None,
            spawn.options.frames,
            items=spawn.forward,
        )
        ctx = Context(rank=rank, world=spawn.world, replicas=setup.docs, transport=transport)
        pipeline = load_app(spawn.entry)(ctx)
        if layout_of(pipeline) != setup.layout:
            raise PipelineStateError(
                f"rank {rank}'s build(ctx) made the stages {' | '.join(layout_of(pipeline))}, "
                f"but rank 0 runs {' | '.join(setup.layout)}: every rank must build the same graph"
            )
        if spawn.options.serving is not None:
            apply_serving(pipeline, spawn.options.serving)
        if pipeline_has_sink(pipeline, rank):
            configure_log(spawn.options.log, spawn.options.quiet)
        run = rank_run(pipeline, rank, rings, releases, run_id=setup.run_id)
        signals.run = run  # a stop signal from now on halts the run, reported below
        transport.gate.on_full = run.halt  # this rank's sinks egressed `frames`: stop early
        listener = threading.Thread(
            target=_listen, args=(conn, ctx, run), name="rxstream:control", daemon=True
        )
        listener.start()
        run.start()
        # its stages' resources (ctx.resource) loaded: ready for items; meanwhile it says
        # which it is loading, so that the controller's wait for it is not a limit on a load
        if run.wait_loaded(lambda names: sender.send(("loading", rank, names))):
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
    except BaseException as exc:  # the app's import or build: named with the app's line
        with contextlib.suppress(OSError):
            sender.send(("error", rank, describe(exc, app_files(spawn.entry)), {}))
    finally:
        for ring in rings.values():
            ring.close()
        close_control(conn, listener)


def close_control(conn: Connection, listener: threading.Thread | None) -> None:
    """Close a rank's control pipe once its ``listener`` no longer reads it.

    The controller ends the listener (its ``stop``, or its end closing) once it has this
    rank's last word; a close under the listener's read would take the pipe's handle from
    the middle of a message (``TypeError`` on that thread, its traceback on stderr). A
    listener still reading ``JOIN_S`` later (a controller that hangs) keeps the pipe until
    this process exits, which closes it."""
    if listener is not None:
        listener.join(JOIN_S)
        if listener.is_alive():
            return
    conn.close()


def send_to(conn: Connection, message: tuple[Any, ...]) -> None:
    """Send to a rank, ignoring one that is gone (the watcher reports it)."""
    with contextlib.suppress(OSError):
        conn.send(message)


def _listen(conn: Connection, ctx: Context, run: ThreadedRun) -> None:
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
