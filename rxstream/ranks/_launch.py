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
import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rxstream._exceptions import ArgumentError, PipelineError, PipelineStateError
from rxstream._kernel._stats import StageStatistics
from rxstream.context import Context
from rxstream.doc._snapshot import thaw
from rxstream.ipc import RingHandle, ShmRing
from rxstream.pipeline import Pipeline
from rxstream.ranks._app import App, AppContext, Main, load_app
from rxstream.ranks._common import (
    JOIN_S,
    READY_S,
    STATUS_S,
    WATCH_S,
    LaunchOptions,
    LaunchResult,
    OutStreamRefused,
    Statistics,
    live_ranks,
)
from rxstream.ranks._egress import (
    Egress,
    apply_serving,
    configure_log,
    configure_quiet,
    start_log,
)
from rxstream.ranks._rank import RankSetup, Spawn, layout_of, rank_main, rank_run, send_to
from rxstream.ranks._replicate import replicate
from rxstream.ranks._telemetry import Telemetry, check_metrics_port, serves_metrics
from rxstream.ranks._watch import Watch, exit_text, stopped_by
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._run import DoneEvent, new_run_id
from rxstream.runtime._threaded import ThreadedRun
from rxstream.timing._otel import env_traces
from rxstream.transport import Transport

__all__ = ["launch"]

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
    otel: bool | None = None,
    metrics_port: int | None = None,
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
    ``otel`` exports each timing record of the run as an OpenTelemetry trace (the ``otel``
    extra; ``None``: when the standard ``OTEL_*`` environment asks for traces, and the extra
    is installed, else one warning naming the variable), and
    ``metrics_port`` serves the run's Prometheus metrics at
    ``http://127.0.0.1:<metrics_port>/metrics`` while it runs (a ``WebTransport(metrics=True)``
    serves them at its ``/metrics``, behind its token); both on rank 0, for every rank
    (docs/timing.md, "In your tools"; not under torchrun).
    A failure on any rank raises
    :class:`PipelineError` naming it; a refused setting :class:`SettingError`; a refused
    serving config :class:`~rxstream.topology.DeploymentError`. A rank that sends nothing for
    :data:`HEARTBEAT_S` seconds is killed and named in that error.
    """
    from rxstream.ranks._torchrun import run_torchrun, torchrun_env

    under_torchrun = torchrun_env() is not None
    options = LaunchOptions(
        frames=frames,
        config=config,
        timeout=timeout,
        settings=tuple(settings),
        serving=serving,
        transport=transport,
        out=out,
        out_stream=out_stream,
        log=log,
        on_open=on_open,
        on_status=on_status,
        quiet=quiet,
        stop=stop,
        otel=env_traces(torchrun=under_torchrun) if otel is None else otel,
        metrics_port=metrics_port,
    )
    if under_torchrun:  # under torchrun: this process runs its own rank only
        if otel or metrics_port is not None or serves_metrics(transport):
            asked = (
                "otel=True"
                if otel
                else f"metrics_port={metrics_port}"
                if metrics_port is not None
                else "WebTransport(metrics=True)"
            )
            raise ArgumentError(
                f"{asked}: traces and metrics are exports of a spawned launch, not made under "
                "torchrun yet"
            )
        return run_torchrun(entry, ranks, options)
    return launch_spawned(entry, ranks, options)


def launch_spawned(entry: str, ranks: int, options: LaunchOptions) -> LaunchResult:
    """:func:`launch` with ``options``, not under torchrun: ranks 1… are spawned here."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ArgumentError(f"ranks must be an int >= 1, got {ranks!r}")
    check_metrics_port(options.metrics_port)
    app = load_app(entry)
    app.check_ranks(ranks)
    telemetry: Telemetry | None = None
    if options.otel or options.metrics_port is not None or serves_metrics(options.transport):
        telemetry = Telemetry(
            otel=options.otel,
            metrics_port=options.metrics_port,
            transport=options.transport,
        )
        options = replace(options, on_status=telemetry.on_status(options.on_status))
    try:
        result = _launch_exported(app, ranks, options, telemetry)
        if telemetry is not None and telemetry.metrics is not None:
            telemetry.metrics.stats(result.statistics)  # the books as the run ended
        return result
    finally:
        if telemetry is not None:
            telemetry.close()


def _launch_exported(
    app: App, ranks: int, options: LaunchOptions, telemetry: Telemetry | None
) -> LaunchResult:
    egress = Egress(
        options.transport,
        out=options.out,
        out_stream=options.out_stream,
        frames=options.frames,
        on_open=options.on_open,
        stop=options.stop,
    )
    if telemetry is not None:
        egress.on_record = telemetry.on_record
    spawn = Spawn(
        app.entry, ranks, egress.forwards, options.for_ranks(), timing=telemetry is not None
    )
    if options.log is not None:
        start_log(options.log)
    configure_quiet(options.quiet)
    try:
        ctx = AppContext(
            settings=options.settings,
            config=options.config,
            transport=egress,
            rank=0,
            world=ranks,
        )
        if app.main is not None:
            return _launch_main(app.main, ctx, spawn, egress, options)
        return _launch_build(app, ctx, spawn, egress, options)
    finally:
        egress.finish()


def _launch_main(
    main: Main,
    ctx: AppContext,
    spawn: Spawn,
    egress: Egress,
    options: LaunchOptions,
) -> LaunchResult:
    """Run an ``async def main(ctx)`` app in this process until it returns or the session ends.

    On several ranks, the context's launcher hook spawns the other ranks for each run.
    """
    serving, timeout, on_status = options.serving, options.timeout, options.on_status

    def on_session(pipeline: Pipeline | None) -> None:
        ctx.check_settings()
        if pipeline is not None:
            _check_out_stream(pipeline, options)
        if pipeline is not None and serving is not None:
            apply_serving(pipeline, serving)

    egress.on_session = on_session
    configure_log(spawn.options.log, spawn.options.quiet)
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
        asyncio.run(
            supervise(
                main(ctx),
                should_end=lambda: egress.ended,
                tick=tick,
                failed=ctx._tasks.take_failure,
            )
        )
    finally:
        if egress.pipeline is not None:
            egress.pipeline.stop()
        if launcher is not None:
            launcher.close()
    stats = dict(egress.pipeline.statistics()) if egress.pipeline is not None else {}
    statistics: dict[int, Mapping[str, StageStatistics]] = {0: stats}
    total = egress.sent  # every run's, of every pipeline of main's
    ranked = None if launcher is None else launcher.last_of(egress.pipeline)
    if ranked is not None:
        watch = ranked.watch
        statistics.update((rank, s) for rank, s in watch.stats.items() if rank != 0)
    if launcher is not None:
        total += launcher.egressed()
    refused = egress.refused
    run_id = (egress.pipeline.run_id if egress.pipeline is not None else None) or ""
    return LaunchResult(spawn.world, MappingProxyType(statistics), total, refused, run_id)


def _check_out_stream(pipeline: Pipeline, options: LaunchOptions) -> None:
    """Refuse an ``out_stream`` that names none of the pipeline's streams (before the file
    is opened): :class:`OutStreamRefused`."""
    if options.out is None or options.out_stream is None:
        return
    streams = sorted(pipeline.session().streams)
    if streams and options.out_stream not in streams:
        raise OutStreamRefused(options.out_stream, streams)


async def supervise(
    coroutine: Coroutine[Any, Any, Any],
    *,
    should_end: Callable[[], bool],
    tick: Callable[[], None] = lambda: None,
    failed: Callable[[], BaseException | None] = lambda: None,
) -> None:
    """Await an app's ``main``; cancel it ``JOIN_S`` after ``should_end()`` turned true.

    ``failed()`` is a spawned task's failure that no ``pipeline.run()`` raised (the task
    failed while main awaited something else, or after its run): main is cancelled and it is
    raised, as it is when main returns with one left."""
    task = asyncio.ensure_future(coroutine)
    ending: float | None = None
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCH_S)
            if done:
                task.result()
                error = failed()
                if error is not None:
                    raise error
                return
            error = failed()
            if error is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise error
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
    ctx: AppContext,
    spawn: Spawn,
    egress: Egress,
    options: LaunchOptions,
) -> LaunchResult:
    """Run a ``build`` app: this process is rank 0, ranks 1..N-1 are spawned.

    Rank 0 logs to the timing log from before its build, as a ``main`` app's does: a
    ``ctx.self_test()`` block in ``build`` logs ``self_test_passed`` and its records there
    (ranks > 0 run it too, unlogged, until they know they have a sink)."""
    configure_log(spawn.options.log, spawn.options.quiet)
    pipeline = app(ctx)
    ctx.check_settings()
    _check_out_stream(pipeline, options)
    if options.serving is not None:
        apply_serving(pipeline, options.serving)
    ranks = Ranks(spawn, pipeline)
    run: ThreadedRun | None = None
    try:
        run = rank_run(pipeline, 0, ranks.rings, ranks.releases, run_id=ranks.run_id)
        if not ranks.wait_ready(stopping=lambda: egress.stopping):
            return LaunchResult(spawn.world)  # stopped before it started: nothing ran
        egress.halt_at_frames(run)
        egress.open(pipeline.session())
        replicas = _replicate(ctx, ranks.conns)
        run.start()
        try:
            watch = Watch(run, ranks, egress, options.on_status)
            ended = watch.until_end(options.frames, options.timeout)
            return replace(ended, run_id=ranks.run_id)
        finally:
            for subscription in replicas:
                subscription.dispose()
    finally:
        if run is not None:
            run.stop(0.45)
        ranks.close()


class Ranks:
    """Ranks 1..N-1 of one run, spawned by rank 0, and a ring per boundary between the ranks.

    Made and released together: :meth:`close` stops every rank, joins it (killing one still
    there ``JOIN_S`` later), closes the pipes and unlinks every ring.
    """

    def __init__(self, spawn: Spawn, pipeline: Pipeline) -> None:
        plan = pipeline.plan
        if plan.world > spawn.world:
            raise PipelineStateError(
                f"the app places stages on {plan.world} ranks, but only {spawn.world} were launched"
            )
        self.rings: dict[str, ShmRing] = {}
        self.releases: dict[str, tuple[Connection, Connection]] = {}  # CUDA ref ids coming back
        self.conns: dict[int, Connection] = {}
        self.procs: dict[int, Any] = {}
        self.run_id = new_run_id()
        """The run's id on every rank (rank 0's run takes it too)."""
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
            layout = layout_of(pipeline)
            for rank in range(1, spawn.world):
                parent, child = context.Pipe()
                self.conns[rank] = parent
                setup = RankSetup(spawn, rank, touching[rank], docs, layout, self.run_id)
                proc = context.Process(
                    target=rank_main,
                    args=(setup, self.releases, child),
                    name=f"rxstream-rank-{rank}",
                    daemon=True,
                )
                try:
                    proc.start()
                finally:
                    child.close()
                self.procs[rank] = proc
                live_ranks.add(proc)
        except BaseException:
            self.close()
            raise

    def wait_ready(
        self, timeout: float = READY_S, stopping: Callable[[], bool] = lambda: False
    ) -> bool:
        """Wait until every rank built its graph and started its run, so that rank 0 starts
        its sources only once the whole pipeline can take their items (a rank importing
        torch takes seconds); ``False`` when ``stopping()`` turned true first (a signal).
        A rank that fails, dies or is stopped by a signal first raises ``PipelineError``.
        ``timeout`` bounds a rank's build and start, and the silence of one loading its
        resources (``ctx.resource``): a rank that says it is still loading (every
        ``LOADING_BEAT_S``) has ``timeout`` more from each word, so a long load is not cut."""
        waiting = dict(self.conns)
        attached: set[int] = set()
        loading: dict[int, tuple[str, ...]] = {}
        deadline = time.monotonic() + timeout
        while waiting:
            if stopping():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                still = "".join(
                    f"; rank {rank} still loading {', '.join(map(repr, names))}"
                    for rank, names in sorted(loading.items())
                    if rank in waiting
                )
                raise PipelineError(
                    f"rank {min(waiting)}",
                    TimeoutError(f"not ready after {timeout:g} s (ranks {sorted(waiting)}){still}"),
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
                    elif message[0] == "loading":  # busy loading, not hung: more time
                        loading[rank] = tuple(message[2])
                        deadline = max(deadline, time.monotonic() + timeout)
                    elif message[0] == "error":
                        raise PipelineError(f"rank {rank}", RuntimeError(message[2]))
                    elif message[0] == "stopped" and not stopping():
                        raise stopped_by(rank, message[2])
                elif self.procs[rank].sentinel in ready and not conn.poll():
                    self.procs[rank].join(0.5)
                    ended = exit_text(self.procs[rank])
                    raise PipelineError(
                        f"rank {rank}",
                        RuntimeError(f"rank {rank} died ({ended}) before it was ready"),
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
            send_to(conn, ("stop",))
        deadline = time.monotonic() + JOIN_S
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
            live_ranks.discard(proc)
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

    def __init__(self, spawn: Spawn, egress: Egress) -> None:
        self._spawn = spawn
        self._egress = egress
        self._runs: list[tuple[Pipeline, _RankRun]] = []

    def __call__(self, pipeline: Pipeline, bridge: AsyncBridge) -> "_RankRun":
        ranks = Ranks(self._spawn, pipeline)
        try:
            run = rank_run(pipeline, 0, ranks.rings, ranks.releases, bridge, ranks.run_id)
            if not ranks.wait_ready(stopping=lambda: self._egress.stopping):
                raise PipelineStateError("the launch was stopped before every rank was ready")
        except BaseException:
            ranks.close()
            raise
        ranked = _RankRun(pipeline.context, run, ranks, self._egress, self._spawn.options.frames)
        self._runs.append((pipeline, ranked))
        return ranked

    def last_of(self, pipeline: Pipeline | None) -> "_RankRun | None":
        """The latest run of ``pipeline``."""
        runs = [ranked for made, ranked in self._runs if made is pipeline]
        return runs[-1] if runs else None

    def egressed(self) -> int:
        """Items the sinks of ranks 1..N-1 egressed, over every run."""
        return sum(sum(ranked.watch.egressed.values()) for _, ranked in self._runs)

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
        self, ctx: Context, run: ThreadedRun, ranks: Ranks, egress: Egress, frames: int | None
    ) -> None:
        self.run = run
        self.done = DoneEvent()
        self.stopped = False
        self._ctx = ctx
        self._frames = frames
        self._ranks = ranks
        self._closing = threading.Event()
        self.watch = Watch(run, ranks, egress, None, closing=self._closing)
        self._replicas: list[Any] = []
        self._thread: threading.Thread | None = None
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
            self.done.set()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) once every rank ended or the run failed."""
        self.done.on_done(callback)

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
        self.done.set()


def _replicate(ctx: Context, conns: Mapping[int, Connection]) -> list[Any]:
    """Send every doc write and generation change to every spawned rank, as it happens."""

    def broadcast(message: tuple[Any, ...]) -> None:
        for conn in conns.values():
            send_to(conn, message)

    return replicate(ctx, broadcast)
