"""A run's watchdog: a stage busy on one item far longer than its own history is said at once.

A stage thread records only what it has: the item (or timer) it starts, one store into its
counters (``StageCounters.current``), and ``None`` as it goes back to its inbox or stalls on a
full one downstream (:func:`~rxstream.runtime._thread.stall_begins`). This thread, one per
threaded run, scans every stage about every :data:`SCAN_S`: the same item seen at two scans,
with no work, wait or stall counted in between, is one busy episode, timed from the first scan that
saw it. One past its bound — ``busy_limit_s`` when set (``ctx.busy_limit_s``, or the
environment variable :data:`BUSY_ENV`), else ``max(BUSY_MIN_S, BUSY_FACTOR x`` the stage's mean
work an item ``)``, :data:`BUSY_FIRST_S` for its first item — is warned about once (a warning,
one line on the console log) and counted in the stage's statistics (``overdue``,
``longest_s``, ``longest_on``), which the status line and the end-of-run summary of
``rxstream run`` show. Nothing of this is on the per-item path but those stores (two an
item; a source's pull, three), and the watchdog remembers an item by its ``id``: it keeps
none alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from rxstream._kernel._stats import StageCounters, duration_text
from rxstream._util import library_logger
from rxstream.item import PipelineItem
from rxstream.operators._source import SourcePuller
from rxstream.runtime._seconds import seconds_from_env

__all__ = [
    "BUSY_ENV",
    "BUSY_FACTOR",
    "BUSY_FIRST_S",
    "BUSY_MIN_S",
    "SCAN_S",
    "Watchdog",
    "busy_limit_from_env",
    "describe",
]

_log = library_logger("rxstream")

BUSY_ENV = "RXSTREAM_BUSY_S"
"""Sets the bound for every stage of a run (seconds, > 0), unless ``ctx.busy_limit_s`` does."""
BUSY_MIN_S = 1.0
"""The default bound's floor: a stage is busy past its bound after at least this long."""
BUSY_FIRST_S = 10.0
"""The default bound of a stage's first item (no history yet; a warm-up takes a while)."""
BUSY_FACTOR = 20.0
"""The default bound: this many times the stage's mean work an item (or :data:`BUSY_MIN_S`)."""
SCAN_S = 0.1
"""How often the watchdog looks (an episode is timed to within this)."""


def busy_limit_from_env() -> float | None:
    """The bound :data:`BUSY_ENV` sets; ``None`` when unset (the default rule)."""
    return seconds_from_env(BUSY_ENV, None)


def describe(work: object) -> str:
    """What a stage thread is on, for a message: ``pts=12, input_seq=40`` for an item."""
    if isinstance(work, PipelineItem):
        md = work.metadata
        return f"pts={md.pts}, input_seq={md.input_seq}"
    if isinstance(work, SourcePuller):
        return "its next pull"
    return "a timer or message"


def _finished(counters: StageCounters) -> int:
    """Items the stage finished: those it started (``items_in``) but the one it is on (a
    source counts a pull once it made an item)."""
    if counters.kind in ("source", "input"):
        return counters.items_in
    return max(counters.items_in - 1, 0)


class Watchdog:
    """Scans the stages of one run (their counters, by name) on a thread of its own.

    ``limit_s`` is every stage's bound (``None``: the default rule); ``where`` names the rank
    in the warnings (``""`` for one process); ``fused`` the stages fused onto each thread
    (the warning names them too: the item may be theirs).
    """

    def __init__(
        self,
        stages: Mapping[str, StageCounters],
        limit_s: float | None = None,
        *,
        where: str = "",
        fused: Mapping[str, Sequence[str]] | None = None,
        scan_s: float = SCAN_S,
    ) -> None:
        self._stages = dict(stages)
        self._fused = dict(fused or {})
        """Per stage, the stages fused onto its thread (``fuse=True``): one of them may be it."""
        self._limit_s = limit_s
        self._where = where
        self._scan_s = scan_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._keys: dict[str, tuple[float, float, float]] = {}
        """Per stage, (work_s, wait_s, stalled_s) at the scan that saw its current item first:
        any of them counted since, and the thread did something else meanwhile (a stall ended
        and the stage took up the same item again: a new episode)."""

    def start(self) -> None:
        """Start scanning (once)."""
        if self._thread is None and self._stages:
            self._thread = threading.Thread(
                target=self._loop, name="rxstream:watchdog", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop scanning (any thread; returns at once). The statistics keep what it saw."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self._scan_s):
            self.scan(time.monotonic())

    def limit(self, counters: StageCounters) -> float:
        """The bound of ``counters``' stage now, in seconds."""
        if self._limit_s is not None:
            return self._limit_s
        items = _finished(counters)
        if not items:  # its first item: a warm-up (imports, a model's first call) is no hang
            return BUSY_FIRST_S
        return max(BUSY_MIN_S, BUSY_FACTOR * counters.work_s / items)

    def scan(self, now: float) -> None:
        """Look at every stage once (``now``: ``time.monotonic()``)."""
        for name, counters in self._stages.items():
            busy = counters.busy
            current = counters.current
            if current is None:
                if busy.seen is not None:
                    busy.seen = None
                    busy.now_s, busy.now_on = 0.0, ""
                continue
            key = (counters.work_s, counters.wait_s, counters.stalled_s)  # all still: one item
            if id(current) != busy.seen or self._keys.get(name) != key:
                # its id, not the item: the watchdog keeps no item alive (a lease, a frame)
                busy.seen, busy.since, busy.warned = id(current), now, False
                busy.now_s, busy.now_on = 0.0, ""
                self._keys[name] = key
                continue
            elapsed = now - busy.since
            if not busy.now_on:
                busy.now_on = describe(current)
            busy.now_s = elapsed
            limit = self.limit(counters)
            if elapsed <= limit:
                continue
            if elapsed > busy.longest_s:
                busy.longest_s, busy.longest_on, busy.longest_limit_s = elapsed, busy.now_on, limit
            if not busy.warned:
                busy.warned = True
                busy.episodes += 1
                _log.warning(self.message(name, counters, elapsed, limit))

    def message(self, name: str, counters: StageCounters, elapsed: float, limit: float) -> str:
        """The warning's one line."""
        items = _finished(counters)
        where = f" ({self._where})" if self._where else ""
        riders = self._fused.get(name)
        if riders:
            where += f" (or {', '.join(map(repr, riders))}, fused onto its thread)"
        if self._limit_s is not None:
            rule = f"the bound is {duration_text(limit)}, {BUSY_ENV} or ctx.busy_limit_s"
        elif items:
            rule = f"its mean {duration_text(counters.work_s / items)} an item"
        else:
            rule = f"its first item, allowed {duration_text(limit)}"
        return (
            f"stage {name!r}{where} has been busy on one item ({counters.busy.now_on}) for "
            f"{duration_text(elapsed)} ({rule})"
        )
