"""A threaded run: every stage on its own thread behind a bounded inbox (a ``fuse=True`` pipe on
its upstream's), every source pumped by a thread of its own; rank boundaries cross to other
processes (see :class:`ThreadedRun`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from reactivex import Observable, abc

from rxstream._exceptions import PipelineError
from rxstream._kernel._generations import Generations
from rxstream._kernel._resources import load_for
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem
from rxstream.operators._core import attach
from rxstream.operators._input import InputFeed
from rxstream.operators._source import SKIPPED, SourcePuller
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._crossings import BoundaryFactory
from rxstream.runtime._fuse import fused, fused_into, threaded_chains
from rxstream.runtime._plan import Plan
from rxstream.runtime._port import InboxPort, Port
from rxstream.runtime._run import Run
from rxstream.runtime._thread import StageThread, _ClockScheduler, charge_stalls_to
from rxstream.runtime._watchdog import Watchdog, busy_limit_from_env
from rxstream.stage import Node
from rxstream.typing import ItemStream

__all__ = ["LOADING_BEAT_S", "ThreadedRun"]

LOADING_BEAT_S = 1.0
"""How often a rank still loading its resources says so (:meth:`ThreadedRun.wait_loaded`)."""


class ThreadedRun(Run):
    """A run on threads: :meth:`start` once, then :meth:`stop` (or :meth:`halt` from anywhere).

    Every stage with inputs gets a :class:`~rxstream.runtime._thread.StageThread` (its thread
    and bounded inbox) and an :class:`~rxstream.runtime._port.InboxPort`; every source a thread
    that pulls it and pushes what it gives. ``rank`` (``None``: every rank) picks the stages
    this process runs; an edge to a stage on another rank crosses by a boundary that
    ``boundaries`` makes.
    """

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
        busy_limit_s: float | None = None,
        cuda_api: Any = None,
        nvtx: bool | None = None,
    ) -> None:
        """``busy_limit_s``: the watchdog's bound for every stage (``None``: the environment
        variable ``RXSTREAM_BUSY_S``, else each stage's own; :mod:`~rxstream.runtime._watchdog`).
        """
        self.threads: dict[Node, StageThread] = {}
        self._busy_limit_s = busy_limit_s if busy_limit_s is not None else busy_limit_from_env()
        self._watchdog: Watchdog | None = None
        self._source_threads: dict[Node, threading.Thread] = {}
        self._lifecycle = threading.RLock()
        """Held by :meth:`start` while it starts threads: :meth:`stop` joins only after."""
        local = [node for node in plan.nodes if rank is None or plan.ranks[node] == rank]
        self._loading = load_for(((plan.name_of(node), node.stage.uses) for node in local), rank)
        """The loads of the resources this rank's stages read, begun here (as the run is made,
        while the other ranks start): the sources pull once they are done, and a spawned rank
        says it is ready only then (:meth:`wait_loaded`)."""
        super().__init__(
            plan,
            bridge=bridge,
            generations=generations,
            collect=collect,
            timing=timing,
            rank=rank,
            boundaries=boundaries,
            replica=replica,
            cuda_api=cuda_api,
            nvtx=nvtx,
        )

    # --- wiring -----------------------------------------------------------------------------

    def _scheduler(self) -> _ClockScheduler:
        return _Placeholder()  # a stage's thread replaces it; a source never schedules

    def _make_shell(self, node: Node) -> StageShell:
        shell = super()._make_shell(node)
        stage = node.stage
        if fused(node):  # runs on its upstream's thread: made before it, in plan order
            shell.scheduler = self.shells[node.inputs[0]].scheduler
        elif not stage.is_source:
            thread = StageThread(shell.name, stage.inbox, shell.counters, shell.crashed)
            shell.scheduler = thread
            self.threads[node] = thread
        return shell

    def _port(self, node: Node) -> Port:
        if fused(node):  # a fused ``items=True`` pipe: admitted in its upstream's call
            return Port(self.shells[node])
        return InboxPort(self.shells[node], self.threads[node])

    def _chains(self) -> Mapping[Node, list[Node]]:
        return threaded_chains(self.plan)

    def _chain_input(self, streams: dict[Node, ItemStream], head: Node) -> ItemStream:
        stream = self._input(streams, head.inputs[0], head)
        if fused(head):  # on its upstream's thread, as that one emits
            return stream
        return _onto(self.threads[head], stream)  # the head's inbox; the chain admits

    def _fused_into(self, node: Node) -> str:
        return self.plan.name_of(fused_into(node)) if fused(node) else ""

    def _depth(self, node: Node) -> int:
        thread = self.threads.get(node)
        return 0 if thread is None else thread.depth

    # --- start and stop ---------------------------------------------------------------------

    def wait_loaded(
        self,
        loading: Callable[[tuple[str, ...]], None] | None = None,
        every_s: float = LOADING_BEAT_S,
    ) -> bool:
        """Wait until the resources this rank's stages read are loaded (``ctx.resource``),
        or the run halted; whether they were. ``loading(names)`` is told the names still
        loading at once and every ``every_s`` seconds after (a spawned rank's word to the
        controller that it is busy loading, not hung). A load that failed fails the run with
        a :class:`PipelineError` naming the stage that needed it (its cause the
        :class:`~rxstream.ResourceError`)."""
        told = -math.inf
        while not self._loading.wait(0.1):
            if self._halted:
                return False
            pending = self._loading.pending
            if loading is not None and pending and time.monotonic() - told >= every_s:
                told = time.monotonic()
                loading(pending)
        failure = self._loading.failure
        if failure is not None:
            stage, error = failure
            self.fail(PipelineError(stage, error))
            return False
        return not self._halted

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
                self.done.set()
            self._start_watchdog()
            self._start_sources()

    def _start_watchdog(self) -> None:
        """Watch every stage with a thread of its own (its sources' pulls included) for an
        item it has been busy on past its bound (:mod:`rxstream.runtime._watchdog`)."""
        limit = self._busy_limit_s
        stages = {
            shell.name: shell.counters
            for node, shell in self.shells.items()
            if node in self.threads or node in self._pullers
        }
        where = f"rank {self.rank}" if self.rank is not None and self.plan.world > 1 else ""
        riders: dict[str, list[str]] = {}  # the stages fused onto each thread: its work too
        for node, shell in self.shells.items():
            if fused(node):
                riders.setdefault(self.plan.name_of(fused_into(node)), []).append(shell.name)
        self._watchdog = watchdog = Watchdog(stages, limit, where=where, fused=riders)
        watchdog.start()
        self.done.on_done(watchdog.stop)  # completed or failed: nothing more to watch

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
        on_next = observer.on_next
        waits = puller.waits  # only a client input's pulls wait (for samples)
        pulling = None if waits else puller  # what the watchdog sees a pull on (not a wait)
        try:
            if not self.wait_loaded():  # the resources of this rank's stages first
                return
            puller.open()
            pull = puller.pull
            started = perf()  # one clock read a turn: a turn's end starts the next
            while not self._halted:
                stalled = counters.stalled_s
                counters.current = pulling
                item = pull()
                waited = 0.0
                if waits:
                    waited = puller.take_waited()
                    counters.wait_s += waited
                if item is None:
                    counters.work_s += perf() - started - waited
                    observer.on_completed()
                    return
                if item is not SKIPPED:
                    counters.current = item
                    on_next(item)  # with the stages fused into the source, if any
                    counters.current = None
                # a blocked hand-off downstream is stalled time, not work (as a stage's)
                done = perf()
                counters.work_s += done - started - waited - (counters.stalled_s - stalled)
                started = done
        except BaseException as exc:
            self.fail(exc)
        finally:
            counters.current = None
            puller.close()

    def halt(self) -> None:
        """Stop sources and wake every blocked thread; returns at once (any thread)."""
        self._halted = True
        if self._watchdog is not None:
            self._watchdog.stop()
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
        if self._watchdog is not None:
            self._watchdog.join(max(0.0, deadline - time.monotonic()))
        if not self._loading.join(max(0.0, deadline - time.monotonic())):
            # a loader still at work (it cannot be interrupted): it ends in the background
            stuck.extend(f"rxstream:load:{name}" for name in self._loading.pending)
        self._subscriptions.dispose()
        if self._make_boundary is not None:
            self._make_boundary.close()
        return stuck

    # --- state ------------------------------------------------------------------------------

    def idle(self) -> bool:
        """Whether nothing moves here, checked from the sources down: every source ended or,
        for a ``ctx.input``, waits for a sample with none queued; every stage thread waits
        for work (see ``StageThread.idle``) and its stage holds no item for a timer to release
        (``StageCounters.held``: a ``pace``'s buffered frames, a timed ``window``'s open one).
        Then every item taken in has left or was dropped (or waits in a window for more items
        to close it), and the statistics count it. A source that keeps producing keeps the run
        busy."""
        for node in self.local:
            thread = self.threads.get(node)
            if thread is not None:
                if not thread.idle or self.shells[node].counters.held:
                    return False
                continue
            pump = self._source_threads.get(node)
            if pump is None or not pump.is_alive():
                continue
            feed = node.stage.source
            if not (isinstance(feed, InputFeed) and feed.idle):
                return False
        return True


def _onto(thread: StageThread, upstream: ItemStream) -> ItemStream:
    """``upstream`` handed into ``thread``'s inbox, delivered on it, not admitted: a fused
    chain's first stage with an inbox of its own (the chain admits into each of its stages)."""

    def subscribe(
        observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
    ) -> abc.DisposableBase:
        put_control = thread.put_control
        return attach(
            upstream,
            partial(thread.put, observer.on_next),
            lambda error: put_control(observer.on_error, error),
            lambda: put_control(_complete, observer),
            scheduler,
        )

    return Observable(subscribe)


def _complete(observer: abc.ObserverBase[PipelineItem]) -> None:
    observer.on_completed()


class _Placeholder(_ClockScheduler):
    """A source's scheduler in a threaded run: sources pull on their own thread, never
    schedule."""

    def clock(self) -> float:
        return time.monotonic()
