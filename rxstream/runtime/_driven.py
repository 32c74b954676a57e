"""A driven run: the same operators with no threads, on one virtual clock (see
:class:`DrivenRun`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reactivex import abc

from rxstream._exceptions import PipelineStateError
from rxstream._kernel._generations import Generations
from rxstream.item import PipelineItem
from rxstream.operators._source import SKIPPED, SourcePuller
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._fuse import fusable_chains
from rxstream.runtime._plan import Plan
from rxstream.runtime._port import Port
from rxstream.runtime._run import Run
from rxstream.runtime._thread import VirtualClock, _ClockScheduler
from rxstream.stage import Node

__all__ = ["DrivenRun"]

_Source = tuple[SourcePuller, abc.ObserverBase[PipelineItem]]


class DrivenRun(Run):
    """A session of drives: :meth:`drive` as often as wanted, then :meth:`close`.

    One :class:`~rxstream.runtime._thread.VirtualClock` is every stage's scheduler, sources
    are pulled by actions on it, the hop into a stage is a direct call through a plain
    :class:`~rxstream.runtime._port.Port`, and chains of 1:1 pipes are fused
    (:mod:`rxstream.runtime._fuse`). Every rank runs here and no edge crosses. Consecutive
    drives continue one session (clock, source positions, subscribed operators) until
    :meth:`close`; a pipeline keeps its driven run across its ``drive()`` calls.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        bridge: AsyncBridge,
        generations: Generations,
        timing: bool = True,
        cuda_api: Any = None,
        nvtx: bool | None = None,
    ) -> None:
        self.clock = VirtualClock()
        # the session: its sources once opened, those that ended, the last pull's time
        self._sources: list[_Source] | None = None
        self._ended: set[SourcePuller] = set()
        self._last_pull: float | None = None
        self._given = 0
        self.closed = False
        """Whether the session was closed (a later drive starts a new one)."""
        super().__init__(
            plan,
            bridge=bridge,
            generations=generations,
            collect="payloads",
            timing=timing,
            cuda_api=cuda_api,
            nvtx=nvtx,
        )

    # --- wiring -----------------------------------------------------------------------------

    def _scheduler(self) -> _ClockScheduler:
        return self.clock

    def _port(self, node: Node) -> Port:
        return Port(self.shells[node])

    def _chains(self) -> Mapping[Node, list[Node]]:
        return fusable_chains(self.plan)

    def _crosses(self, upstream: Node, node: Node) -> bool:
        return False  # one process, one clock: every hop is a call

    def halt(self) -> None:
        """Stop the sources; returns at once."""
        self._halted = True
        for puller in self._pullers.values():
            puller.interrupt()
        self._bridge.close()

    # --- the session ------------------------------------------------------------------------

    def drive(self, frames: int, interval: float, *, items: bool) -> dict[str, list[Any]]:
        """Pull ``frames`` more items from every source, run until drained; what each end got
        (by name, in plan order): payloads, or the items themselves (``items=True``).

        Raises :class:`PipelineStateError` when items were asked for and none can come (every
        source ended, or every end completed before); a drive that fails closes the session.
        """
        self.collect = "items" if items else "payloads"
        for tail in self.tails:
            self.outputs[tail] = []
        completed = self.done.is_set()  # before this drive: every end had completed
        try:
            given = self._pull(frames, interval)
        except BaseException:
            self.close()
            raise
        outputs = {self.plan.name_of(tail): self.outputs[tail] for tail in self.plan.tails}
        if frames and not any(outputs.values()):
            ended = ", ".join(repr(name) for name in self.sources_ended)
            why = None
            if not given and not self.sources_open:
                why = f"the pipeline's sources have ended ({ended})"
            elif completed:  # every end completed before (a zip whose shorter input ended)
                why = f"the pipeline has completed (sources ended: {ended or 'none'})"
            if why is not None:
                raise PipelineStateError(
                    f"drive(frames={frames}) can produce nothing: {why}; "
                    "pipeline.reset() starts the session over"
                )
        return outputs

    def _pull(self, frames: int, interval: float) -> int:
        """Pull ``frames`` more items from every source on virtual time and run until drained.

        The first call opens the sources, later ones pull on from where they are, at least
        ``interval`` after the last pull, on the same clock, through the same subscribed
        operators. Nothing is completed at the end of a drive: a stage completes when its
        sources end. Returns how many items the sources gave.
        """
        clock = self.clock
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
                    self._schedule_pull(puller, observer, frames, start, interval, 0)
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
        """Whether some source of the session can still give items."""
        return self._sources is None or len(self._ended) < len(self._sources)

    def close(self) -> None:
        """End the session: close the sources and what the stages hold (bound stages,
        buffers: their items are counted as dropped, ``stopped``); idempotent."""
        self.closed = True
        for puller in self._pullers.values():
            puller.close()
        self._subscriptions.dispose()
        self._bridge.close()

    # --- pulls ------------------------------------------------------------------------------

    def _pull_now(self, sources: list[_Source], frames: int) -> None:
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
            self._schedule_pull(puller, observer, frames, start, interval, index + 1)
            if item is not SKIPPED:
                observer.on_next(item)

        self.clock.schedule_absolute(start + index * interval, pull)
