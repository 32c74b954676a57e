"""One run of a plan: the wiring both run modes share.

:class:`Run` builds the Rx graph of a :class:`~rxstream.runtime._plan.Plan` once: a stage
shell per stage, a :class:`~rxstream.runtime._port.Port` in front of every input, the rank
boundaries its :class:`~rxstream.runtime._crossings.BoundaryFactory` makes, the walk-driving
and chunked connections, a collector at every end; and it keeps the outcome (the first
error, completion) and the statistics. How the graph runs is a subclass's:
:class:`~rxstream.runtime._threaded.ThreadedRun` (a thread and inbox per stage, a thread per
source) and :class:`~rxstream.runtime._driven.DrivenRun` (one virtual clock, direct hops, a
session of drives). docs/architecture.md ("Runs") says who calls what.
"""

from __future__ import annotations

import secrets
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, cast

from reactivex import Observable, abc, operators
from reactivex.disposable import CompositeDisposable

from rxstream._exceptions import PipelineError
from rxstream._kernel._generations import Generations
from rxstream._kernel._options import chunks_of, reads_of
from rxstream._kernel._shell import StageShell
from rxstream._kernel._stats import StageStatistics
from rxstream._util import library_logger
from rxstream.item import PipelineItem, _base, _stamped
from rxstream.operators._chunked import chunk_operator
from rxstream.operators._core import attach
from rxstream.operators._input import InputFeed
from rxstream.operators._source import SourcePuller
from rxstream.operators._walks import producer_operator
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._crossings import BoundaryFactory, RankBoundary
from rxstream.runtime._fuse import fused_chain
from rxstream.runtime._plan import Plan
from rxstream.runtime._port import Port
from rxstream.runtime._thread import _ClockScheduler
from rxstream.stage import Node, cuda_path
from rxstream.timing._gpu import GpuClock, nvtx_from_env
from rxstream.topology._edges import (
    WALKS,
    consumer_walk_of,
    partition_name,
    walks_of,
)
from rxstream.typing import ItemStream

_End = tuple[Callable[[PipelineItem], None], Callable[[Exception], None], Callable[[], None]]
"""A pipeline end's ``on_next``, ``on_error`` and ``on_completed``."""

__all__ = ["DoneEvent", "Run", "new_run_id"]

_log = library_logger("rxstream")

"""The stage kinds whose calls a run's `GpuClock` times and names in NVTX (each call is one
item's: a pipe's, fused or not, and a tap's)."""


def _real_cuda_api() -> Any:
    """The real CUDA calls when this process has torch loaded and a GPU; else ``None``."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    from rxstream.ipc._cudaapi import TorchCuda

    return TorchCuda()


def new_run_id() -> str:
    """A fresh run id: 12 hex digits (48 random bits), short enough to read in a log line."""
    return secrets.token_hex(6)


class DoneEvent(threading.Event):
    """A run's ``done``: once set, it calls each callback given to :meth:`on_done` once, on the
    thread that set it (one given after: at once, on the caller's). ``Run`` and the launch's
    rank run (``ranks/_launch.py``) both end on it; a rank's stop sets it from outside."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks_lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) once this is set."""
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()


class Run(ABC):
    """The wired graph of one run: shells, ports, boundaries, ends; completion and the first
    error. A subclass runs it (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        *,
        bridge: AsyncBridge,
        generations: Generations,
        collect: str | None = None,
        timing: bool = True,
        rank: int | None = None,
        boundaries: BoundaryFactory | None = None,
        replica: bool = False,
        cuda_api: Any = None,
        nvtx: bool | None = None,
    ) -> None:
        """``cuda_api``: the CUDA calls that time the stages placed on a CUDA device (``None``:
        the real ones when this process has torch and a GPU, else no GPU timing); ``nvtx``:
        an NVTX range per stage call (``None``: ``RXSTREAM_NVTX``)."""
        self.plan = plan
        self.rank = rank
        """The rank this process runs (``None``: every rank, in this process)."""
        self.replica = replica
        """Whether ``generations`` replicate another rank's (this rank's boundary readers then
        hold an item of a newer generation until the replicas reach it)."""
        self.local = tuple(n for n in plan.nodes if rank is None or plan.ranks[n] == rank)
        self._make_boundary = boundaries
        """Makes this run's rank boundaries (``None``: it has none)."""
        self.boundaries: dict[str, RankBoundary] = {}
        self.generations = generations
        self.timing = timing
        self.error: BaseException | None = None
        self.done = DoneEvent()
        self._bridge = bridge
        self.collect = collect
        """What the ends keep: ``"items"``, ``"payloads"`` or nothing (``None``); a driven
        session may change it between drives (not from ``None``)."""
        self._lock = threading.Lock()
        self._halted = False
        self._completed = 0
        self.tails = tuple(t for t in plan.tails if t in self.local)
        self._ends = len(self.tails)  # local tails, plus one per boundary writer (added later)
        self.outputs: dict[Node, list[Any]] = {tail: [] for tail in self.tails}
        """What each end received: items (``collect="items"``) or payloads (``"payloads"``)."""
        self.shells: dict[Node, StageShell] = {}
        self._run_id = new_run_id()
        self._pullers: dict[Node, SourcePuller] = {}
        self._observers: dict[Node, abc.ObserverBase[PipelineItem]] = {}
        self._subscriptions = CompositeDisposable()
        self._kinds = {plan.names[node]: node.stage.declared for node in plan.nodes}
        api = cuda_api if cuda_api is not None else _real_cuda_api()
        self.gpu_clock: GpuClock | None = None
        """The stages' CUDA event timing and NVTX ranges (``None``: no CUDA api here)."""
        if api is not None and timing:
            self.gpu_clock = GpuClock(api, nvtx=nvtx_from_env() if nvtx is None else nvtx)
        for node in self.local:
            self._make_shell(node)
        self._wire()

    @property
    def run_id(self) -> str:
        """This run's id, on every ``[timing:…]`` and ``[photon:…]`` line it logs.

        Fresh for each run; a launcher sets every rank's run to one id (before it starts), so
        a multi-rank launch is one run in the log.
        """
        return self._run_id

    @run_id.setter
    def run_id(self, value: str) -> None:
        self._run_id = value
        for shell in self.shells.values():
            shell.run_id = value

    # --- what a run mode decides ----------------------------------------------------------

    @abstractmethod
    def _scheduler(self) -> _ClockScheduler:
        """The scheduler a new stage shell starts with."""

    @abstractmethod
    def _port(self, node: Node) -> Port:
        """The hop into ``node`` (a stage with inputs)."""

    def _chains(self) -> Mapping[Node, list[Node]]:
        """The chains of stages to fuse into one operator, by their last node (none here)."""
        return {}

    def _chain_input(self, streams: dict[Node, ItemStream], head: Node) -> ItemStream:
        """What a fused chain whose first stage is ``head`` runs on: its input's stream."""
        return streams[head.inputs[0]]

    def _fused_into(self, node: Node) -> str:
        """The name of the stage whose thread runs ``node`` when it is fused there, else ``""``."""
        return ""

    def _crosses(self, upstream: Node, node: Node) -> bool:
        """Whether the edge ``upstream`` → ``node`` crosses a rank boundary in this run."""
        return self.plan.ranks[upstream] != self.plan.ranks[node]

    def _depth(self, node: Node) -> int:
        """How many items wait in ``node``'s inbox (none here)."""
        return 0

    @abstractmethod
    def halt(self) -> None:
        """Stop the sources and wake whatever waits; returns at once (any thread)."""

    # --- building -------------------------------------------------------------------------

    def _make_shell(self, node: Node) -> StageShell:
        stage = node.stage
        name = self.plan.name_of(node)
        reset = getattr(stage.target, "reset", None)
        shell = StageShell(
            name,
            stage.kind,
            self._scheduler(),
            stage.on_error,
            self.fail,
            self._bridge.call,
            self.generations,
            reset if callable(reset) else None,
            self.timing,
        )
        shell.run_id = self._run_id
        shell.stage_kinds = self._kinds
        if self.gpu_clock is not None:
            shell.gpu_clock = self.gpu_clock
            if stage.declared.timed:
                shell.gpu = self.gpu_clock.timer(name, stage.device)
        self.shells[node] = shell
        return shell

    def _wire(self) -> None:
        streams: dict[Node, ItemStream] = {}
        chains = self._chains()
        fused = {member for chain in chains.values() for member in chain[:-1]}
        # an input no stage takes, only sources read: its first reader counts its refusals
        counted = {
            node.stage.source
            for node in self.plan.nodes
            if node.stage.is_source and isinstance(node.stage.source, InputFeed)
        }
        for node in self.local:
            shell = self.shells[node]
            if node in fused:  # built with the end of its chain
                continue
            if node.stage.is_source:
                reads = tuple(cast(InputFeed, read.source) for read in reads_of(node.stage))
                counts = tuple(feed for feed in reads if feed not in counted)
                counted.update(counts)
                unbatched = any(
                    down.stage.declared.shape == "1:N" and node in down.inputs
                    for down in self.plan.nodes
                )  # a batch sent as one on purpose: no hint
                self._pullers[node] = SourcePuller(
                    node.stage.source, shell, reads, hint=not unbatched, counts=counts
                )
                stream = self._chunked(self._source_stream(node), None, node)
            elif node in chains:
                chain = chains[node]
                for member in chain:
                    self.shells[member].target_fn = member.stage.target
                stream = fused_chain(  # it admits into each of its stages itself
                    self._chain_input(streams, chain[0]),
                    [self.shells[member] for member in chain],
                    self.generations,
                )
            else:
                port = self._port(node)
                ports = [
                    self._chunked(port(self._input(streams, up, node)), up, node)
                    for up in node.inputs
                ]
                stream = node.stage.build(shell)(ports)
            if self._consumers(node) > 1:
                stream = stream.pipe(operators.share())
            streams[node] = stream
        self._write_boundaries(streams)
        for tail in self.tails:
            on_next, on_error, on_completed = self._collector(tail)
            self._subscriptions.add(attach(streams[tail], on_next, on_error, on_completed))

    # --- rank boundaries ----------------------------------------------------------------------

    def _consumers(self, node: Node) -> int:
        """Subscribers of ``node``'s stream here: local consumers and boundary writers."""
        return self.plan.consumers.get(node, 0)

    def _boundary(self, upstream: Node, node: Node) -> RankBoundary:
        name = self.plan.edge_name(upstream, node)
        boundary = self.boundaries.get(name)
        if boundary is None:
            if self._make_boundary is None:
                raise RuntimeError(f"run has no boundary factory for edge {name!r}")
            replicas = self.generations if self.replica else None
            boundary = self._make_boundary(
                name,
                timing=self.timing,
                replicas=replicas,
                cuda=cuda_path(upstream.stage, node.stage),
            )
            self.boundaries[name] = boundary
        return boundary

    def _input(self, streams: dict[Node, ItemStream], upstream: Node, node: Node) -> ItemStream:
        """``node``'s input from ``upstream``: its stream, or the reader of their boundary."""
        if not self._crosses(upstream, node):
            return self._produced(streams[upstream], upstream, node)
        counters = self.shells[node].counters
        return self._boundary(upstream, node).read(lambda: self._halted, self.fail, counters)

    def _write_boundaries(self, streams: dict[Node, ItemStream]) -> None:
        """A writer for every boundary whose upstream runs here; each is an end to complete."""
        for upstream, node in self.plan.boundaries:
            if upstream not in streams or not self._crosses(upstream, node):
                continue
            boundary = self._boundary(upstream, node)
            self._ends += 1
            self._subscriptions.add(
                boundary.write(
                    self._gpu_stamped(self._produced(streams[upstream], upstream, node)),
                    self.shells[upstream].counters,
                    self.plan.name_of(upstream),
                    self.fail,
                    self._end_completed,
                    lost=self.shells[node].counters if node in self.shells else None,
                    on_closed=self.halt,  # the reading rank is going: stop making its items
                    sole=self._consumers(upstream) == 1,
                )
            )

    def _gpu_stamped(self, stream: ItemStream) -> ItemStream:
        """``stream`` with each item's ``<stage>.gpu`` stamps (``GpuClock.stamps``) when it
        leaves for another process's rank from one that has CUDA stages; else ``stream``
        (ranks in one process share the clock: the sink resolves them)."""
        clock = self.gpu_clock
        if clock is None or not clock.timers or self.rank is None:
            return stream

        def stamped(item: PipelineItem) -> PipelineItem:
            stamps = clock.stamps(item.metadata.timeline)
            return _stamped(item, item.payload, stamps) if stamps else item

        return stream.pipe(operators.map(stamped))

    # --- connections: walk-driving edges and chunk policies ---------------------------------

    def _produced(self, stream: ItemStream, upstream: Node, node: Node) -> ItemStream:
        """What ``upstream`` sends ``node``: into a producer-triggered walks stage, each item
        tagged with the walk its ``consumer_walk`` picks (on the producer's side)."""
        consumer_walk = consumer_walk_of(node.stage)
        if consumer_walk is None:
            return stream
        plan = self.plan
        rank = plan.ranks[upstream]
        several = any(n.stage.kind == WALKS and plan.ranks[n] == rank for n in plan.nodes)
        producer_walk = "" if several else f"{partition_name(rank)}.walk"
        return producer_operator(
            consumer_walk,
            walks_of(node.stage),
            plan.name_of(node),
            producer_walk,
            self.shells[upstream],
        )(stream)

    def _chunked(self, stream: ItemStream, upstream: Node | None, node: Node) -> ItemStream:
        """``node``'s input from ``upstream`` (``None``: an input's client stream) through a
        stream buffer when ``node`` declares ``chunks=``; on ``node``'s thread."""
        chunks = chunks_of(node.stage)
        if chunks is None:
            return stream
        plan = self.plan
        edge = plan.name_of(node) if upstream is None else plan.edge_name(upstream, node)
        tagged = consumer_walk_of(node.stage) is not None
        return chunk_operator(chunks, edge, self.shells[node], tagged=tagged)(stream)

    def _end_completed(self) -> None:
        with self._lock:
            self._completed += 1
            finished = self._completed == self._ends
        if finished:
            self.done.set()

    def _source_stream(self, node: Node) -> ItemStream:
        def subscribe(
            observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            self._observers[node] = observer
            return CompositeDisposable()

        return Observable(subscribe)

    def _collector(self, tail: Node) -> _End:
        """The end of ``tail``'s stream: its ``on_next``, ``on_error``, ``on_completed``.

        Reactivex's ``Observer`` contract (nothing after the first error or completion) kept
        in one flag, without that class's two method calls an item (the run owns both ends).
        """
        outputs = self.outputs
        collect = self.collect is not None
        generations = self.generations
        counters = self.shells[tail].counters
        drop = counters.drop
        fail = self.fail
        completed = self._end_completed
        stopped = False

        sink = tail.stage.is_sink  # a sink has egressed the item already: it is delivered

        def on_next(item: PipelineItem) -> None:
            if stopped:
                return
            # the end is a hop too: Generations.is_stale's rule, inline (a call an item fewer)
            if not sink and _base(item).prompt_generation < generations.drop:
                counters.items_out -= 1  # the tail's last hop: what it drops there never left
                drop("stale")
            elif collect:  # keep no item alive that nobody asked for
                outputs[tail].append(item.payload if self.collect == "payloads" else item)

        def on_error(error: Exception) -> None:
            nonlocal stopped
            if not stopped:
                stopped = True
                fail(error)

        def on_completed() -> None:
            nonlocal stopped
            if not stopped:
                stopped = True
                completed()

        return on_next, on_error, on_completed

    # --- outcome ----------------------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """Record the first error, end the run and halt everything (from any thread)."""
        with self._lock:
            first = self.error is None
            if first:
                self.error = error
        if first:
            if isinstance(error, KeyboardInterrupt):  # Ctrl-C in a drive: a stop, not a fault
                _log.info("pipeline_interrupted")
            elif not isinstance(error, PipelineError):
                _log.error("pipeline_failed", error=repr(error))
            self.halt()
            self.done.set()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) once the run has completed or failed."""
        self.done.on_done(callback)

    def raise_error(self) -> None:
        """Raise the run's error, if it had one."""
        if self.error is not None:
            raise self.error

    # --- statistics -------------------------------------------------------------------------

    def statistics(self) -> Mapping[str, StageStatistics]:
        """Each stage's statistics now, by name, in plan order."""
        stats = {}
        for node in self.local:
            shell = self.shells[node]
            owner = self._fused_into(node)  # a fused stage has no inbox
            capacity = 0 if node.stage.is_source or owner else node.stage.inbox.capacity
            snapshot = shell.counters.snapshot(self._depth(node), capacity)
            stats[shell.name] = replace(snapshot, fused_into=owner) if owner else snapshot
        return stats
