"""``ctx.pace(fps=…)``: steady-rate output on the stage scheduler's timer.

Frames wait in a small buffer; every tick emits the oldest with the next ``pts`` (``step``
units of the declared time base per frame). On underflow a tick repeats the last frame marked
``idle=True``. On overflow, ``throttle`` stops taking items from the inbox until a tick makes
room (the inbox then fills and blocks the upstream: backpressure), and ``latest`` drops the
oldest buffered frame (counted, reason ``latest``; the next-oldest buffered frame, now the
next one shown, takes its input correlation if that is the newer one, the N:1 rule of
``merge_metadata``, so the input is timed at the first frame shown after it; see
:func:`_inherit` for what a steer changes). A frame the stage's ``latest`` inbox drops never
reaches the buffer and passes nothing on. After the upstream completes, the buffer
drains at the same rate and the stage completes (no idle tail). A frame of a stale generation
(after a steer) is never repeated: that tick emits nothing.

Where the ticks fall (``phase``):

- ``"fixed"``: a grid of ``1/fps`` anchored at the first frame's arrival, at absolute times so
  it does not drift. A frame waits for the next grid tick, however far off that is.
- ``"lock"`` (default): the same grid, moved by an offset that the pace steers so each tick
  falls a small *lead* after the arrival of the frame it emits. After each real frame the
  offset moves by half the error (the frame's hold minus the lead), at most 10 % of a period,
  so every period stays within ±10 % of ``1/fps``.

  The lead is four times the mean deviation of the arrivals from one period after the
  previous frame, less the 10 % of a period a tick waits for a late frame (below), between
  2 ms and a quarter period (one deviation counts for at most a quarter period): steady
  arrivals get a short lead, jittery ones a longer one, so a late frame rarely misses its
  tick. A tick that finds no frame right after a real one waits until
  its period is 10 % long before it repeats the last frame: a frame that arrives meanwhile
  leaves at once (the grid moves with that tick); further idle repeats come every period.
  A frame later than that costs one idle repeat; it then waited most of a period, and the
  ticks run up to 10 % fast until frames leave soon after they arrive again. A backlog
  (frames queued after a stall) drains the same way.

  Whenever the pace is caught up (a tick leaves the buffer empty, or repeats idle) the grid
  re-centres on the ticks as they are. Between two such moments the ticks gain at most one
  second on the grid (``AHEAD_S``: enough to drain what a pipeline's inboxes hold after a
  stall) and fall back at most one period. That keeps the long-run rate at ``fps``: an
  upstream faster than ``fps`` (a buffer that never empties) gains one second's frames
  once, then runs at ``fps``.

In both, a tick that comes more than one period late re-anchors instead of bursting to catch
up. The pace's output stamps ``pace.in`` (arrival), ``pace.hold`` (its tick) and ``pace.out``:
the wait for the tick is the frame's hold, not compute (:mod:`rxstream.operators._hold`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from reactivex import abc
from reactivex.disposable import CompositeDisposable, Disposable, SerialDisposable

from rxstream._kernel._kind import StageKind
from rxstream._kernel._options import PaceOptions
from rxstream._kernel._shell import StageShell
from rxstream.item import (
    PipelineItem,
    _newest,
    _with_stamps,
    evolve_metadata,
    merge_metadata,
    now,
)
from rxstream.operators._core import attach, one_input
from rxstream.operators._hold import held_stamps
from rxstream.typing import ItemStream, Operator, PaceOverflow, PacePhase

__all__ = ["AHEAD_S", "PACE_KIND", "SLEW", "pace_operator"]

PACE_KIND = StageKind("pace", "repeats", holds=True, passes=True, options=PaceOptions)
"""``ctx.pace``: a tick with nothing new repeats the last frame."""

SLEW = 0.1
"""The most a phase-locked period differs from ``1/fps``, as a fraction of it."""
AHEAD_S = 1.0
"""How far (s) a phase-locked pace gains on its grid at most while it never catches up."""
GAIN = 0.5
"""The share of a frame's phase error the lock corrects at the next tick."""
MIN_LEAD = 0.002
"""The shortest lead (s) the lock keeps between a frame's arrival and its tick."""


def pace_operator(
    period: float, step: int, capacity: int, overflow: PaceOverflow, phase: PacePhase = "lock"
) -> Callable[[StageShell], Operator]:
    """Emit one buffered frame every ``period`` seconds, ``pts`` advancing by ``step``."""

    def build(shell: StageShell) -> Operator:
        def subscribe(
            source: ItemStream,
            observer: abc.ObserverBase[PipelineItem],
            scheduler: abc.SchedulerBase | None,
        ) -> abc.DisposableBase:
            pacer = _Pacer(shell, observer, period, step, capacity, overflow, phase == "lock")
            return pacer.attach(source, scheduler)

        return one_input(subscribe)

    return build


def _inherit(
    buffer: deque[tuple[PipelineItem, float, float]],
    displaced: tuple[PipelineItem, float, float],
) -> None:
    """The next-oldest buffered frame (now first in ``buffer``), shown in place of
    ``displaced``, takes the N:1 rule's metadata of the two
    (:func:`~rxstream.item.merge_metadata`): the newest input correlation, and with it that
    input's timeline and arrival here, ``cutover`` if either had it. The displaced frame is
    never shown, so the next one shown is the first to show its input: that input's timing
    record (and the page's report) comes from it instead of from nowhere.

    Two exceptions. A displaced frame of an older prompt generation (a steer made it stale,
    or superseded it) passes nothing on: the newer frame's input, cutover and timeline are
    its own generation's. A displaced cutover that carries no input, before a frame that
    carries none either, passes on its timeline and arrival with the cutover: the cutover's
    record keeps its origin (``steer``, docs/timing.md)."""
    survivor, arrived, at = buffer[0]
    old, new = displaced[0].metadata, survivor.metadata
    if old.prompt_generation < new.prompt_generation:
        return
    pair = (old, new)
    merged = merge_metadata(pair)
    if _newest(pair) == 0:  # the displaced frame's input: its arrival starts the hold
        arrived = displaced[1]
    elif old.cutover and not (new.cutover or old.input_seq or new.input_seq):
        merged = evolve_metadata(merged, timeline=old.timeline)
        arrived = displaced[1]
    buffer[0] = (PipelineItem(survivor.payload, merged), arrived, at)


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
        lock: bool,
    ) -> None:
        self.shell = shell
        self.sched = shell.scheduler
        self.observer = observer
        self.period = period
        self.step = step
        self.capacity = capacity
        self.throttle = overflow == "throttle"
        self.lock = lock
        self.stamps = held_stamps(shell)
        # (item, arrival stamp on the monotonic clock, arrival on the scheduler's clock)
        self.buffer: deque[tuple[PipelineItem, float, float]] = deque()
        self.anchor: float | None = None
        self.ticks = 0
        self.offset = 0.0
        """Where the lock has moved the ticks from the grid ``anchor + ticks * period``."""
        self.jitter = period / 48
        """Mean deviation of arrivals from the lock's expectation (starts at a lead of P/16)."""
        self.lead = period / 16
        """How long after its arrival the lock aims to emit a frame."""
        self.expect: float | None = None
        """The hold the next frame will have if it arrives one period after the last one."""
        self.due = 0.0
        """When the scheduled tick is due (on the scheduler's clock)."""
        self.previous: float | None = None
        """When the last tick that emitted a frame ran."""
        self.waiting = False
        """Whether a locked tick found no frame and waits (within the slew) for a late one."""
        self.last: PipelineItem | None = None
        self.done = False
        self.timer = SerialDisposable()
        self.idle = False  # the pending tick can only repeat the last frame

    def attach(self, source: ItemStream, scheduler: abc.SchedulerBase | None) -> abc.DisposableBase:
        upstream = attach(source, self.on_next, self.on_error, self.on_completed, scheduler)
        return CompositeDisposable(upstream, self.timer, Disposable(self._dispose))

    def _dispose(self) -> None:
        """Frames still buffered when the run ends are counted as dropped (``stopped``)."""
        if self.buffer:
            self.shell.counters.drop("stopped", len(self.buffer))
            self.buffer.clear()
            self.shell.counters.held = 0

    def on_next(self, item: PipelineItem) -> None:
        self.shell.counters.items_in += 1
        buffer = self.buffer
        at = self.sched.clock()
        buffer.append((item, now(), at))
        if len(buffer) > self.capacity and not self.throttle:
            displaced = buffer.popleft()
            self.shell.counters.drop("latest")
            _inherit(buffer, displaced)
        self.shell.counters.held = len(buffer)
        if self.throttle and len(buffer) >= self.capacity:
            self.sched.set_accepting(False)
        if self.anchor is None:
            self.anchor = at
            self._schedule(self.anchor)
        elif self.waiting:  # the late frame a locked tick waits for: its tick is now
            self._tick(self.sched)
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
        assert self.anchor is not None
        if self.waiting:  # the tick was held back for a late frame: the grid moves with it
            self.waiting = False
            self.anchor += self.sched.clock() - self.due
        elif self.lock and not self.buffer and not self.done and self.expect is not None:
            # frames were flowing (the last tick emitted one): allow the longest period
            assert self.previous is not None
            grace = self.previous + (1 + SLEW) * self.period
            if grace > self.sched.clock():  # wait that long for a late frame before repeating
                self.waiting = True
                self.idle = True  # a wait for a frame that may not come: a drive does not wait
                self.timer.disposable = self.sched.schedule_idle(grace, self._tick)
                return
        if self.buffer:
            released = now()
            item, arrived, at = self.buffer.popleft()
            shell.counters.held = len(self.buffer)
            self.sched.set_accepting(True)
            metadata = evolve_metadata(item.metadata, pts=pts, idle=False)
            out = shell.emit(item.payload, _with_stamps(metadata, self.stamps(arrived, released)))
            self.last = out
            if self.lock:
                self._steer(self.sched.clock() - at)
                if not self.buffer:  # caught up: the grid re-centres on the ticks as they are
                    self.anchor += self.offset
                    self.offset = 0.0
        elif self.done:
            self.observer.on_completed()
            return
        elif self.last is not None and not shell.generations.is_stale(self.last.metadata):
            last = self.last
            out = shell.emit(
                last.payload, evolve_metadata(last.metadata, pts=pts, idle=True, cutover=False)
            )
            self.anchor += self.offset  # ran dry: the grid re-centres on the ticks as they are
            self.offset = 0.0
            self.expect = None
        else:  # nothing to show: the last frame went stale with a steer
            out = None
            self.expect = None
        if out is None:
            self.anchor += self.period  # the skipped slot shifts the clock, not the pts
        else:
            self.ticks += 1
            self.previous = self.sched.clock()
            self.observer.on_next(out)
        due = self.anchor + self.ticks * self.period + self.offset
        late = self.sched.clock() - due
        if late > self.period:
            self.anchor += late
            due += late
        self._schedule(due)

    def _steer(self, hold: float) -> None:
        """Move the next tick toward ``lead`` after the arrivals: ``hold`` was this frame's."""
        period = self.period
        most = period / 4
        if self.expect is not None:  # how far this arrival was from one period after the last
            self.jitter += (min(abs(hold - self.expect), most) - self.jitter) / 8
            # late by up to the slew, a frame still leaves on arrival (the tick waits for it)
            self.lead = min(max(4 * self.jitter - SLEW * period, MIN_LEAD), most)
        error = hold - self.lead  # > 0: the frame waited longer than the lead, tick earlier
        slew = SLEW * period
        step = min(max(-GAIN * error, -slew), slew)
        offset = min(max(self.offset + step, -AHEAD_S), period)
        self.expect = hold + offset - self.offset
        self.offset = offset
