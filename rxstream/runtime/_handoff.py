"""The ``block`` and ``drop_new`` inbox built from two C queues: items and free-slot tokens.

:class:`~rxstream.runtime._thread.StageThread`'s inbox is a deque under a Python lock: every
put and every take runs Python code under that lock, and a producer that finds the thread
holding it sleeps on it. Here the inbox is a :class:`queue.SimpleQueue` of entries and a
:class:`queue.SimpleQueue` of ``capacity`` tokens, one per free slot: a producer takes a token
(waiting for one under ``block``, dropping the item under ``drop_new``) and queues its entry;
the thread takes the entry and gives its token back as the entry's delivery starts. Each of
those is one C call; no Python lock is held by anyone on the per-item path, and the C queues
do the wake-ups (docs/decisions.md, "Two C queues for the bounded hand-off").

What stays as it was: order, capacity (a taken item holds its slot until its delivery
starts), drops and their reasons (``drop_new``, ``stopped``), stall and wait accounting,
timers on the same thread, ``pace``'s ``set_accepting``, close from any thread, a producer
interrupted while waiting for room (Ctrl-C) leaving nothing behind. ``latest``, whose waiting
items must stay replaceable by fresher ones, keeps the deque (:func:`stage_thread` picks).
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any

from reactivex import abc
from reactivex.disposable import Disposable

from rxstream._kernel._inbox import InboxSpec
from rxstream._kernel._scheduler import _Timer
from rxstream._kernel._stats import StageCounters
from rxstream.runtime._thread import (
    LIVE_ITEMS,
    LIVE_S,
    StageThread,
    _monotonic,
    _perf,
    _run_timer,
    charge_stall,
    charge_stalls_to,
    stall_begins,
)

__all__ = ["TokenThread", "stage_thread"]

_WAKE: tuple[Any, ...] = ("wake",)
"""An entry that only wakes the thread (a timer, ``set_accepting``, a close): one field, where
data has two and control three."""

_WAIT = (True,)
_NOWAIT = (False,)
"""Arguments for ``map``: one call of ``get(True)`` (waits), one of ``get(False)``."""

TOKENS_MAX = 1 << 16
"""The largest capacity given tokens (one object each, made up front); above it the deque."""


class TokenThread(StageThread):
    """A :class:`StageThread` whose inbox is two C queues (see the module docstring).

    Entries the thread took while its stage does not accept (``pace``) wait, in order, in
    ``_taken``, their tokens held; a close counts them as dropped (``stopped``).
    """

    @classmethod
    def takes(cls, spec: InboxSpec) -> bool:
        """``block`` and ``drop_new`` up to :data:`TOKENS_MAX` slots."""
        return spec.policy != "latest" and spec.capacity <= TOKENS_MAX

    def __init__(
        self,
        name: str,
        spec: InboxSpec,
        counters: StageCounters,
        on_crash: Callable[[BaseException], None],
    ) -> None:
        super().__init__(name, spec, counters, on_crash)
        self._items: SimpleQueue[tuple[Any, ...]] = SimpleQueue()
        self._tokens: SimpleQueue[None] = SimpleQueue()
        for _ in range(spec.capacity):
            self._tokens.put(None)
        self._taken: deque[tuple[Any, ...]] = deque()
        """Entries taken while the stage did not accept, not started (the thread's alone)."""
        self._takes = 0
        """Counts the thread's waits that ended (``idle`` reads it twice: nothing slipped by)."""
        self._ident: int | None = None
        self.put = self._putter(spec.policy == "block")

    # --- producers --------------------------------------------------------------------------

    def _putter(self, block: bool) -> Callable[[Callable[[Any], None], Any], None]:
        """The per-item put: a token (a free slot), then the entry; two C calls.

        Off the main thread no signal handler runs, so nothing lands between the two: the
        lean path. On the main thread a Ctrl-C (a signal handler's ``KeyboardInterrupt``) can
        land between any two bytecodes, one just after a C call returned included, so the
        token and then the entry are taken into ``box`` from C (``map`` calls the queue,
        ``list.extend`` stores what it returns, with no bytecode in between): wherever the
        interrupt lands, ``box`` says what was done. Empty, nothing (a blocking ``get`` that
        is interrupted takes no token); one, the token, which goes back; two, the entry is
        queued, and will be delivered or counted.
        """
        take_token = self._tokens.get
        free = self._tokens.qsize
        give_token = self._tokens.put
        put_entry = self._items.put
        counters = self._counters
        ident = threading.get_ident
        main = threading.main_thread().ident

        def put(deliver: Callable[[Any], None], value: Any) -> None:
            if self._closed:
                counters.drop("stopped")
                return
            if ident() != main:
                # a full inbox is asked first: an ``Empty`` raised and caught costs a µs
                if free():
                    try:
                        take_token(False)
                    except Empty:  # another producer took the one counted
                        if not self._room(block, []):
                            return
                elif not self._room(block, []):
                    return
                put_entry((deliver, value))
            else:
                box: list[None] = []
                try:
                    if free():
                        try:  # noqa: SIM105 (``contextlib.suppress`` costs ~0.3 µs an item)
                            box.extend(map(take_token, _NOWAIT))
                        except Empty:  # another producer took the one counted
                            pass
                    if not box and not self._room(block, box):
                        return
                    box.extend(map(put_entry, ((deliver, value),)))
                except BaseException:
                    if len(box) == 1:  # a token taken, no entry queued: the slot goes back
                        give_token(None)
                    raise
            if self._closed:  # closed between the check and the put
                self._closed_after_put()

        return put

    def _room(self, block: bool, box: list[None]) -> bool:
        """No free slot now: wait for one (``block``; its token lands in ``box``) or drop the
        item (``drop_new``); whether the item goes in."""
        if block:
            self._wait_for_room(box)
            return bool(box)
        self._counters.drop("drop_new")
        return False

    def _wait_for_room(self, box: list[None]) -> None:
        """Wait for a free slot, its token taken into ``box`` (from C, see
        :meth:`_putter`), charging the wait; ``box`` left empty (the token handed on)
        when closed meanwhile. A Ctrl-C that interrupts the wait takes no token."""
        started = _perf()
        resume = stall_begins()
        box.extend(map(self._tokens.get, _WAIT))
        resume()
        blocked = _perf() - started
        self._counters.add_blocked(blocked)
        charge_stall(blocked)
        if self._closed:
            self._tokens.put(None)  # close's wake-up: hand it on to the next waiting producer
            box.clear()
            self._counters.drop("stopped")

    def _closed_after_put(self) -> None:
        """A put that queued its entry as a close came (after close's sweep, perhaps): sweep
        again, counting it, and give a token back, for the token this put took may be the
        one close left to wake the producers waiting for room."""
        self._drain()
        self._tokens.put(None)

    def put_control(self, deliver: Callable[[Any], None], value: Any = None) -> None:
        """Queue a terminal message (completion, error): never dropped, never blocks. One
        that lands after a close is not delivered: the thread starts nothing it takes once
        closed."""
        if not self._closed:
            self._items.put((deliver, value, None))

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop taking work, wake the thread and every producer waiting for room.

        Data items still queued are counted as dropped (``stopped``); so are those the thread
        took and had not started, counted by the thread as it ends. Safe from any thread.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._drain()  # and wakes the thread
        self._tokens.put(None)  # each producer woken by it passes it on

    def _drain(self) -> None:
        """Empty the queue, counting its data as dropped (``stopped``), then queue the
        thread's wake-up again; once closed. (Whoever sweeps may take the wake-up that close
        queued, or a concurrent sweep's: the last thing a sweep does is queue one.)"""
        take = self._items.get_nowait
        dropped = 0
        while True:
            try:
                entry = take()
            except Empty:
                break
            if len(entry) == 2:
                dropped += 1
        if dropped:
            self._counters.drop("stopped", dropped)
        self._items.put(_WAKE)

    @property
    def depth(self) -> int:
        """Data items waiting now: the slots whose tokens are out (0 once closed)."""
        if self._closed:
            return 0
        return max(0, self.capacity - self._tokens.qsize())

    @property
    def idle(self) -> bool:
        """Whether the thread waits for work with nothing queued: no item, no message, no
        timer due (a timer due later, such as a ``pace`` tick, does not count)."""
        takes = self._takes
        idle = (
            self._idle
            and self._tokens.qsize() >= self.capacity
            and not self._items.qsize()
            and not self._taken
            and not self._ready
        )
        return idle and takes == self._takes

    # --- scheduler ----------------------------------------------------------------------------

    def set_accepting(self, accepting: bool) -> None:
        if accepting != self._accepting:
            self._accepting = accepting
            if accepting and threading.get_ident() != self._ident:
                self._items.put(_WAKE)

    def _at(self, due: float, timer: _Timer) -> abc.DisposableBase:
        with self._lock:
            if due <= _monotonic():
                self._ready.append(timer)
            else:
                heapq.heappush(self._timers, (due, next(self._seq), timer))
        if threading.get_ident() != self._ident:  # the thread itself looks before it waits
            self._items.put(_WAKE)
        return Disposable(timer.cancel)

    # --- the thread -----------------------------------------------------------------------------

    @staticmethod
    def _take(take: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...] | None:
        """The next entry without waiting (``None``: a close emptied the queue meanwhile)."""
        try:
            return take()
        except Empty:
            return None

    def _wait(self, timeout: float | None) -> tuple[Any, ...] | None:
        """The next entry, waiting up to ``timeout`` (``None``: timed out)."""
        started = _perf()
        self._idle = True
        try:
            return self._items.get(True, timeout)
        except Empty:
            return None
        finally:
            self._takes += 1
            self._idle = False
            self._counters.wait_s += _perf() - started

    def _next(self) -> tuple[Callable[[Any], None], Any] | None:
        """The next thing to run when the quick path cannot say: a timer, a taken entry, or
        whatever arrives (kept in ``_taken`` while the stage does not accept); ``None`` once
        closed."""
        ready = self._ready
        timers = self._timers
        taken = self._taken
        while not self._closed:
            with self._lock:
                if ready:
                    return _run_timer, ready.popleft()
                timeout = None
                if timers:
                    timeout = timers[0][0] - _monotonic()
                    if timeout <= 0:
                        return _run_timer, heapq.heappop(timers)[2]
            accepting = self._accepting
            if taken and (accepting or len(taken[0]) == 3):
                entry = taken.popleft()
            else:
                got = self._take(self._items.get_nowait) if self._items.qsize() else None
                if got is None:
                    got = self._wait(timeout)
                    if got is None:
                        continue
                entry = got
                if len(entry) == 1:  # a wake-up
                    continue
                if taken or not (accepting or len(entry) == 3):
                    taken.append(entry)  # behind the front, in order
                    continue
            if self._closed:  # nothing starts after a close (as the deque inbox)
                if len(entry) == 2:
                    self._counters.drop("stopped")
                return None
            if len(entry) == 2:
                self._tokens.put(None)
            return entry[0], entry[1]
        return None

    def _loop(self) -> None:
        self._ident = threading.get_ident()
        counters = self._counters
        charge_stalls_to(counters)
        items = self._items
        take = items.get_nowait
        waiting = items.qsize
        free = self._tokens.put
        ready = self._ready
        timers = self._timers
        taken = self._taken
        perf = _perf
        live = LIVE_S
        stride = 1  # the first items tell fast from slow
        entry: Any = None
        value: Any = None
        try:
            while not self._closed:
                deliver: Callable[[Any], None] | None = None
                if not (ready or timers or taken) and self._accepting:
                    # the common case: take the queue's next entry (a wait only when empty;
                    # asked first: an ``Empty`` raised and caught costs a µs)
                    entry = None
                    if waiting():
                        try:
                            entry = take()
                        except Empty:  # a close emptied it since ``waiting()``
                            entry = None
                    if entry is None:
                        entry = self._wait(None)
                    if entry is not None and len(entry) != 1:
                        if self._closed:  # nothing starts after a close (as the deque inbox)
                            if len(entry) == 2:
                                counters.drop("stopped")
                            return
                        if len(entry) == 2:
                            free(None)  # the slot frees as the delivery starts
                        deliver, value = entry[0], entry[1]
                else:
                    job = self._next()
                    if job is None:
                        return
                    deliver, value = job
                if deliver is None:
                    continue
                started = perf()
                stalled = counters.stalled_s
                countdown = stride
                counters.current = value  # for the run's watchdog: what this thread is on
                try:
                    deliver(value)
                    entry = value = None  # as below: the first is done with
                    # a backlog: the next entries back to back, in one span of work
                    # (``taken``, a local's truth test, asked first: only ``_next`` fills it)
                    while not taken and waiting() and not (ready or timers):
                        if not self._accepting:
                            break
                        try:
                            entry = take()
                        except Empty:  # a close emptied it since ``waiting()``
                            break
                        if self._closed:  # nothing starts after a close
                            if len(entry) == 2:
                                counters.drop("stopped")
                            break
                        if len(entry) == 2:
                            free(None)
                            deliver, value = entry
                        elif len(entry) == 1:
                            continue
                        else:
                            deliver, value = entry[0], entry[1]
                        entry = None
                        counters.current = value
                        deliver(value)
                        # the work so far, as an item ends, about every LIVE_S: live statistics
                        # under a backlog that never ends (a clock read every LIVE_ITEMS fast
                        # items, after every item once items take a while)
                        countdown -= 1
                        if not countdown:
                            done = perf()
                            if done - started > live:
                                now_stalled = counters.stalled_s
                                counters.work_s += done - started - (now_stalled - stalled)
                                started, stalled = done, now_stalled
                                stride = 1
                            elif done - started < live / LIVE_ITEMS:
                                stride = LIVE_ITEMS
                            countdown = stride
                except BaseException as exc:  # the engine's own failure: end the run, name it
                    self._on_crash(exc)
                    return
                finally:
                    counters.current = None
                    counters.work_s += perf() - started - (counters.stalled_s - stalled)
                    # keep no item alive while waiting for the next (leases, CUDA refs, memory)
                    entry = value = deliver = None
        finally:
            self._settle()

    def _settle(self) -> None:
        """As the thread ends: what it took and did not start is dropped (``stopped``) when
        closed, else queued again for close to count (or counted here, when a close swept the
        queue meanwhile)."""
        taken = self._taken
        if self._closed:
            dropped = sum(len(entry) == 2 for entry in taken)
            if dropped:
                self._counters.drop("stopped", dropped)
            taken.clear()
            self._drain()
            return
        while taken:
            self._items.put(taken.popleft())
        if self._closed:  # a close came since the check: its sweep may have missed them
            self._drain()


def stage_thread(
    name: str,
    spec: InboxSpec,
    counters: StageCounters,
    on_crash: Callable[[BaseException], None],
) -> StageThread:
    """The thread for a stage's inbox of ``spec``: under ``block`` and ``drop_new`` (a capacity
    up to :data:`TOKENS_MAX`) a :class:`TokenThread`'s two C queues; under ``latest``, whose
    waiting items a fresher one can replace, and the largest capacities, the deque of
    :class:`~rxstream.runtime._thread.StageThread`."""
    kind = TokenThread if TokenThread.takes(spec) else StageThread
    return kind(name, spec, counters, on_crash)
