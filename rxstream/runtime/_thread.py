"""A stage's scheduler: one thread that runs its inbox and its timers.

reactivex's ``observe_on`` queues without bound (a list popped from the front), so the hop
between stages is this: a bounded inbox with an overflow policy chosen once at construction
(``put`` is bound to the policy's method). Under ``block`` and ``drop_new`` it is two C queues,
items and free-slot tokens (:mod:`rxstream.runtime._handoff`, docs/decisions.md, "Two C queues
for the bounded hand-off"); under ``latest`` a deque under one lock, a backlog leaving it in
one take (docs/decisions.md, "A backlog leaves the inbox in one take"). The same thread
runs the stage's timed actions (pace ticks, window timeouts), so a stage's operator never needs
a lock of its own. It is a reactivex scheduler too: payload-level Rx operators lifted with
``ctx.rx`` that take a scheduler time on it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from reactivex import abc, typing
from reactivex.disposable import Disposable, MultipleAssignmentDisposable

from rxstream._kernel._inbox import InboxSpec
from rxstream._kernel._scheduler import _ClockScheduler, _Timer
from rxstream._kernel._stats import StageCounters

__all__ = [
    "StageThread",
    "VirtualClock",
    "_ClockScheduler",
    "charge_stall",
    "charge_stalls_to",
    "stall_begins",
]

_TState = TypeVar("_TState")
_stall = threading.local()
"""Per thread: the counters that a blocked ``put`` on this thread charges ``stalled_s`` to."""


def charge_stalls_to(counters: StageCounters) -> None:
    """Charge the time this thread spends blocked on full inboxes to ``counters``."""
    _stall.counters = counters


def charge_stall(seconds: float, fallback: StageCounters | None = None) -> None:
    """Charge ``seconds`` blocked handing an item on (a full inbox, a full ring) to the owner
    of the running thread (:func:`charge_stalls_to`: the stage whose loop takes its stalls out
    of its work, also for the stages fused onto it), else to ``fallback``."""
    owner: StageCounters | None = getattr(_stall, "counters", fallback)
    if owner is not None:
        owner.stalled_s += seconds


def stall_begins() -> Callable[[], None]:
    """Mark the running thread's owner (:func:`charge_stalls_to`) as stalled, not busy, for
    the run's watchdog: it hands an item on and waits for room (a full inbox, a full ring).
    Returns what ends the mark (call it once the wait is over). Slow path only."""
    owner: StageCounters | None = getattr(_stall, "counters", None)
    if owner is None:
        return _nothing
    held = owner.current
    owner.current = None

    def resume() -> None:
        owner.current = held

    return resume


def _nothing() -> None:
    pass


_monotonic = time.monotonic
_perf = time.perf_counter

LIVE_S = 0.002
"""Under a backlog, a stage thread adds its work to the statistics about this often (as the
item that crosses it ends): they read live while a backlog never ends."""

LIVE_ITEMS = 16
"""Under a backlog of fast items, the clock is read once per this many items (an item that
takes a while makes it read after every item): the live statistics cost a counter an item on
the hot path, not a clock read (``bench/hop_parts.py``: ~50 ns an item)."""

_new_lock = threading.Lock


class _Busy(_Timer):
    """A virtual-clock timer that keeps a drive going: counted by its clock while pending."""

    __slots__ = ("pending",)

    pending: VirtualClock | None
    """The clock that counts this timer, until it runs or is cancelled."""

    def cancel(self) -> None:
        clock = self.pending
        if clock is not None:
            self.pending = None
            clock._busy -= 1
        self.cancelled = True


class VirtualClock(_ClockScheduler):
    """Virtual time for ``drive()``: actions run in due order, the clock jumps, nothing sleeps.

    Unlike reactivex's ``VirtualTimeScheduler`` it never nudges the clock forward when many
    actions share one instant, so a drive is exactly repeatable. The clock lives as long as
    the driven session: consecutive drives continue its time.
    """

    driven = True

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._heap: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()
        self._busy = 0
        """How many pending timers are not idle (see :meth:`schedule_idle`)."""

    _timer = _Busy

    def clock(self) -> float:
        return self._now

    def _at(self, due: float, timer: _Timer) -> abc.DisposableBase:
        timer.pending = self  # type: ignore[attr-defined]  # a _Busy: made by self._timer
        self._busy += 1
        heapq.heappush(self._heap, (max(due, self._now), next(self._seq), timer))
        return Disposable(timer.cancel)

    def schedule_idle(
        self,
        duetime: float,
        action: typing.ScheduledAction[_TState],
        state: _TState | None = None,
    ) -> abc.DisposableBase:
        timer = _Timer(self, action, state)
        heapq.heappush(self._heap, (max(duetime, self._now), next(self._seq), timer))
        return Disposable(timer.cancel)

    def schedule_periodic(
        self,
        period: typing.RelativeTime,
        action: typing.ScheduledPeriodicAction[_TState],
        state: _TState | None = None,
    ) -> abc.DisposableBase:
        """reactivex's periodic work on idle timers: a periodic action (``sample``,
        ``interval``) runs while the drive has other work, and never keeps it going alone."""
        seconds = self.to_seconds(period)
        disposable = MultipleAssignmentDisposable()

        def periodic(_scheduler: abc.SchedulerBase, state: Any = None) -> None:
            if disposable.is_disposed:
                return
            disposable.disposable = self.schedule_idle(self._now + seconds, periodic, action(state))

        disposable.disposable = self.schedule_idle(self._now + seconds, periodic, state)
        return disposable

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Run the scheduled actions in due order while any is not idle, or until ``until()``.

        Idle actions (:meth:`schedule_idle`) due before a busy one run on the way; those
        left once nothing busy remains wait for the next run.
        """
        heap = self._heap
        while self._busy and not until():
            due, _, timer = heapq.heappop(heap)
            self._now = due
            if timer.__class__ is _Busy and timer.pending is not None:
                timer.pending = None
                self._busy -= 1
            timer.run()


# Inbox entries: ``(deliver, value)`` for data, ``(deliver, value, None)`` for control.


class StageThread(_ClockScheduler):
    """A stage's thread, its bounded inbox, and its timers.

    Producers call :meth:`put` (data, bounded by the policy) or :meth:`put_control`
    (completion and errors, never dropped). The thread delivers each message by calling
    ``deliver(value)`` with no lock held.

    Under a backlog the thread takes every waiting message in one lock acquisition and
    delivers them back to back (a batch; not under ``latest``, whose waiting items must stay
    replaceable by fresher ones). A message of a batch still counts as waiting, and holds
    its inbox slot, until its delivery starts: capacity, blocking and drops are as if the
    thread took the messages one at a time. A batch ends early, its rest going back to the
    front of the inbox, when a timer is due or the stage stops accepting (``pace``); a
    ``close`` in the middle of a batch counts the rest as dropped (``stopped``).
    """

    def __init__(
        self,
        name: str,
        spec: InboxSpec,
        counters: StageCounters,
        on_crash: Callable[[BaseException], None],
    ) -> None:
        super().__init__()
        self.name = name
        self.capacity = spec.capacity
        self.policy = spec.policy
        self._counters = counters
        self._on_crash = on_crash
        # no Condition: its wait and notify are Python code, several µs a hop. The thread
        # sleeps on ``_wake`` (held while it is not sleeping, released once by whoever wakes
        # it); a producer waiting for room sleeps on a lock of its own in ``_waiting``.
        self._lock = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()
        self._waiting: deque[Any] = deque()
        """Locks of producers waiting for room, not yet woken (changed under the lock)."""
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._data = 0
        """Data items in ``_inbox`` (written under the lock)."""
        self._held = 0
        """Data items the thread took in its batch and has not started yet (written by the
        thread alone; they count as waiting: the inbox holds ``_data + _held``)."""
        self._batch = spec.policy != "latest"
        self._ready: deque[_Timer] = deque()
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()
        self._accepting = True
        self._idle = False  # the thread sleeps on _wake: the first put must wake it
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"rxstream:{name}", daemon=True)
        self.put: Callable[[Callable[[Any], None], Any], None] = {
            "block": self._put_block,
            "latest": self._put_latest,
            "drop_new": self._put_drop_new,
        }[spec.policy]

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop taking work, wake every thread blocked on this inbox, let the thread end.

        Items still waiting are counted as dropped (reason ``stopped``): those in the inbox
        here, those of a batch not started yet by the thread when it sees the close. Safe
        from any thread.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._data:
                self._counters.drop("stopped", self._data)
            self._inbox.clear()
            self._data = 0
            self._wake_thread()
            for waiter in self._waiting:
                waiter.release()
            self._waiting.clear()

    def join(self, timeout: float | None) -> bool:
        """Wait for the thread to end; whether it did."""
        if self._thread.ident is None or self._thread is threading.current_thread():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def depth(self) -> int:
        """Data items waiting now (a batch's items count until their delivery starts)."""
        return self._data + self._held

    @property
    def idle(self) -> bool:
        """Whether the thread waits for work with nothing queued: no item, no message, no
        timer due (a timer due later, such as a ``pace`` tick, does not count)."""
        with self._lock:
            return self._idle and not self._inbox and not self._ready

    # --- producers --------------------------------------------------------------------------

    def _put_block(self, deliver: Callable[[Any], None], value: Any) -> None:
        with self._lock:
            if self._data + self._held >= self.capacity and not self._closed:
                started = _perf()
                lock = self._lock
                waiting = self._waiting
                resume = stall_begins()
                while True:
                    # in the queue before the last check: a batch frees its slots without
                    # the lock, and a slot freed after this check sees the waiter
                    waiter = _new_lock()
                    waiter.acquire()
                    waiting.append(waiter)
                    if self._data + self._held < self.capacity or self._closed:
                        waiting.remove(waiter)
                        break
                    lock.release()
                    try:
                        waiter.acquire()  # released by whoever frees a slot, or by close
                    except BaseException:  # interrupted (Ctrl-C): leave no waiter behind
                        lock.acquire()
                        try:
                            waiting.remove(waiter)
                        except ValueError:  # a slot was handed to it meanwhile: hand it on
                            self._free_slot()
                        raise
                    lock.acquire()
                resume()
                blocked = _perf() - started
                self._counters.add_blocked(blocked)
                charge_stall(blocked)
            if self._closed:
                self._counters.drop("stopped")
                return
            self._inbox.append((deliver, value))
            self._data += 1
            if self._idle:
                self._wake_thread()

    def _put_latest(self, deliver: Callable[[Any], None], value: Any) -> None:
        with self._lock:
            if self._closed:
                self._counters.drop("stopped")
                return
            inbox = self._inbox
            if self._data >= self.capacity:  # ``latest`` takes no batches: _held is 0
                for index, message in enumerate(inbox):
                    if len(message) == 2:
                        del inbox[index]
                        break
                self._data -= 1
                self._counters.drop("latest")
            inbox.append((deliver, value))
            self._data += 1
            if self._idle:
                self._wake_thread()

    def _put_drop_new(self, deliver: Callable[[Any], None], value: Any) -> None:
        with self._lock:
            if self._closed:
                self._counters.drop("stopped")
                return
            if self._data + self._held >= self.capacity:
                self._counters.drop("drop_new")
                return
            self._inbox.append((deliver, value))
            self._data += 1
            if self._idle:
                self._wake_thread()

    def put_control(self, deliver: Callable[[Any], None], value: Any = None) -> None:
        """Queue a terminal message (completion, error): never dropped, never blocks."""
        with self._lock:
            if not self._closed:
                self._inbox.append((deliver, value, None))
                self._wake_thread()

    # --- scheduler ----------------------------------------------------------------------------

    def clock(self) -> float:
        return _monotonic()

    def set_accepting(self, accepting: bool) -> None:
        if accepting != self._accepting:
            with self._lock:
                self._accepting = accepting
                if accepting:
                    self._wake_thread()

    def _at(self, due: float, timer: _Timer) -> abc.DisposableBase:
        with self._lock:
            if due <= _monotonic():
                self._ready.append(timer)
            else:
                heapq.heappush(self._timers, (due, next(self._seq), timer))
            self._wake_thread()
        return Disposable(timer.cancel)

    def _wake_thread(self) -> None:
        """Wake the thread if it sleeps (once per sleep). Holds the lock."""
        if self._idle:
            self._idle = False
            self._wake.release()

    def _free_slot(self) -> None:
        """Wake the first producer waiting for room, if any. Holds the lock."""
        if self._waiting:
            self._waiting.popleft().release()

    # --- the thread -----------------------------------------------------------------------------

    def _next(self) -> tuple[Callable[[Any], None], Any] | None:
        """The next thing to run, waiting for it; ``None`` once closed. Holds the lock."""
        counters = self._counters
        inbox = self._inbox
        timers = self._timers
        while not self._closed:
            if self._ready:
                return _run_timer, self._ready.popleft()
            timeout = None
            if timers:
                timeout = timers[0][0] - _monotonic()
                if timeout <= 0:
                    return _run_timer, heapq.heappop(timers)[2]
            if inbox and (self._accepting or len(inbox[0]) == 3):
                entry = inbox.popleft()
                if len(entry) == 2:
                    self._data -= 1
                    self._free_slot()
                return entry[0], entry[1]
            started = _perf()
            self._idle = True
            self._lock.release()
            try:
                woken = self._wake.acquire(True, -1 if timeout is None else timeout)
            finally:
                self._lock.acquire()
            if self._idle:  # timed out, nobody woke it
                self._idle = False
            elif not woken:  # woken as the wait timed out: take the wake-up
                self._wake.acquire()
            counters.wait_s += _perf() - started
        return None

    def _loop(self) -> None:
        counters = self._counters
        charge_stalls_to(counters)
        lock = self._lock
        inbox = self._inbox
        ready = self._ready
        timers = self._timers
        waiting = self._waiting
        perf = _perf
        batching = self._batch
        batch: deque[tuple[Any, ...]] = deque()
        entry: Any = None
        job: Any = None
        value: Any = None
        while True:
            with lock:
                # the common case first: items wait, no timer, the stage takes items
                if inbox and not ready and not timers and self._accepting:
                    entry = inbox.popleft()
                    if len(entry) == 2:  # data (control entries have a third field)
                        self._data -= 1
                    if batching and inbox:  # a backlog: take it all, in order; the rest
                        batch.extend(inbox)  # hold their slots until they start
                        inbox.clear()
                        held = self._data  # depth reads without the lock: never overcount
                        self._data = 0
                        self._held = held
                    if waiting and len(entry) == 2:
                        waiting.popleft().release()
                    deliver, value = entry[0], entry[1]
                else:
                    job = self._next()
                    if job is None:
                        return
                    deliver, value = job
            started = perf()
            stalled = counters.stalled_s
            counters.current = value  # for the run's watchdog: what this thread is on
            try:
                deliver(value)
                if batch:
                    entry = value = None  # as below: the batch's first is done with
                    batched, started = started, 0.0  # the batch counts the work from here
                    self._run_batch(batch, batched, stalled)
            except BaseException as exc:  # the engine's own failure: end the run, name the stage
                self._on_crash(exc)
                return
            finally:
                counters.current = None
                if started:
                    counters.work_s += perf() - started - (counters.stalled_s - stalled)
                # keep no item alive while waiting for the next (leases, CUDA refs, memory)
                entry = job = value = None
                if batch:
                    self._drop_held(batch)

    def _run_batch(self, batch: deque[tuple[Any, ...]], started: float, stalled: float) -> None:
        """Deliver ``batch`` in order, each leaving it (and freeing its slot) as it starts, so
        the batch keeps no delivered item alive; stop early on a close, a timer, or a stage
        that stops accepting. Counts the work since ``started`` (``stalled``: the stalled
        time then) as an item ends, about every :data:`LIVE_S`, so statistics read live
        under a backlog that never ends (one clock read an item)."""
        ready = self._ready
        timers = self._timers
        waiting = self._waiting
        counters = self._counters
        perf = _perf
        live = LIVE_S
        stride = countdown = 1  # the first item tells fast from slow
        pop = batch.popleft
        try:
            while batch:
                if self._closed or ready or timers or not self._accepting:
                    return
                entry = pop()
                if len(entry) == 2:
                    self._held -= 1
                    if waiting:  # read without the lock: see _put_block
                        with self._lock:
                            self._free_slot()
                counters.current = entry[1]
                entry[0](entry[1])
                countdown -= 1
                if not countdown:  # see LIVE_ITEMS
                    done = perf()
                    if done - started > live:
                        now_stalled = counters.stalled_s
                        counters.work_s += done - started - (now_stalled - stalled)
                        started, stalled = done, now_stalled
                        stride = 1
                    elif done - started < live / LIVE_ITEMS:
                        stride = LIVE_ITEMS
                    countdown = stride
        finally:
            counters.work_s += perf() - started - (counters.stalled_s - stalled)

    def _drop_held(self, batch: deque[tuple[Any, ...]]) -> None:
        """What a batch left: back to the front of the inbox, or counted as dropped
        (``stopped``) when the inbox is closed. Empties ``batch``."""
        with self._lock:
            held = self._held  # depth reads without the lock: never count one twice
            self._held = 0
            if self._closed:
                if held:
                    self._counters.drop("stopped", held)
            else:
                self._inbox.extendleft(reversed(batch))
                self._data += held
            batch.clear()


def _run_timer(timer: _Timer) -> None:
    timer.run()
