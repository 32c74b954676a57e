"""``ctx.pace(fps=…)``: fixed-rate output on the stage scheduler's timer.

Frames wait in a small buffer; every ``1/fps`` seconds a tick emits the oldest with the next
``pts`` (``step`` units of the declared time base per frame). On underflow a tick repeats the
last frame marked ``idle=True``. On overflow, ``throttle`` stops taking items from the inbox
until a tick makes room (the inbox then fills and blocks the upstream: backpressure), and
``latest`` drops the oldest buffered frame (counted, reason ``latest``). Ticks are anchored at
the first frame's arrival and scheduled at absolute times, so they do not drift; a tick that
comes more than one period late re-anchors instead of bursting to catch up. After the upstream
completes, the buffer drains at the same rate and the stage completes (no idle tail). A frame
of a stale generation (after a steer) is never repeated: that tick emits nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from reactivex import abc
from reactivex.disposable import CompositeDisposable, Disposable, SerialDisposable

from rxstream.item import PipelineItem, _with_stamps, evolve_metadata, now
from rxstream.operators._core import attach, one_input
from rxstream.runtime._shell import StageShell
from rxstream.typing import ItemStream, Operator, PaceOverflow

__all__ = ["pace_operator"]


def pace_operator(
    period: float, step: int, capacity: int, overflow: PaceOverflow
) -> Callable[[StageShell], Operator]:
    """Emit one buffered frame every ``period`` seconds, ``pts`` advancing by ``step``."""

    def build(shell: StageShell) -> Operator:
        def subscribe(
            source: ItemStream,
            observer: abc.ObserverBase[PipelineItem],
            scheduler: abc.SchedulerBase | None,
        ) -> abc.DisposableBase:
            return _Pacer(shell, observer, period, step, capacity, overflow).attach(
                source, scheduler
            )

        return one_input(subscribe)

    return build


class _Pacer:
    """The state of one subscription to a pace stage; runs on the stage's thread alone."""

    def __init__(
        self,
        shell: StageShell,
        observer: abc.ObserverBase[PipelineItem],
        period: float,
        step: int,
        capacity: int,
        overflow: PaceOverflow,
    ) -> None:
        self.shell = shell
        self.sched = shell.scheduler
        self.observer = observer
        self.period = period
        self.step = step
        self.capacity = capacity
        self.throttle = overflow == "throttle"
        self.buffer: deque[tuple[PipelineItem, float]] = deque()
        self.anchor: float | None = None
        self.ticks = 0
        self.last: PipelineItem | None = None
        self.done = False
        self.timer = SerialDisposable()
        self.due = 0.0
        self.idle = False  # the pending tick can only repeat the last frame

    def attach(self, source: ItemStream, scheduler: abc.SchedulerBase | None) -> abc.DisposableBase:
        upstream = attach(source, self.on_next, self.on_error, self.on_completed, scheduler)
        return CompositeDisposable(upstream, self.timer, Disposable(self._dispose))

    def _dispose(self) -> None:
        """Frames still buffered when the run ends are counted as dropped (``stopped``)."""
        if self.buffer:
            self.shell.counters.drop("stopped", len(self.buffer))
            self.buffer.clear()

    def on_next(self, item: PipelineItem) -> None:
        self.shell.counters.items_in += 1
        buffer = self.buffer
        buffer.append((item, now()))
        if len(buffer) > self.capacity and not self.throttle:
            buffer.popleft()
            self.shell.counters.drop("latest")
        if self.throttle and len(buffer) >= self.capacity:
            self.sched.set_accepting(False)
        if self.anchor is None:
            self.anchor = self.sched.clock()
            self._schedule(self.anchor)
        elif self.idle:  # the pending tick has a frame to show now
            self._schedule(self.due)

    def on_error(self, error: Exception) -> None:
        self.timer.dispose()
        self.observer.on_error(error)

    def on_completed(self) -> None:
        self.done = True
        if self.anchor is None:  # never saw a frame: nothing to drain
            self.observer.on_completed()
        elif self.idle:
            self._schedule(self.due)

    def _schedule(self, due: float) -> None:
        self.due = due
        self.idle = not self.buffer and not self.done
        schedule = self.sched.schedule_idle if self.idle else self.sched.schedule_absolute
        self.timer.disposable = schedule(due, self._tick)

    def _tick(self, _scheduler: abc.SchedulerBase, _state: Any = None) -> None:
        shell = self.shell
        pts = self.ticks * self.step
        if self.buffer:
            item, arrived = self.buffer.popleft()
            self.sched.set_accepting(True)
            metadata = evolve_metadata(item.metadata, pts=pts, idle=False)
            out = shell.emit(item.payload, _with_stamps(metadata, shell.stamps(arrived)))
            self.last = out
        elif self.done:
            self.observer.on_completed()
            return
        elif self.last is not None and (
            self.last.metadata.prompt_generation >= shell.generations.drop
        ):
            last = self.last
            out = shell.emit(
                last.payload, evolve_metadata(last.metadata, pts=pts, idle=True, cutover=False)
            )
        else:  # nothing to show: the last frame went stale with a steer
            out = None
        assert self.anchor is not None
        if out is None:
            self.anchor += self.period  # the skipped slot shifts the clock, not the pts
        else:
            self.ticks += 1
            self.observer.on_next(out)
        due = self.anchor + self.ticks * self.period
        late = self.sched.clock() - due
        if late > self.period:
            self.anchor += late
            due += late
        self._schedule(due)
