"""``ctx.input(name)``: a client-fed stream (mouse, keys, audio chunks…).

``feed(sample, at_ms=None)`` (from any thread: the transport, a test, ``pipeline.feed``) stamps
the receive time and the per-stream ``input_seq`` (from 1) and queues the sample; the input
stage's source pulls it. ``input_at_ms`` is the client's timestamp when it sent one, else the
receive time (wall clock, ms). The first stamp of the item is ``input.recv``. Limits are
enforced at ``feed``: a sample that would pass the stream's bound is refused with
:class:`~rxstream.topology.ClientStreamLimitExceeded` and nothing else is affected.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, NamedTuple

from rxstream.item import now
from rxstream.topology import ClientStreamLimitExceeded, ClientStreamLimits

__all__ = ["InputFeed", "InputSample"]


class InputSample(NamedTuple):
    """One fed sample, as queued for the input stage."""

    payload: Any
    input_seq: int
    input_at_ms: int
    received: float


class InputFeed:
    """The queue between whoever feeds a client stream and the input stage that pulls it."""

    def __init__(self, name: str, limits: ClientStreamLimits | None, capacity: int) -> None:
        self.name = name
        self.limits = limits
        self.capacity = capacity
        self._cond = threading.Condition()
        self._queue: deque[InputSample] = deque()
        self._seq = 0
        self._used = 0.0
        self._closed = False
        self.dropped = 0
        self._unreported = 0
        self.waited = 0.0
        """Seconds ``take`` has spent waiting for a sample (the stage's idle time)."""
        self._waiting = False

    @property
    def idle(self) -> bool:
        """Whether the input stage waits in :meth:`take` with nothing queued (every sample
        fed so far has been handed on)."""
        with self._cond:
            return self._waiting and not self._queue

    def feed(self, sample: Any, at_ms: int | None = None) -> int:
        """Queue ``sample`` (``at_ms``: the client's clock, ms); returns its ``input_seq``.

        When the queue is full the oldest waiting sample is dropped (input is real time).
        """
        received = now()
        wall_ms = int(time.time() * 1000)
        with self._cond:
            self._charge(sample)
            self._seq += 1
            if len(self._queue) >= self.capacity:
                self._queue.popleft()
                self.dropped += 1
                self._unreported += 1
            self._queue.append(
                InputSample(sample, self._seq, wall_ms if at_ms is None else int(at_ms), received)
            )
            self._cond.notify()
            return self._seq

    def _charge(self, sample: Any) -> None:
        limits = self.limits
        if limits is None or limits.max_items is None:
            return
        size = 1 if limits.item_size is None else limits.item_size(sample)
        # sizes in seconds are summed in binary floats: allow for their rounding
        if self._used + size > limits.max_items * (1 + 1e-9):
            raise ClientStreamLimitExceeded(
                self.name, limits.max_items, limits.unit, self._used + size
            )
        self._used += size

    def take_dropped(self) -> int:
        """Samples dropped from the full queue since the last call (for the stage's counters)."""
        with self._cond:
            fresh, self._unreported = self._unreported, 0
            return fresh

    def take(self, block: bool) -> InputSample | None:
        """The next sample; ``None`` once closed (or, not blocking, when none is waiting)."""
        with self._cond:
            if not self._queue and block and not self._closed:
                started = time.perf_counter()
                self._waiting = True
                while not self._queue and not self._closed:
                    self._cond.wait()
                self._waiting = False
                self.waited += time.perf_counter() - started
            if not self._queue:
                return None
            return self._queue.popleft()

    def open(self) -> None:
        """Accept a new run (a feed closed by a previous run's stop reopens)."""
        with self._cond:
            self._closed = False

    def close(self) -> None:
        """Wake the stage waiting in :meth:`take`; it ends its stream."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
