"""SPMD launch: one app, N rank processes, each running its own stages.

``launch("app.py", ranks=2)`` runs rank 0 — the controller — in this process and spawns ranks
1..N-1 (``spawn``, never ``fork``: CUDA cannot be re-initialised in a forked child). Every
rank imports the app and calls its ``build(ctx)`` (apps written as ``async def main(ctx)``
are not launched yet), so every rank builds the same graph with the same stage names; each
runs only the stages placed on it. The controller creates a shared-memory ring per boundary
and hands the rings to the ranks; it replicates every doc write and generation change to
them, watches them (a rank that dies ends the run with an error naming it, within a second
on every rank), and waits until every rank completed — or stops them all at ``frames``
egressed, the ``timeout``, or an error — then joins them and unlinks every ring.
"""

import contextlib
import importlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import structlog

from rxstream._exceptions import PipelineError, PipelineStateError
from rxstream.context import Context
from rxstream.doc import Doc, GenerationState, Snapshot
from rxstream.doc._snapshot import thaw
from rxstream.ipc import RingHandle, ShmRing
from rxstream.pipeline import Pipeline
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._run import RING_SLOT_BYTES, RING_SLOTS, Run
from rxstream.runtime._stats import StageStatistics

__all__ = ["LaunchResult", "launch", "load_app"]

_log = structlog.get_logger("rxstream")

JOIN_S = 2.0
"""Seconds a stopping controller waits for a rank process before it terminates it."""
WATCH_S = 0.05
"""How often the controller checks on its ranks (a dead rank is noticed within ~this)."""

Build = Callable[[Context], Pipeline]


@dataclass(frozen=True)
class LaunchResult:
    """How a launched pipeline ended: statistics per rank, and egressed frames."""

    ranks: int
    """How many rank processes ran (the controller included)."""
    statistics: Mapping[int, Mapping[str, StageStatistics]] = field(default_factory=dict)
    """Each rank's stage statistics when it stopped, by rank."""
    egressed: int = 0
    """Items all sinks egressed, over every rank."""


def load_app(entry: str) -> Build:
    """The ``build(ctx)`` function of ``entry``: ``path/app.py[:func]`` or ``module:func``."""
    target, _, attr = entry.partition(":")
    attr = attr or "build"
    if target.endswith(".py") or os.sep in target:
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
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    build = getattr(module, attr, None)
    if not callable(build):
        raise AttributeError(
            f"app {entry!r} has no callable {attr!r} (def {attr}(ctx) -> Pipeline)"
        )
    return build  # type: ignore[no-any-return]


def _stats_payload(run: Run) -> dict[str, dict[str, Any]]:
    """Statistics in a form that pickles (MappingProxyType does not)."""
    out = {}
    for name, stats in run.statistics().items():
        fields = dict(stats.__dict__)
        fields["dropped"] = dict(stats.dropped)
        out[name] = fields
    return out


def _stats_from(payload: Mapping[str, Mapping[str, Any]]) -> dict[str, StageStatistics]:
    return {
        name: StageStatistics(**{**fields, "dropped": MappingProxyType(dict(fields["dropped"]))})
        for name, fields in payload.items()
    }


def _egressed(run: Run) -> int:
    return sum(s.items_out for s in run.statistics().values() if s.kind == "stream")


# --- a rank process ----------------------------------------------------------------------------


def _rank_run(
    pipeline: Pipeline,
    rank: int,
    rings: Mapping[str, ShmRing],
    releases: Mapping[str, tuple[Connection, Connection]],
) -> Run:
    """The run of ``pipeline``'s stages on ``rank``, over the launcher's rings."""
    ctx = pipeline.context
    return Run(
        pipeline.plan,
        mode="threads",
        bridge=AsyncBridge(),
        generations=ctx.generations,
        timing=ctx.timing,
        rank=rank,
        rings=rings,
        releases=releases,
        cuda_api=ctx.cuda_api,
    )


def _rank_main(
    entry: str,
    rank: int,
    world: int,
    handles: Mapping[str, RingHandle],
    releases: Mapping[str, tuple[Connection, Connection]],
    conn: Connection,
    docs: Mapping[str, tuple[dict[str, Any], int]],
) -> None:
    """The body of rank ``rank`` > 0 (in a spawned process)."""
    rings: dict[str, ShmRing] = {}
    try:
        ctx = Context(rank=rank, world=world, replicas=docs)
        pipeline = load_app(entry)(ctx)
        rings = {name: ShmRing.attach(handle) for name, handle in handles.items()}
        run = _rank_run(pipeline, rank, rings, releases)
        listener = threading.Thread(
            target=_listen, args=(conn, ctx, run), name="rxstream:control", daemon=True
        )
        listener.start()
        run.start()
        while not run.done.wait(WATCH_S):
            conn.send(("egressed", rank, _egressed(run)))
        run.stop(0.45)
        if run.error is not None:
            conn.send(("error", rank, _describe(run.error), _stats_payload(run)))
        else:
            conn.send(("done", rank, _egressed(run), _stats_payload(run)))
    except BaseException as exc:
        _send(conn, ("error", rank, _describe(exc), {}))
    finally:
        for ring in rings.values():
            ring.close()
        conn.close()


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    """Send to a rank, ignoring one that is gone (the watcher reports it)."""
    with contextlib.suppress(OSError):
        conn.send(message)


def _describe(exc: BaseException) -> str:
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
        kind = message[0]
        if kind == "doc":
            _, name, state, version = message
            ctx.doc(name).replicate(state, version)
        elif kind == "generations":
            _, state, steered_at = message
            ctx.generations.replicate(state, steered_at)
        elif kind == "stop":
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
) -> LaunchResult:
    """Run the app ``entry`` on ``ranks`` processes until it completes; its statistics.

    ``frames`` stops every rank once the sinks egressed that many items; ``config`` is the
    initial desired state of the control doc; ``timeout`` (seconds) stops a run that has not
    ended by then. A failure on any rank raises :class:`PipelineError` naming it.
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
    ctx = Context(rank=0, world=ranks, config=config)
    pipeline = load_app(entry)(ctx)
    plan = pipeline.plan
    if plan.world > ranks:
        raise PipelineStateError(
            f"the app places stages on {plan.world} ranks, but only {ranks} were launched"
        )
    rings = {
        plan.edge_name(up, down): ShmRing.create(slots=RING_SLOTS, slot_bytes=RING_SLOT_BYTES)
        for up, down in plan.boundaries
    }
    handles = {name: ring.handle() for name, ring in rings.items()}
    spawn = multiprocessing.get_context("spawn")
    releases = {name: spawn.Pipe(duplex=False) for name in rings}  # CUDA ref ids coming back
    docs = {name: (thaw(doc.snapshot()), doc.version) for name, doc in ctx.docs.items()}
    conns: dict[int, Connection] = {}
    procs: dict[int, Any] = {}
    run: Run | None = None
    try:
        for rank in range(1, ranks):
            parent, child = spawn.Pipe()
            proc = spawn.Process(
                target=_rank_main,
                args=(entry, rank, ranks, handles, releases, child, docs),
                name=f"rxstream-rank-{rank}",
                daemon=True,
            )
            proc.start()
            child.close()
            conns[rank], procs[rank] = parent, proc
        run = _rank_run(pipeline, 0, rings, releases)
        replicas = _replicate(ctx, conns)
        run.start()
        try:
            return _watch(run, conns, procs, frames, timeout)
        finally:
            for subscription in replicas:
                subscription.dispose()
    finally:
        if run is not None:
            run.stop(0.45)
        for conn in conns.values():
            _send(conn, ("stop",))
        deadline = time.monotonic() + JOIN_S
        for proc in procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in conns.values():
            conn.close()
        for pair in releases.values():
            for end in pair:
                end.close()
        for ring in rings.values():
            ring.close()
            ring.unlink()


def _replicate(ctx: Context, conns: Mapping[int, Connection]) -> list[Any]:
    """Send every doc write and generation change to every rank, as it happens."""
    subscriptions: list[Any] = []

    def broadcast(message: tuple[Any, ...]) -> None:
        for conn in conns.values():
            _send(conn, message)

    def doc_writer(name: str, doc: Doc) -> Callable[[Snapshot], None]:
        return lambda snapshot: broadcast(("doc", name, thaw(snapshot), doc.version))

    for name, doc in ctx.docs.items():
        subscriptions.append(doc.snapshots.subscribe(doc_writer(name, doc)))
    gens = ctx.generations

    def on_generations(state: GenerationState) -> None:
        broadcast(("generations", state, gens.steered_at))

    gens.listeners.append(on_generations)
    subscriptions.append(_Unlisten(gens.listeners, on_generations))
    return subscriptions


class _Unlisten:
    def __init__(self, listeners: list[Any], listener: Any) -> None:
        self._listeners, self._listener = listeners, listener

    def dispose(self) -> None:
        if self._listener in self._listeners:
            self._listeners.remove(self._listener)


def _watch(
    run: Run,
    conns: Mapping[int, Connection],
    procs: Mapping[int, Any],
    frames: int | None,
    timeout: float | None,
) -> LaunchResult:
    """Wait for every rank to end; fail fast naming a rank that died or failed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    ranks = len(conns) + 1
    egressed = dict.fromkeys(conns, 0)
    stats: dict[int, dict[str, StageStatistics]] = {}
    finished: set[int] = set()
    stopping_until: float | None = None  # set once the run ends: ranks report, then go
    while True:
        ready = multiprocessing.connection.wait(
            [*conns.values(), *(p.sentinel for p in procs.values())], timeout=WATCH_S
        )
        for rank, conn in conns.items():
            if conn not in ready or rank in finished:
                continue
            try:
                message = conn.recv()
            except (EOFError, OSError):  # its end of the pipe closed: the process is gone
                _died(run, rank, procs[rank])
            kind = message[0]
            if kind == "egressed":
                egressed[rank] = message[2]
            elif kind == "done":
                egressed[rank], stats[rank] = message[2], _stats_from(message[3])
                finished.add(rank)
            elif kind == "error":
                stats[rank] = _stats_from(message[3])
                error = PipelineError(f"rank {rank}", RuntimeError(message[2]))
                run.fail(error)
                raise error
        for rank, proc in procs.items():
            if rank not in finished and proc.sentinel in ready and not conns[rank].poll():
                _died(run, rank, proc)
        run.raise_error()
        if len(finished) == len(conns) and (run.done.is_set() or stopping_until is not None):
            break
        if stopping_until is not None:
            if time.monotonic() > stopping_until:
                break  # a rank that does not report in time is killed by the caller
            continue
        total = sum(egressed.values()) + _egressed(run)
        # a finite run ends by itself: every rank completes once the end reaches it
        ended = (frames is not None and total >= frames) or (
            deadline is not None and time.monotonic() > deadline
        )
        if ended:  # stop every rank, then collect their final statistics
            run.halt()
            for rank, conn in conns.items():
                if rank not in finished:
                    _send(conn, ("stop",))
            stopping_until = time.monotonic() + JOIN_S
    stats[0] = dict(run.statistics())
    return LaunchResult(ranks, MappingProxyType(stats), sum(egressed.values()) + _egressed(run))


def _died(run: Run, rank: int, proc: Any) -> NoReturn:
    """A rank process ended without reporting: fail the run, naming it."""
    proc.join(0.5)
    error = PipelineError(
        f"rank {rank}", RuntimeError(f"rank {rank} died (exit code {proc.exitcode})")
    )
    run.fail(error)
    raise error
