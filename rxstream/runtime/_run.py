"""One run of a plan: wire each stage's operator behind its scheduler, then run it.

Two modes over the same operators. ``threads``: every stage gets a
:class:`~rxstream.runtime._thread.StageThread` (its thread and bounded inbox) and every source
a thread that pulls and pushes. ``drive``: no threads; one
:class:`~rxstream.runtime._thread.VirtualClock` is every stage's scheduler, sources are pulled
by actions on it, and the hop between stages is a direct call; a pipeline keeps its driven run
across drives, one session (:meth:`Run.drive`), until :meth:`Run.close`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from reactivex import Observable, abc, operators
from reactivex.disposable import CompositeDisposable

from rxstream._exceptions import PipelineError
from rxstream._kernel._generations import Generations
from rxstream._kernel._shell import StageShell
from rxstream._kernel._stats import StageStatistics
from rxstream.item import PipelineItem, _base
from rxstream.operators._chunked import chunk_operator
from rxstream.operators._core import attach
from rxstream.operators._input import InputFeed
from rxstream.operators._source import SKIPPED, SourcePuller
from rxstream.operators._walks import producer_operator
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._crossings import BoundaryFactory, RankBoundary
from rxstream.runtime._fuse import fusable_chains, fused_chain
from rxstream.runtime._plan import Plan
from rxstream.runtime._thread import (
    StageThread,
    VirtualClock,
    _ClockScheduler,
    charge_stalls_to,
)
from rxstream.stage import Node, cuda_path
from rxstream.topology._edges import (
    WALKS,
    chunks_of,
    consumer_walk_of,
    partition_name,
    walks_of,
)
from rxstream.typing import ItemStream

__all__ = ["Run"]

_log = structlog.get_logger("rxstream")


class Run:
    """The live state of one run: shells, threads, sources, completion and the first error."""

    def __init__(
        self,
        plan: Plan,
        *,
        mode: str,
        bridge: AsyncBridge,
        generations: Generations,
        collect: str | None = None,
        timing: bool = True,
        rank: int | None = None,
        boundaries: BoundaryFactory | None = None,
        replica: bool = False,
    ) -> None:
        self.plan = plan
        self.rank = rank
        self.replica = replica
        """Whether ``generations`` replicate another rank's (this rank's boundary readers then
        hold an item of a newer generation until the replicas reach it)."""
        """The rank this process runs (``None``: every rank, in this process)."""
        self.local = tuple(n for n in plan.nodes if rank is None or plan.ranks[n] == rank)
        self._make_boundary = boundaries
        """Makes this run's rank boundaries (``None``: it has none, or runs on virtual time)."""
        self.boundaries: dict[str, RankBoundary] = {}
        self.generations = generations
        self.timing = timing
        self.mode = mode
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._bridge = bridge
        self.collect = collect
        """What the ends keep: ``"items"``, ``"payloads"`` or nothing (``None``); a driven
        session may change it between drives (not from ``None``)."""
        self._lock = threading.Lock()
        self._lifecycle = threading.RLock()
        """Held by :meth:`start` while it starts threads: :meth:`stop` joins only after."""
        self._halted = False
        self._completed = 0
        self._done_callbacks: list[Callable[[], None]] = []
        self.tails = tuple(t for t in plan.tails if t in self.local)
        self._ends = len(self.tails)  # local tails, plus one per boundary writer (added later)
        self.outputs: dict[Node, list[Any]] = {tail: [] for tail in self.tails}
        """What each end received: items (``collect="items"``) or payloads (``"payloads"``)."""
        self.clock = VirtualClock() if mode == "drive" else None
        self.shells: dict[Node, StageShell] = {}
        self.threads: dict[Node, StageThread] = {}
        self._pullers: dict[Node, SourcePuller] = {}
        self._observers: dict[Node, abc.ObserverBase[PipelineItem]] = {}
        self._source_threads: dict[Node, threading.Thread] = {}
        self._subscriptions = CompositeDisposable()
        # a driven session: its sources once opened, those that ended, the last pull's time
        self._sources: list[tuple[SourcePuller, abc.ObserverBase[PipelineItem]]] | None = None
        self._ended: set[SourcePuller] = set()
        self._last_pull: float | None = None
        self._given = 0
        self.closed = False
        """Whether a driven session was closed (a later drive starts a new one)."""
        for node in self.local:
            self._make_shell(node)
        self._wire()

    # --- building -------------------------------------------------------------------------

    def _make_shell(self, node: Node) -> None:
        stage = node.stage
        name = self.plan.name_of(node)
        scheduler: _ClockScheduler = self.clock if self.clock is not None else _Placeholder()
        reset = getattr(stage.target, "reset", None)
        shell = StageShell(
            name,
            stage.kind,
            scheduler,
            stage.on_error,
            self.fail,
            self._bridge.call,
            self.generations,
            reset if callable(reset) else None,
            self.timing,
        )
        if self.clock is None and not stage.is_source:
            thread = StageThread(name, stage.inbox, shell.counters, shell.crashed)
            shell.scheduler = thread
            self.threads[node] = thread
        self.shells[node] = shell

    def _wire(self) -> None:
        streams: dict[Node, ItemStream] = {}
        chains = fusable_chains(self.plan) if self.clock is not None else {}
        fused = {member for chain in chains.values() for member in chain[:-1]}
        for node in self.local:
            shell = self.shells[node]
            if node in fused:  # built with the end of its chain
                continue
            if node.stage.is_source:
                self._pullers[node] = SourcePuller(node.stage.source, shell)
                stream = self._chunked(self._source_stream(node), None, node)
            elif node in chains:
                chain = chains[node]
                for member in chain:
                    self.shells[member].target_fn = member.stage.target
                head = chain[0]
                stream = fused_chain(
                    self._port(streams[head.inputs[0]], head, admit=False),
                    [self.shells[member] for member in chain],
                    self.generations,
                )
            else:
                ports = [
                    self._chunked(self._port(self._input(streams, up, node), node), up, node)
                    for up in node.inputs
                ]
                stream = node.stage.build(shell)(ports)
            if self._consumers(node) > 1:
                stream = stream.pipe(operators.share())
            streams[node] = stream
        self._write_boundaries(streams)
        for tail in self.tails:
            collector = self._collector(tail)
            self._subscriptions.add(
                attach(streams[tail], collector.on_next, collector.on_error, collector.on_completed)
            )

    # --- rank boundaries ----------------------------------------------------------------------

    def _crosses(self, upstream: Node, node: Node) -> bool:
        return self.clock is None and self.plan.ranks[upstream] != self.plan.ranks[node]

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
            if upstream not in streams or self.clock is not None:
                continue
            boundary = self._boundary(upstream, node)
            self._ends += 1
            self._subscriptions.add(
                boundary.write(
                    self._produced(streams[upstream], upstream, node),
                    self.shells[upstream].counters,
                    self.plan.name_of(upstream),
                    self.fail,
                    self._end_completed,
                    lost=self.shells[node].counters if node in self.shells else None,
                    on_closed=self.halt,  # the reading rank is going: stop making its items
                )
            )

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
            self._finish()

    def _source_stream(self, node: Node) -> ItemStream:
        def subscribe(
            observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            self._observers[node] = observer
            return CompositeDisposable()

        return Observable(subscribe)

    def _port(self, upstream: ItemStream, node: Node, admit: bool = True) -> ItemStream:
        """The hop into ``node``: through its inbox onto its thread, or direct under drive.

        On arrival (on the stage's thread) an item of a stale prompt generation is dropped
        (reason ``stale``), and the first item of a newer flush generation resets the stage.
        """
        thread = self.threads.get(node)
        if thread is None and not admit:  # a fused chain checks each of its stages itself
            return upstream
        shell = self.shells[node]

        def subscribe(
            observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            on_next = observer.on_next
            checks = shell.admission().admit

            def admit(item: PipelineItem) -> None:
                if checks(_base(item)):
                    on_next(item)

            if thread is None:
                return attach(upstream, admit, observer.on_error, observer.on_completed, scheduler)
            put, put_control = thread.put, thread.put_control
            return attach(
                upstream,
                lambda item: put(admit, item),
                lambda error: put_control(observer.on_error, error),
                lambda: put_control(_complete, observer),
                scheduler,
            )

        return Observable(subscribe)

    def _collector(self, tail: Node) -> abc.ObserverBase[PipelineItem]:
        from reactivex import Observer

        outputs = self.outputs
        collect = self.collect is not None
        gens = self.generations
        counters = self.shells[tail].counters
        drop = counters.drop

        sink = tail.stage.is_sink  # a sink has egressed the item already: it is delivered

        def on_next(item: PipelineItem) -> None:
            if not sink and gens.is_stale(_base(item)):  # the end is a hop too
                counters.items_out -= 1  # the tail's last hop: what it drops there never left
                drop("stale")
            elif collect:  # keep no item alive that nobody asked for
                outputs[tail].append(item.payload if self.collect == "payloads" else item)

        return Observer(on_next, self.fail, self._end_completed)

    # --- outcome ----------------------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """Record the first error, end the run and halt everything (from any thread)."""
        with self._lock:
            first = self.error is None
            if first:
                self.error = error
        if first:
            if not isinstance(error, PipelineError):
                _log.error("pipeline_failed", error=repr(error))
            self.halt()
            self._finish()

    def _finish(self) -> None:
        self.done.set()
        with self._lock:
            callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            callback()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) once the run has completed or failed."""
        with self._lock:
            if not self.done.is_set():
                self._done_callbacks.append(callback)
                return
        callback()

    def raise_error(self) -> None:
        """Raise the run's error, if it had one."""
        if self.error is not None:
            raise self.error

    # --- threads mode -----------------------------------------------------------------------

    def start(self) -> None:
        """Start every stage thread, then every source thread; nothing once halted.

        Safe against a concurrent :meth:`stop`: that one halts at once and joins once the
        threads started here are started (a thread is never joined before its start).
        """
        with self._lifecycle:
            if self._halted:  # stopped before it started: nothing to run
                return
            for thread in self.threads.values():
                thread.start()
            if self.error is not None:  # wiring failed: nothing to pump
                return
            if not self._ends:  # no stage runs here (a rank the app places nothing on): done
                self._finish()
            self._start_sources()

    def _start_sources(self) -> None:
        for node, puller in self._pullers.items():
            if self._halted:
                return
            source = threading.Thread(
                target=self._pump,
                args=(puller, self._observers[node]),
                name=f"rxstream:{self.plan.name_of(node)}",
                daemon=True,
            )
            self._source_threads[node] = source
            source.start()

    def _pump(self, puller: SourcePuller, observer: abc.ObserverBase[PipelineItem]) -> None:
        counters = puller.counters
        charge_stalls_to(counters)
        perf = time.perf_counter
        try:
            puller.open()
            while not self._halted:
                started = perf()
                item = puller.pull()
                waited = puller.take_waited()
                counters.wait_s += waited
                counters.work_s += perf() - started - waited
                if item is None:
                    observer.on_completed()
                    return
                if item is not SKIPPED:
                    observer.on_next(item)
        except BaseException as exc:
            self.fail(exc)
        finally:
            puller.close()

    def halt(self) -> None:
        """Stop sources and wake every blocked thread; returns at once (any thread)."""
        self._halted = True
        for puller in self._pullers.values():
            puller.interrupt()
        for boundary in self.boundaries.values():
            boundary.ring.close()
        for thread in self.threads.values():
            thread.close()
        self._bridge.close()

    def stop(self, timeout: float) -> list[str]:
        """Halt and join every thread within ``timeout`` seconds; the names still running.

        Safe from any thread, also while :meth:`start` is under way on another.
        """
        self.halt()
        deadline = time.monotonic() + timeout
        with self._lifecycle:  # a concurrent start() has started all it will start
            pass
        stuck = []
        for source in self._source_threads.values():
            source.join(max(0.0, deadline - time.monotonic()))
            if source.is_alive():
                stuck.append(source.name)
        for thread in self.threads.values():
            if not thread.join(max(0.0, deadline - time.monotonic())):
                stuck.append(thread.name)
        for name, boundary in self.boundaries.items():
            if not boundary.close(max(0.0, deadline - time.monotonic())):
                stuck.append(f"rxstream:{name}")
        self._subscriptions.dispose()
        if self._make_boundary is not None:
            self._make_boundary.close()
        return stuck

    # --- drive mode -------------------------------------------------------------------------

    def drive(self, frames: int, interval: float) -> int:
        """Pull ``frames`` more items from every source on virtual time and run until drained.

        Consecutive calls continue one session: the first opens the sources, later ones pull
        on from where they are, at least ``interval`` after the last pull, on the same clock,
        through the same subscribed operators. Nothing is completed at the end of a drive:
        a stage completes when its sources end. Returns how many items the sources gave.
        """
        clock = self.clock
        assert clock is not None
        self._given = 0
        try:
            if self._sources is None:
                self._sources = []
                for node, puller in self._pullers.items():
                    puller.open()  # a failure: the caller closes the session
                    observer = self._observers.get(node)
                    if observer is None:  # wiring failed: the run has its error
                        break
                    self._sources.append((puller, observer))
            sources = [entry for entry in self._sources if entry[0] not in self._ended]
            if interval > 0:
                last = self._last_pull
                now = clock.clock()
                start = now if last is None else max(now, last + interval)
                for puller, observer in sources:
                    self._schedule_pull(clock, puller, observer, frames, start, interval, 0)
            else:
                self._pull_now(sources, frames)
            clock.run(until=lambda: self.error is not None)
        finally:
            self._bridge.pause()  # no thread runs between drives
        self.raise_error()
        return self._given

    @property
    def sources_ended(self) -> tuple[str, ...]:
        """The names of the sources that have ended (their iterators were exhausted)."""
        return tuple(
            self.plan.name_of(node)
            for node, puller in self._pullers.items()
            if puller in self._ended
        )

    @property
    def sources_open(self) -> bool:
        """Whether some source of a driven session can still give items."""
        return self._sources is None or len(self._ended) < len(self._sources)

    def close(self) -> None:
        """End a driven session: close the sources and what the stages hold (bound stages,
        buffers: their items are counted as dropped, ``stopped``); idempotent."""
        self.closed = True
        for puller in self._pullers.values():
            puller.close()
        self._subscriptions.dispose()
        self._bridge.close()

    def _pull_now(
        self,
        sources: list[tuple[SourcePuller, abc.ObserverBase[PipelineItem]]],
        frames: int,
    ) -> None:
        """Every pull at the clock's now, round-robin, without a timer per item.

        Timers the items start (pace ticks, window timeouts) run afterwards, in due order:
        the same outputs as scheduling each pull at that instant, at a fraction of the cost.
        """
        active = list(sources)
        for _ in range(frames):
            for entry in tuple(active) if len(active) > 1 else active:
                puller, observer = entry
                item = self._pulled(puller, observer)
                if item is None:
                    active.remove(entry)
                elif item is not SKIPPED:
                    observer.on_next(item)
                if self.error is not None:
                    return
            if not active:
                return

    def _pulled(
        self, puller: SourcePuller, observer: abc.ObserverBase[PipelineItem]
    ) -> PipelineItem | None:
        """One pull: the item (or SKIPPED); ``None`` once the source ended or failed."""
        assert self.clock is not None
        self._last_pull = self.clock.clock()
        try:
            item = puller.pull()
        except BaseException as exc:
            self.fail(exc)
            return None
        if item is None:
            self._ended.add(puller)
            observer.on_completed()
        elif item is not SKIPPED:
            self._given += 1
        return item

    def _schedule_pull(
        self,
        clock: VirtualClock,
        puller: SourcePuller,
        observer: abc.ObserverBase[PipelineItem],
        frames: int,
        start: float,
        interval: float,
        index: int,
    ) -> None:
        if index >= frames:
            return

        def pull(_scheduler: abc.SchedulerBase, _state: Any = None) -> None:
            item = self._pulled(puller, observer)
            if item is None:
                return
            # the next pull is scheduled before this item runs: at the same virtual time it
            # comes before the timers the item starts (a pace tick does not underflow)
            self._schedule_pull(clock, puller, observer, frames, start, interval, index + 1)
            if item is not SKIPPED:
                observer.on_next(item)

        clock.schedule_absolute(start + index * interval, pull)

    # --- statistics -------------------------------------------------------------------------

    def idle(self) -> bool:
        """Whether nothing moves here, checked from the sources down: every source ended or,
        for a ``ctx.input``, waits for a sample with none queued; every stage thread waits
        for work (see ``StageThread.idle``). Then every item taken in has left or was dropped,
        and the statistics count it. A source that keeps producing keeps the run busy."""
        for node in self.local:
            thread = self.threads.get(node)
            if thread is not None:
                if not thread.idle:
                    return False
                continue
            pump = self._source_threads.get(node)
            if pump is None or not pump.is_alive():
                continue
            feed = node.stage.source
            if not (isinstance(feed, InputFeed) and feed.idle):
                return False
        return True

    def statistics(self) -> Mapping[str, StageStatistics]:
        """Each stage's statistics now, by name, in plan order."""
        stats = {}
        for node in self.local:
            shell = self.shells[node]
            thread = self.threads.get(node)
            depth = 0 if thread is None else thread.depth
            capacity = 0 if node.stage.is_source else node.stage.inbox.capacity
            stats[shell.name] = shell.counters.snapshot(depth, capacity)
        return stats


class _Placeholder(_ClockScheduler):
    """A source's scheduler in threads mode: sources pull on their own thread, never schedule."""

    def clock(self) -> float:
        return time.monotonic()


def _complete(observer: abc.ObserverBase[Any]) -> None:
    observer.on_completed()
