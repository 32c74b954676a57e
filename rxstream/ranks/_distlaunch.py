"""One rank's side of a torchrun launch: build, meet the others, wire the boundaries, run.

See :mod:`rxstream.distributed` for the whole. Setting up takes collectives of the job's gloo
group, in the same order on every rank: rank 0's build outcome, docs and options (a
broadcast), every rank's host, pid and build outcome (an all-gather), the clock offsets of the
other hosts (ping-pongs, then a broadcast), a group per cross-host boundary, and the
same-host rings (their descriptors gathered, then taken over Unix sockets).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.reduction
import os
import secrets
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from rxstream._exceptions import ArgumentError, PipelineError, PipelineStateError
from rxstream.context import Context
from rxstream.doc._snapshot import thaw
from rxstream.ipc import RingHandle, ShmRing
from rxstream.pipeline import Pipeline
from rxstream.ranks._app import describe, load_app
from rxstream.ranks._common import LaunchOptions, LaunchResult
from rxstream.ranks._distboundary import DistChannel, DistRun
from rxstream.ranks._distcontrol import Control
from rxstream.ranks._egress import Forward
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._plan import Plan
from rxstream.runtime._run import new_run_id
from rxstream.timing import configure_logging

if TYPE_CHECKING:
    from rxstream.ranks._torchrun import TorchrunEnv

__all__ = [
    "BACKEND_ENV",
    "CROSS_HOST_ENV",
    "SETUP_S",
    "Launch",
    "Peer",
    "cross_edges",
    "estimate_offset",
    "exit_now",
    "terminate_as_interrupt",
    "use_nccl",
]

CROSS_HOST_ENV = "RXSTREAM_CROSS_HOST"
"""Forces boundaries onto the cross-host transport: ``all``, or a comma list of edge names."""
BACKEND_ENV = "RXSTREAM_DIST_BACKEND"
"""How CUDA tensors cross hosts: ``auto`` (default: NCCL when every rank has it), ``gloo``
(through host memory), ``nccl`` (required)."""
SETUP_S = 300.0
"""The timeout of the collectives that set a launch up (ranks wait for each other's build)."""
PINGS = 8
"""Round trips that measure another host's clock; the shortest one counts."""

_BACKENDS = ("auto", "gloo", "nccl")


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


def exit_now(status: int) -> None:
    """End the process at once (an ``atexit`` hook): flushed, without destructors."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


@contextlib.contextmanager
def terminate_as_interrupt(known: Callable[[], BaseException | None]) -> Iterator[None]:
    """SIGTERM (torchrun stopping its workers once one failed) raises, so cleanup runs.

    ``known()`` gives the job's failure as this rank knows it (it may wait a little for the
    controller's word); that is raised, else a KeyboardInterrupt.
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


def host_id() -> str:
    """This host: its name and boot id (two containers of one name are not one host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


@dataclass(frozen=True)
class Peer:
    """What every rank tells the others as the launch is set up."""

    host: str
    pid: int
    error: str | None
    nccl: bool


class Launch:
    """One rank's side of a torchrun launch: set up, run, end, tear down."""

    def __init__(self, env: TorchrunEnv, entry: str, options: LaunchOptions) -> None:
        import torch.distributed as dist

        self.env = env
        self.options = options
        self.failure: BaseException | None = None
        """How the job failed, once this rank knows (SIGTERM then raises it)."""
        self.plane: Control | None = None
        """The control plane, once it is up."""
        self.rank = env.rank
        self.world = env.world
        self.dist = dist
        self.control = dist.new_group(backend="gloo")  # doc writes, reports, heartbeats
        self.egress = Forward(None, options.frames)
        """Every rank's transport: passes at most ``frames`` items, then halts the run."""
        self.ctx: Context
        self.pipeline: Pipeline
        self._build(entry)
        self.plan: Plan = self.pipeline.plan
        self.hosts = [peer.host for peer in self.peers]
        self.cross = cross_edges(self.plan, self.hosts, self.environ[0])
        self.nccl = use_nccl(self.peers, self.environ[1])
        if options.log is not None and has_sink(self.plan, self.rank):
            configure_logging(options.log)
        self.offsets = self._clock_offsets()

    def verdict(self, wait: float) -> BaseException | None:
        """The job's failure as this rank knows it, waiting up to ``wait`` s for the word.

        For a SIGTERM from torchrun, which stops the other workers once one has failed: the
        controller's ``stop`` may be on its way.
        """
        deadline = time.monotonic() + wait
        while self.failure is None:
            plane = self.plane
            if plane is not None and plane.stop is not None and plane.stop[0] is not None:
                plane.failed(plane.stop[0])
            elif time.monotonic() >= deadline:
                break
            else:
                time.sleep(0.01)
        return self.failure

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
                # AppContext writes --set as the app makes the doc
                from rxstream.ranks._app import AppContext

                ctx = AppContext(
                    settings=options.settings,
                    config=options.config,
                    rank=0,
                    world=world,
                    transport=self.egress,
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
            box: list[Any] = [
                None if failure is None else describe(failure),
                docs,
                environ,
                new_run_id(),  # the run's id on every rank
            ]
            dist.broadcast_object_list(box, src=0)
            if failure is not None:
                raise failure
        else:
            box = [None, None, None, None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is not None:
                raise PipelineError("rank 0", RuntimeError(box[0]))
            try:
                self.ctx = Context(
                    rank=self.rank, world=world, replicas=box[1], transport=self.egress
                )
                self.pipeline = load_app(entry)(self.ctx)
            except BaseException as exc:
                failure = exc
        self.environ: tuple[str, str] = box[2]
        self.run_id: str = box[3]
        """The run's id, rank 0's: the ``run`` of every rank's timing lines."""
        self.peers = self._gather_peers(failure)

    def _gather_peers(self, failure: BaseException | None) -> list[Peer]:
        """Every rank's host, pid and build outcome; raises for a build that failed."""
        import torch
        import torch.distributed as dist

        nccl = bool(torch.cuda.is_available() and dist.is_nccl_available())
        error = None if failure is None else describe(failure)
        peers: list[Any] = [None] * self.world
        dist.all_gather_object(peers, Peer(host_id(), os.getpid(), error, nccl))
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
        control: Control | None = None
        run: DistRun | None = None
        try:
            rings, owned, releases = share_rings(self)
            channels = self._channels()
            control = self.plane = Control(self)
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
                busy_limit_s=ctx.busy_limit_s,
                nvtx=ctx.nvtx,
            )
            run.run_id = self.run_id
            run.on_done(control.changed.set)  # a failing boundary wakes the watch at once
            self.egress.gate.on_full = run.halt  # this rank's sinks egressed `frames`: stop
            ended = control.lead(run, self.options) if self.rank == 0 else control.follow(run)
            return replace(ended, run_id=self.run_id)
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


def has_sink(plan: Plan, rank: int) -> bool:
    return any(node.stage.is_sink and plan.ranks[node] == rank for node in plan.nodes)


def cross_edges(plan: Plan, hosts: Sequence[str], forced: str) -> frozenset[str]:
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
            raise ArgumentError(
                f"{CROSS_HOST_ENV} must be 'all' or boundaries of the app (its boundaries: "
                f"{known}), got {name!r}"
            )
        cross.add(name)
    return frozenset(cross)


def use_nccl(peers: Sequence[Peer], choice: str) -> bool:
    """Whether cross-host boundaries get an NCCL group for CUDA tensors."""
    choice = choice.strip() or "auto"
    if choice not in _BACKENDS:
        raise ArgumentError(f"{BACKEND_ENV} must be one of {', '.join(_BACKENDS)}, got {choice!r}")
    every = all(peer.nccl for peer in peers)
    if choice == "nccl" and not every:
        lacking = [rank for rank, peer in enumerate(peers) if not peer.nccl]
        raise ArgumentError(
            f"{BACKEND_ENV}=nccl needs CUDA and NCCL on every rank; ranks {lacking} have not"
        )
    return choice == "nccl" or (choice == "auto" and every)


# --- same-host rings: file descriptors over a Unix socket ------------------------------------


def share_rings(
    launch: Launch,
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
            spec = launch.pipeline.context.ring_spec
            ring = ShmRing.create(slots=spec.slots, slot_bytes=spec.slot_bytes)
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
        dist.barrier()  # every same-host ring is attached: its name can go now
        for ring, _, _ in mine.values():
            ring.unlink()
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
