"""Ranks beyond one host: ``torch.distributed`` ranks, launched by ``torchrun``.

Under ``torchrun`` every process runs one rank, and :func:`rxstream.launch` (so ``rxstream run
app.py``) hands over to :func:`launch_torchrun` when it finds torchrun's environment::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m rxstream run app.py --frames 1000

Each rank joins the gloo process group torchrun's rendezvous describes, rank 0 (the
controller) builds the app first and hands its docs to the others, which build the same
graph. The ranks tell each other their host (hostname and boot id): a boundary between two
ranks of one host keeps the shared-memory ring (its upstream rank makes it and passes its file
descriptors over a Unix socket), a boundary between hosts crosses over ``torch.distributed``
point-to-point (:class:`DistChannel`: gloo, and NCCL for CUDA tensors when every rank has it).
``RXSTREAM_CROSS_HOST`` forces the cross-host transport on one host (``all``, or edge names).

The controller replicates every doc write and generation change to the other ranks over a
gloo group of its own, gathers their egress counts, ends the run (``frames``, ``timeout``,
every rank completed, or the first error) and stops every rank. Ranks hear from the
controller every ``HEARTBEAT_S`` and report to it every ``WATCH_S``: a rank (or a host's
ranks) not heard from for ``LOST_S``, or whose connection breaks, ends the run on every other
rank with a :class:`RankLost` naming it.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import math
import multiprocessing
import multiprocessing.reduction
import os
import queue
import secrets
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Any

import structlog

from rxstream._exceptions import PipelineError, PipelineStateError, RingClosed
from rxstream.context import Context
from rxstream.doc import Doc, GenerationState, Snapshot
from rxstream.doc._snapshot import thaw
from rxstream.ipc import RingHandle, ShmRing
from rxstream.launch import LaunchResult, load_app
from rxstream.pipeline import Pipeline
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._distboundary import DistChannel, DistRun, RankLost
from rxstream.runtime._plan import Plan
from rxstream.runtime._run import RING_SLOT_BYTES, RING_SLOTS
from rxstream.runtime._stats import StageStatistics
from rxstream.timing import configure_logging

__all__ = [
    "BACKEND_ENV",
    "CROSS_HOST_ENV",
    "DistChannel",
    "RankLost",
    "TorchrunEnv",
    "estimate_offset",
    "launch_torchrun",
    "loopback_groups",
    "open_group",
    "torchrun_env",
]

_log = structlog.get_logger("rxstream")

CROSS_HOST_ENV = "RXSTREAM_CROSS_HOST"
"""Forces boundaries onto the cross-host transport: ``all``, or a comma list of edge names."""
BACKEND_ENV = "RXSTREAM_DIST_BACKEND"
"""How CUDA tensors cross hosts: ``auto`` (default: NCCL when every rank has it), ``gloo``
(through host memory), ``nccl`` (required)."""
HEARTBEAT_S = 0.25
"""How often the controller tells every rank it is there (ranks report every ``WATCH_S``)."""
LOST_S = 2.0
"""A rank not heard from for this long has gone away."""
SETUP_S = 300.0
"""The timeout of the collectives that set a launch up (ranks wait for each other's build)."""
PINGS = 8
"""Round trips that measure another host's clock; the shortest one counts."""
WATCH_S = 0.05
"""How often a rank reports to the controller, and the controller checks on the ranks."""
JOIN_S = 2.0
"""How long the controller waits for the ranks' final statistics once the run stopped."""
STATUS_S = 0.5
"""How often ``on_status`` gets every rank's statistics."""

Statistics = Mapping[int, Mapping[str, StageStatistics]]

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class TorchrunEnv:
    """What torchrun tells a worker process about its place in the job."""

    rank: int
    """This process's rank in the job (``RANK``)."""
    world: int
    """How many ranks the job has (``WORLD_SIZE``)."""
    local_rank: int
    """This process's rank on its host (``LOCAL_RANK``; its GPU, when it has one)."""
    master_addr: str
    """Where the rendezvous store listens (``MASTER_ADDR``)."""
    master_port: int
    """Its port (``MASTER_PORT``)."""


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """The torchrun environment of this process; ``None`` unless all five variables are set.

    Raises ``ValueError`` naming the variable for a value that is not what torchrun sets.
    """
    env = os.environ if environ is None else environ
    if not all(name in env for name in _TORCHRUN_VARS):
        return None

    def number(name: str, low: int, high: int | None = None) -> int:
        raw = env[name]
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < low or (high is not None and value >= high):
            bound = f">= {low}" if high is None else f"in [{low}, {high})"
            raise ValueError(f"{name} must be an int {bound}, got {raw!r}")
        return value

    world = number("WORLD_SIZE", 1)
    return TorchrunEnv(
        rank=number("RANK", 0, world),
        world=world,
        local_rank=number("LOCAL_RANK", 0),
        master_addr=env["MASTER_ADDR"],
        master_port=number("MASTER_PORT", 1, 65536),
    )


def loopback_groups(world: int, *, timeout: float = 30.0) -> list[Any]:
    """``world`` gloo process groups of one job, every rank in this process, over 127.0.0.1.

    Group ``r`` is rank ``r``'s view. For testing and measuring boundaries without torchrun:
    ``DistChannel(name, groups[0], 1, side="writer")`` talks to ``DistChannel(name,
    groups[1], 0, side="reader")``.
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise ValueError(f"world must be an int >= 2, got {world!r}")
    from torch._C._distributed_c10d import HashStore, PrefixStore

    store = PrefixStore(secrets.token_hex(4), HashStore())
    groups: list[Any] = [None] * world
    errors: list[BaseException] = []

    def make(rank: int) -> None:
        try:
            groups[rank] = _gloo(store, rank, world, "127.0.0.1", timeout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return groups


def open_group(
    rank: int, world: int, *, port: int, host: str = "127.0.0.1", timeout: float = 30.0
) -> Any:
    """Rank ``rank``'s gloo process group of ``world`` processes meeting at ``host:port``.

    Rank 0 hosts the store there; every rank blocks until all have joined. For testing and
    measuring boundaries between processes without torchrun.
    """
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    span = datetime.timedelta(seconds=timeout)
    store = TCPStore(host, port, world, rank == 0, span)
    return _gloo(PrefixStore("rxstream", store), rank, world, host, timeout)


def _gloo(store: Any, rank: int, world: int, host: str, timeout: float) -> Any:
    """A gloo group on ``host``'s interface."""
    from torch._C._distributed_c10d import ProcessGroupGloo

    # ``_Options`` is how a device is given to the constructor (no public spelling)
    options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._devices = [ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = datetime.timedelta(seconds=timeout)
    return ProcessGroupGloo(store, rank, world, options)


def estimate_offset(exchange: Callable[[], float], clock: Callable[[], float], pings: int) -> float:
    """Seconds to add to another host's clock to read this one: the best of ``pings`` trips.

    ``exchange()`` does one round trip and returns the other host's clock reading; the trip
    with the shortest round trip counts (its reading is taken as made halfway).
    """
    best_rtt, best = math.inf, 0.0
    for _ in range(pings):
        sent = clock()
        theirs = exchange()
        back = clock()
        if back - sent < best_rtt:
            best_rtt, best = back - sent, (sent + back) / 2 - theirs
    return best


# --- the launch -----------------------------------------------------------------------------------


def launch_torchrun(
    entry: str,
    ranks: int = 1,
    *,
    frames: int | None = None,
    config: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    settings: Sequence[str] = (),
    serving: Mapping[str, Any] | None = None,
    transport: Any = None,
    out: str | Path | None = None,
    out_stream: str | None = None,
    log: str | Path | None = None,
    on_open: Callable[[], None] | None = None,
    on_status: Callable[[Statistics], None] | None = None,
    quiet: bool = False,
) -> LaunchResult:
    """Run this process's rank of the app ``entry`` under torchrun until the job ends.

    Arguments as :func:`rxstream.launch`, which calls this when it finds torchrun's
    environment. The world size is torchrun's, so ``ranks`` must be 1 (the default) or that
    size. ``config`` and ``settings`` are rank 0's (the others get its docs); ``on_open`` and
    ``on_status`` are called on rank 0; ``log`` is written by every rank that has a sink (on
    its own host). A session transport, ``out`` and ``serving`` are not supported under
    torchrun (``ValueError``). Rank 0 returns every rank's statistics, the others their own.
    A failure anywhere raises :class:`PipelineError` on every rank that is left, naming the
    rank (for a rank or host that went away, caused by :class:`RankLost`).
    """
    env = torchrun_env()
    if env is None:
        raise PipelineStateError(
            "launch_torchrun runs under torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
            "and MASTER_PORT must be set (torchrun --nproc-per-node N -m rxstream run APP)"
        )
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks not in (1, env.world):
        raise ValueError(
            f"ranks must be 1 or torchrun's WORLD_SIZE ({env.world}) under torchrun, got {ranks!r}"
        )
    given = {"transport": transport, "out": out, "out_stream": out_stream, "serving": serving}
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name} is not supported under torchrun yet, got {value!r}")
    options = _Options(frames, config, timeout, tuple(settings), log, on_open, on_status, quiet)
    import torch
    import torch.distributed as dist

    if quiet:
        configure_logging(None, json=False, level=logging.WARNING)
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    dist.init_process_group(
        "gloo",
        init_method="env://",
        rank=env.rank,
        world_size=env.world,
        timeout=datetime.timedelta(seconds=SETUP_S),
    )
    launch: _Launch | None = None
    try:
        with _terminate_as_interrupt(lambda: None if launch is None else launch.failure):
            launch = _Launch(env, entry, options)
            return launch.run()
    except PipelineError as exc:
        if isinstance(exc.cause, RankLost):
            # a wait on a peer that went silent never ends, and gloo's teardown at the
            # interpreter's exit would hang on it, then abort: end the process without it
            atexit.register(_exit_now, 1)
        raise
    finally:
        dist.destroy_process_group()  # left to the interpreter's exit, it aborts the process


def _exit_now(status: int) -> None:
    """End the process at once (an ``atexit`` hook): flushed, without destructors."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


@dataclass(frozen=True)
class _Options:
    """What :func:`launch_torchrun` was asked for."""

    frames: int | None
    config: Mapping[str, Any] | None
    timeout: float | None
    settings: tuple[str, ...]
    log: str | Path | None
    on_open: Callable[[], None] | None
    on_status: Callable[[Statistics], None] | None
    quiet: bool


@contextlib.contextmanager
def _terminate_as_interrupt(known: Callable[[], BaseException | None]) -> Iterator[None]:
    """SIGTERM (torchrun stopping its workers once one failed) raises, so cleanup runs.

    It raises the job's failure when this rank knows it already, else a KeyboardInterrupt.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        failure = known()
        if failure is not None:
            raise failure
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _host_id() -> str:
    """This host: its name and boot id (two containers of one name are not one host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


@dataclass(frozen=True)
class _Peer:
    """What every rank tells the others as the launch is set up."""

    host: str
    pid: int
    error: str | None
    nccl: bool


class _Launch:
    """One rank's side of a torchrun launch: set up, run, end, tear down."""

    def __init__(self, env: TorchrunEnv, entry: str, options: _Options) -> None:
        import torch.distributed as dist

        self.env = env
        self.options = options
        self.failure: BaseException | None = None
        """How the job failed, once this rank knows (SIGTERM then raises it)."""
        self.rank = env.rank
        self.world = env.world
        self.dist = dist
        self.control = dist.new_group(backend="gloo")  # doc writes, reports, heartbeats
        self.ctx: Context
        self.pipeline: Pipeline
        self._build(entry)
        self.plan: Plan = self.pipeline.plan
        self.hosts = [peer.host for peer in self.peers]
        self.cross = _cross_edges(self.plan, self.hosts, self.environ[0])
        self.nccl = _use_nccl(self.peers, self.environ[1])
        if options.log is not None and _has_sink(self.plan, self.rank):
            configure_logging(options.log)
        self.offsets = self._clock_offsets()

    # --- setting up ---------------------------------------------------------------------------

    def _build(self, entry: str) -> None:
        """Rank 0 builds first; the others build with its docs (as spawned ranks do).

        Rank 0's ``RXSTREAM_CROSS_HOST`` and ``RXSTREAM_DIST_BACKEND`` count for every rank.
        A rank whose build fails raises its error; the others raise one naming it.
        """
        dist, world = self.dist, self.world
        failure: BaseException | None = None
        if self.rank == 0:
            docs: dict[str, tuple[dict[str, Any], int]] = {}
            options = self.options
            try:
                if options.log is not None:  # afresh, before any rank writes to it
                    Path(options.log).parent.mkdir(parents=True, exist_ok=True)
                    Path(options.log).write_text("", encoding="utf-8")
                from rxstream.launch import _AppContext  # writes --set as the app makes the doc

                ctx = _AppContext(
                    settings=options.settings, config=options.config, rank=0, world=world
                )
                self.ctx = ctx
                self.pipeline = load_app(entry)(ctx)
                ctx.check_settings()
                if self.pipeline.plan.world > world:
                    raise PipelineStateError(
                        f"the app places stages on {self.pipeline.plan.world} ranks, but "
                        f"torchrun started only {world}"
                    )
                docs = {n: (thaw(d.snapshot()), d.version) for n, d in self.ctx.docs.items()}
            except BaseException as exc:
                failure = exc
            environ = (os.environ.get(CROSS_HOST_ENV, ""), os.environ.get(BACKEND_ENV, ""))
            box: list[Any] = [None if failure is None else _describe(failure), docs, environ]
            dist.broadcast_object_list(box, src=0)
            if failure is not None:
                raise failure
        else:
            box = [None, None, None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is not None:
                raise PipelineError("rank 0", RuntimeError(box[0]))
            try:
                self.ctx = Context(rank=self.rank, world=world, replicas=box[1])
                self.pipeline = load_app(entry)(self.ctx)
            except BaseException as exc:
                failure = exc
        self.environ: tuple[str, str] = box[2]
        self.peers = self._gather_peers(failure)

    def _gather_peers(self, failure: BaseException | None) -> list[_Peer]:
        """Every rank's host, pid and build outcome; raises for a build that failed."""
        import torch
        import torch.distributed as dist

        nccl = bool(torch.cuda.is_available() and dist.is_nccl_available())
        error = None if failure is None else _describe(failure)
        peers: list[Any] = [None] * self.world
        dist.all_gather_object(peers, _Peer(_host_id(), os.getpid(), error, nccl))
        if failure is not None:
            raise failure
        for rank, peer in enumerate(peers):
            if peer.error is not None:
                raise PipelineError(f"rank {rank}", RuntimeError(peer.error))
        return peers

    def _clock_offsets(self) -> dict[str, float]:
        """Seconds to add to each host's monotonic clock to read rank 0's (0 on its host)."""
        import torch

        dist = self.dist
        leaders: dict[str, int] = {}
        for rank, host in enumerate(self.hosts):
            leaders.setdefault(host, rank)
        offsets = {self.hosts[0]: 0.0}
        others = [rank for host, rank in leaders.items() if host != self.hosts[0]]
        ping = torch.zeros(1, dtype=torch.float64)
        if self.rank == 0:
            for leader in others:

                def exchange(leader: int = leader) -> float:
                    dist.send(ping, leader, group=self.control)
                    dist.recv(ping, leader, group=self.control)
                    return float(ping[0])

                offsets[self.hosts[leader]] = estimate_offset(exchange, time.monotonic, PINGS)
        elif self.rank in others:
            for _ in range(PINGS):
                dist.recv(ping, 0, group=self.control)
                ping[0] = time.monotonic()
                dist.send(ping, 0, group=self.control)
        box: list[Any] = [offsets]
        dist.broadcast_object_list(box, src=0)
        return dict(box[0])

    def _channels(self) -> dict[str, DistChannel]:
        """One channel per cross-host boundary this rank is an end of (groups made by all)."""
        dist, plan = self.dist, self.plan
        channels: dict[str, DistChannel] = {}
        for up, down in plan.boundaries:
            name = plan.edge_name(up, down)
            if name not in self.cross:
                continue
            pair = sorted({plan.ranks[up], plan.ranks[down]})
            group = dist.new_group(ranks=pair, backend="gloo")
            nccl = dist.new_group(ranks=pair, backend="nccl") if self.nccl else None
            if self.rank not in pair:
                continue
            upstream = plan.ranks[up] == self.rank
            peer = plan.ranks[down] if upstream else plan.ranks[up]
            shift = self.offsets[self.hosts[peer]] - self.offsets[self.hosts[self.rank]]
            channels[name] = DistChannel(
                name,
                group,
                dist.get_group_rank(group, peer),
                side="writer" if upstream else "reader",
                peer_rank=peer,
                nccl=nccl,
                shift=0.0 if upstream else shift,
            )
        return channels

    # --- running ------------------------------------------------------------------------------

    def run(self) -> LaunchResult:
        rings: dict[str, ShmRing] = {}
        owned: list[ShmRing] = []
        releases: dict[str, tuple[Connection, Connection]] = {}
        channels: dict[str, DistChannel] = {}
        control: _Control | None = None
        run: DistRun | None = None
        try:
            rings, owned, releases = _share_rings(self)
            channels = self._channels()
            control = _Control(self)
            ctx = self.ctx
            run = DistRun(
                self.plan,
                links=channels,
                bridge=AsyncBridge(),
                generations=ctx.generations,
                timing=ctx.timing,
                rank=self.rank,
                rings=rings,
                releases=releases,
                cuda_api=ctx.cuda_api,
            )
            if self.rank == 0:
                return control.lead(run, self.options)
            return control.follow(run)
        finally:
            if run is not None:
                run.stop(0.45)
            for channel in channels.values():
                channel.close()
            if control is not None:
                control.close()
            for pair in releases.values():
                for end in pair:
                    end.close()
            for ring in rings.values():
                ring.close()
            for ring in owned:
                ring.unlink()


def _has_sink(plan: Plan, rank: int) -> bool:
    return any(node.stage.is_sink and plan.ranks[node] == rank for node in plan.nodes)


def _cross_edges(plan: Plan, hosts: Sequence[str], forced: str) -> frozenset[str]:
    """The boundaries that cross hosts, and those ``RXSTREAM_CROSS_HOST`` forces across."""
    names = [plan.edge_name(up, down) for up, down in plan.boundaries]
    cross = {
        plan.edge_name(up, down)
        for up, down in plan.boundaries
        if hosts[plan.ranks[up]] != hosts[plan.ranks[down]]
    }
    forced = forced.strip()
    if forced == "all":
        return frozenset(names)
    for name in filter(None, (part.strip() for part in forced.split(","))):
        if name not in names:
            known = ", ".join(repr(n) for n in names) or "none"
            raise ValueError(
                f"{CROSS_HOST_ENV} must be 'all' or boundaries of the app (its boundaries: "
                f"{known}), got {name!r}"
            )
        cross.add(name)
    return frozenset(cross)


def _use_nccl(peers: Sequence[_Peer], choice: str) -> bool:
    """Whether cross-host boundaries get an NCCL group for CUDA tensors."""
    choice = choice.strip() or "auto"
    if choice not in _BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(_BACKENDS)}, got {choice!r}")
    every = all(peer.nccl for peer in peers)
    if choice == "nccl" and not every:
        lacking = [rank for rank, peer in enumerate(peers) if not peer.nccl]
        raise ValueError(
            f"{BACKEND_ENV}=nccl needs CUDA and NCCL on every rank; ranks {lacking} have not"
        )
    return choice == "nccl" or (choice == "auto" and every)


# --- same-host rings: file descriptors over a Unix socket ------------------------------------


def _share_rings(
    launch: _Launch,
) -> tuple[dict[str, ShmRing], list[ShmRing], dict[str, tuple[Connection, Connection]]]:
    """The rings of this rank's same-host boundaries, and their CUDA release pipes.

    The upstream rank of each makes the ring and serves its pipes' file descriptors on an
    abstract Unix socket (only to the downstream rank's pid); the downstream rank takes them
    and attaches. torchrun's workers are siblings, so nothing is inherited.
    """
    dist, plan, rank = launch.dist, launch.plan, launch.rank
    mine: dict[str, tuple[ShmRing, tuple[Connection, Connection], int]] = {}
    rings: dict[str, ShmRing] = {}
    releases: dict[str, tuple[Connection, Connection]] = {}
    wanted: list[tuple[str, int]] = []  # (edge, upstream rank) this rank attaches to
    for up, down in plan.boundaries:
        name = plan.edge_name(up, down)
        if name in launch.cross:
            continue
        if plan.ranks[up] == rank:
            ring = ShmRing.create(slots=RING_SLOTS, slot_bytes=RING_SLOT_BYTES)
            mine[name] = (
                ring,
                multiprocessing.Pipe(duplex=False),
                launch.peers[plan.ranks[down]].pid,
            )
            rings[name] = ring
            releases[name] = mine[name][1]
        elif plan.ranks[down] == rank:
            wanted.append((name, plan.ranks[up]))
    server = _FdServer(mine) if mine else None
    try:
        offers: list[Any] = [None] * launch.world
        offered = None if server is None else (server.address, server.handles())
        dist.all_gather_object(offers, offered)
        for name, upstream in wanted:
            address, handles = offers[upstream]
            ring, release = _take_ring(address, name, handles[name])
            rings[name] = ring
            releases[name] = release
        dist.barrier()
    except BaseException:
        for ring, _, _ in mine.values():
            ring.close()
            ring.unlink()
        raise
    finally:
        if server is not None:
            server.close()
    return rings, [ring for ring, _, _ in mine.values()], releases


class _FdServer:
    """Hands each ring's pipe descriptors to the one process allowed to take them."""

    def __init__(
        self, rings: Mapping[str, tuple[ShmRing, tuple[Connection, Connection], int]]
    ) -> None:
        self._rings = dict(rings)
        self.address = f"\0rxstream-{os.getpid()}-{secrets.token_hex(8)}"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind(self.address)
        self._socket.listen(len(rings))
        self._socket.settimeout(SETUP_S)
        self._thread = threading.Thread(target=self._serve, name="rxstream:rings", daemon=True)
        self._thread.start()

    def handles(self) -> dict[str, tuple[str, int, int, int, tuple[int, int] | None]]:
        """What attaching takes besides the descriptors: name, sizes, owner and its tracker."""
        out = {}
        for name, (ring, _, _) in self._rings.items():
            handle = ring.handle()
            out[name] = (
                handle.name,
                handle.slots,
                handle.slot_bytes,
                handle.owner_pid,
                handle.tracker,
            )
        return out

    def _serve(self) -> None:
        left = set(self._rings)
        while left:
            try:
                conn, _ = self._socket.accept()
            except OSError:  # closed, or the setup timed out
                return
            with conn:
                pid = struct.unpack(
                    "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                )[0]
                name = conn.recv(4096).decode()
                entry = self._rings.get(name)
                if entry is None or entry[2] != pid or name not in left:
                    continue  # not the process this ring is for
                ring, release, _ = entry
                handle = ring.handle()
                fds = [c.fileno() for c in (*handle.ready, *handle.free, *release)]
                multiprocessing.reduction.sendfds(conn, fds)
                left.discard(name)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._thread.join(1.0)


def _take_ring(
    address: str, name: str, handle: tuple[str, int, int, int, tuple[int, int] | None]
) -> tuple[ShmRing, tuple[Connection, Connection]]:
    """Attach to the ring ``name`` served at ``address``; the ring and its release pipe."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(SETUP_S)
        sock.connect(address)
        sock.sendall(name.encode())
        fds = multiprocessing.reduction.recvfds(sock, 6)
    ends = [
        Connection(fd, readable=readable, writable=not readable)
        for fd, readable in zip(fds, (True, False) * 3, strict=True)
    ]
    segment, slots, slot_bytes, owner, tracker = handle
    ring_handle = RingHandle(
        name=segment,
        slots=slots,
        slot_bytes=slot_bytes,
        ready=(ends[0], ends[1]),
        free=(ends[2], ends[3]),
        owner_pid=owner,
        tracker=tracker,
    )
    try:
        ring = ShmRing.attach(ring_handle)  # it keeps copies of the four pipe ends
    finally:
        for end in ends[:4]:
            end.close()
    return ring, (ends[4], ends[5])


# --- the control plane ----------------------------------------------------------------------


class _Outbox:
    """Messages to one peer, sent in order by a thread of their own (a send may block)."""

    def __init__(self, channel: DistChannel) -> None:
        self.channel = channel
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._pump, name=f"rxstream:{channel.name}:send", daemon=True
        )
        self._thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        self._queue.put(message)

    def _pump(self) -> None:
        while True:
            message = self._queue.get()
            if message is None:
                return
            try:
                self.channel.put(message)
            except RingClosed:
                return

    def close(self, timeout: float) -> None:
        """Send what is queued (within ``timeout``), then the channel's close mark."""
        self._queue.put(None)
        self._thread.join(timeout)
        self.channel.close()


class _Control:
    """The control plane of one rank: a channel each way to the controller (or each rank).

    Rank 0 talks to every rank, the others to rank 0 only. Each side hears from the other at
    least every ``HEARTBEAT_S`` (a thread of its own sends beats), and ``lost`` names the
    peers that broke or went quiet.
    """

    def __init__(self, launch: _Launch) -> None:
        self.launch = launch
        self.rank = launch.rank
        group = launch.control
        peers = range(1, launch.world) if self.rank == 0 else (0,)
        self.outboxes: dict[int, _Outbox] = {}
        self.inboxes: dict[int, DistChannel] = {}
        self.heard: dict[int, float] = {}
        self.broken: set[int] = set()
        self.changed = threading.Event()  # a message or a loss arrived
        self.reports: dict[int, tuple[int, bool]] = {}  # rank -> (egressed, completed)
        self.live: dict[int, Mapping[str, StageStatistics]] = {}  # the latest reported
        self.errors: dict[int, PipelineError] = {}
        self.finals: dict[int, tuple[int, dict[str, StageStatistics]]] = {}
        self.stop: tuple[PipelineError | None] | None = None  # what the controller said
        self.bye: int | None = None  # the controller's last word: items egressed in all
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        now = time.monotonic()
        for peer in peers:
            tell, hear = f"control:{self.rank}>{peer}", f"control:{peer}>{self.rank}"
            lost = self._on_lost(peer)
            self.outboxes[peer] = _Outbox(
                DistChannel(tell, group, peer, side="writer", on_lost=lost)
            )
            self.inboxes[peer] = DistChannel(hear, group, peer, side="reader", on_lost=lost)
            self.heard[peer] = now
            self._start(f"rxstream:{hear}", self._dispatch, peer)
        self._start(f"rxstream:control:{self.rank}:beat", self._beat)

    def _start(self, name: str, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _on_lost(self, peer: int) -> Callable[[BaseException], None]:
        def lost(error: BaseException) -> None:
            self.broken.add(peer)
            self.changed.set()

        return lost

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            self.broadcast(("beat",))

    def _dispatch(self, peer: int) -> None:
        inbox = self.inboxes[peer]
        while True:
            try:
                message = inbox.get()
            except (RingClosed, PipelineError):
                return
            self.heard[peer] = time.monotonic()
            self._apply(peer, message)
            self.changed.set()

    def _apply(self, peer: int, message: tuple[Any, ...]) -> None:
        kind = message[0]
        ctx = self.launch.ctx
        if kind == "report":
            self.reports[peer] = (message[1], message[2])
            self.live[peer] = _stats_from(message[3])
        elif kind == "error":
            self.errors.setdefault(peer, message[1])
        elif kind == "final":
            self.finals[peer] = (message[1], _stats_from(message[2]))
        elif kind == "doc":
            _, name, state, version = message
            ctx.doc(name).replicate(state, version)
        elif kind == "generations":
            _, state, steered_at = message
            ctx.generations.replicate(state, steered_at)
        elif kind == "stop":
            self.stop = (message[1],)
        elif kind == "bye":
            self.bye = message[1]

    def broadcast(self, message: tuple[Any, ...]) -> None:
        for outbox in self.outboxes.values():
            outbox.send(message)

    def wait(self) -> float:
        """Until something arrived, or ``WATCH_S``; the time then."""
        self.changed.wait(WATCH_S)
        self.changed.clear()
        return time.monotonic()

    def lost(self, now: float) -> PipelineError | None:
        """An error naming the ranks that went away (broken, or silent for ``LOST_S``)."""
        broken = set(self.broken)
        silent = {p for p, t in self.heard.items() if now - t > LOST_S} - broken
        if not broken and not silent:
            return None
        # a host that went away takes all its ranks: name the ones going quiet with it too
        quiet = {p for p, t in self.heard.items() if now - t > LOST_S / 2}
        ranks = tuple(sorted(broken | silent | quiet))
        hosts = ", ".join(sorted({repr(self.launch.hosts[r].split("/")[0]) for r in ranks}))
        why = "its connection broke" if not silent else f"not heard from for {LOST_S} s"
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        role = " (the controller)" if 0 in ranks else ""
        return PipelineError(who, RankLost(ranks, f"{who}{role} on host {hosts} went away: {why}"))

    # --- the controller ---------------------------------------------------------------------

    def lead(self, run: DistRun, options: _Options) -> LaunchResult:
        """Rank 0: replicate, watch every rank, end the run, collect the statistics."""
        world, frames = self.launch.world, options.frames
        deadline = None if options.timeout is None else time.monotonic() + options.timeout
        replicas = _replicate(self.launch.ctx, self.broadcast)
        try:
            run.start()
            if options.on_open is not None:
                options.on_open()
            reported = time.monotonic()
            while True:
                now = self.wait()
                if options.on_status is not None and now - reported >= STATUS_S:
                    reported = now
                    options.on_status({0: run.statistics(), **self.live})
                failure = self._failure(run, now)
                if failure is not None:
                    break
                total = _egressed(run.statistics()) + sum(e for e, _ in self.reports.values())
                done = sum(1 for _, completed in self.reports.values() if completed)
                if (
                    ((run.done.is_set() or not run.local) and done == world - 1)
                    or (frames is not None and total >= frames)
                    or (deadline is not None and now > deadline)
                ):
                    break
        finally:
            for subscription in replicas:
                subscription.dispose()
        if failure is not None:
            self._failed(failure)
        self.broadcast(("stop", failure))
        run.stop(0.45)
        until = time.monotonic() + JOIN_S
        while failure is None and set(self.finals) < set(self.outboxes) - self.broken:
            now = self.wait()
            if now > until:
                break
            failure = self._failure(run, now)
            if failure is not None:
                self._failed(failure)
                self.broadcast(("stop", failure))
        total = _egressed(run.statistics()) + sum(e for e, _ in self.finals.values())
        self.broadcast(("bye", total))
        if failure is not None:
            raise failure
        stats: dict[int, Mapping[str, StageStatistics]] = {0: dict(run.statistics())}
        for rank, (_, rank_stats) in sorted(self.finals.items()):
            stats[rank] = rank_stats
        return LaunchResult(world, MappingProxyType(stats), total)

    def _failed(self, failure: BaseException) -> None:
        """Say it now: torchrun may stop this process soon after a rank died."""
        self.launch.failure = failure
        _log.error("rank_failed", rank=self.rank, error=str(failure))

    def _failure(self, run: DistRun, now: float) -> PipelineError | None:
        """The first failure: this rank's run, a rank's report, or ranks gone away."""
        error = run.error
        if error is not None:
            if isinstance(error, PipelineError):
                return error
            return PipelineError(f"rank {self.rank}", error)
        if self.errors:
            return self.errors[min(self.errors)]
        return self.lost(now)

    # --- the other ranks --------------------------------------------------------------------

    def follow(self, run: DistRun) -> LaunchResult:
        """Rank r > 0: run, report, and stop when the controller says (or goes away).

        This rank's own failure is reported and raised here once the controller stopped the
        job; any other failure is raised as the controller (or the loss) tells it.
        """
        controller = self.outboxes[0]
        own: BaseException | None = None
        failure: BaseException | None = None
        run.start()
        while True:
            now = self.wait()
            stats = run.statistics()
            completed = (run.done.is_set() or not run.local) and run.error is None
            controller.send(("report", _egressed(stats), completed, _stats_payload(stats)))
            if own is None and run.error is not None:
                own = run.error
                controller.send(("error", self._as_reported(own)))
            if self.stop is not None:
                failure = own or self.stop[0]
                break
            lost = self.lost(now)
            if lost is not None:
                failure = own or lost
                break
        if failure is not None:
            self._failed(failure)
        run.stop(0.45)
        if failure is None:
            stats = run.statistics()
            controller.send(("final", _egressed(stats), _stats_payload(stats)))
            until = time.monotonic() + JOIN_S
            while self.bye is None and self.wait() < until:
                failure = self.lost(time.monotonic())
                if failure is not None:
                    self._failed(failure)
                    break
        if failure is not None:
            raise failure
        mine: dict[int, Mapping[str, StageStatistics]] = {self.rank: dict(run.statistics())}
        return LaunchResult(self.launch.world, MappingProxyType(mine), self.bye or 0)

    def _as_reported(self, error: BaseException) -> PipelineError:
        """This rank's failure as the others raise it: naming this rank (or the lost one)."""
        if isinstance(error, PipelineError) and isinstance(error.cause, RankLost):
            return error
        return PipelineError(f"rank {self.rank}", RuntimeError(_describe(error)))

    def close(self) -> None:
        """Send what is queued, then close every channel (the peers take the close marks)."""
        self._closed.set()
        for outbox in self.outboxes.values():
            outbox.close(0.5)
        for inbox in self.inboxes.values():
            inbox.close()
        for thread in self._threads:
            thread.join(0.5)


def _replicate(ctx: Context, send: Callable[[tuple[Any, ...]], None]) -> list[Any]:
    """Send every doc write and generation change to every rank, as it happens."""
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
    return subscriptions


# --- statistics over the wire -----------------------------------------------------------------


def _stats_payload(stats: Mapping[str, StageStatistics]) -> dict[str, dict[str, Any]]:
    """Statistics as plain dicts (a MappingProxyType does not pickle)."""
    return {
        name: {**stage.__dict__, "dropped": dict(stage.dropped)} for name, stage in stats.items()
    }


def _stats_from(payload: Mapping[str, Mapping[str, Any]]) -> dict[str, StageStatistics]:
    return {
        name: StageStatistics(**{**fields, "dropped": MappingProxyType(dict(fields["dropped"]))})
        for name, fields in payload.items()
    }


def _egressed(stats: Mapping[str, StageStatistics]) -> int:
    """Items the sinks among ``stats`` egressed."""
    return sum(s.items_out for s in stats.values() if s.kind == "stream")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, PipelineError):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


class _Unlisten:
    """Disposes of a generations listener (as a subscription is disposed of)."""

    def __init__(self, listeners: list[Any], listener: Any) -> None:
        self._listeners, self._listener = listeners, listener

    def dispose(self) -> None:
        if self._listener in self._listeners:
            self._listeners.remove(self._listener)


for _name in ("DistChannel", "RankLost", "TorchrunEnv"):
    globals()[_name].__module__ = __name__
del _name
