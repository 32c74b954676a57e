"""How a ring's waiting side learns of the other side's step: a short bounded spin, then sleep.

A ring tells its consumer of a written slot through a pipe: the producer writes the slot's
index, the consumer's blocking ``read`` returns it. When the consumer is asleep in that
``read``, the kernel has to wake it, which on these machines costs most of a small item's
trip (~20 µs across cores) and, after a frame's 6 MB copy, 40-50 µs of the producer's CPU in
that write. A consumer that is still awake when the producer commits skips it: before it
sleeps, :func:`spin` watches the ring's ``sent`` word in shared memory (the producer sets it
just after writing the pipe) for at most ``budget_ns``, giving up the CPU and the GIL on every
turn (``sched_yield``: a producer or a stage thread that shares the core or the interpreter
runs meanwhile). When the word moves, the index is in the pipe, and the ``read`` that follows
returns without sleeping (a word set before the write would let the consumer reach ``read``
first, fall asleep, and make the write wake it after all). The pipe still carries every
index, so a spin that misses costs only its budget: nothing can be lost.

The budget (:func:`spin_budget`) is the ring's ``spin_us``, stretched to 1.5x the time between
the last two items the consumer waited for when that is short: a backlog of frames, each one
copy apart, finds the consumer awake. It is bounded (``MAX_SPIN_US``, 1 ms: a few frames'
copies, never a poll loop): sparse items (an idle or a 24 fps ring) spin ``spin_us`` and no
more, then sleep in ``read`` as before; so does the wait after one that timed out.
"""

import os
import time

from rxstream._exceptions import ArgumentError, ArgumentTypeError

__all__ = ["DEFAULT_SPIN_US", "MAX_SPIN_US", "check_spin_us", "spin", "spin_budget"]

DEFAULT_SPIN_US = 50
"""How long (µs) a ring's consumer watches for the next item before it sleeps, by default:
about one wake-up across cores here, the gap between an ack and the next item of a
producer that waits for replies."""
MAX_SPIN_US = 1000
"""The most a ring takes: a spin is a short bridge over a wake-up, not a poll loop."""

_ns = time.perf_counter_ns


def check_spin_us(spin_us: float) -> None:
    """``ValueError`` (``TypeError``: not a number) naming ``spin_us``, the rule and the value."""
    if isinstance(spin_us, bool) or not isinstance(spin_us, int | float):
        raise ArgumentTypeError(
            f"spin_us must be a number of microseconds, got {spin_us!r} ({type(spin_us).__name__})"
        )
    if not 0 <= spin_us <= MAX_SPIN_US:
        raise ArgumentError(f"spin_us must be between 0 and {MAX_SPIN_US}, got {spin_us}")


_yield = os.sched_yield if hasattr(os, "sched_yield") else lambda: time.sleep(0)


def spin(words: memoryview, at: int, seen: int, closed: int, budget_ns: int) -> bool:
    """Watch ``words[at]`` for a value other than ``seen`` (or ``words[closed]`` set) for at
    most ``budget_ns``, yielding the CPU and the GIL each turn; whether it came."""
    if words[at] != seen or words[closed]:
        return True
    if budget_ns <= 0:
        return False
    deadline = _ns() + budget_ns
    while _ns() < deadline:
        _yield()
        if words[at] != seen or words[closed]:
            return True
    return False


_MAX_SPIN_NS = MAX_SPIN_US * 1000


def spin_budget(base_ns: int, gap_ns: int) -> int:
    """How long (ns) the consumer spins before its next sleep: ``base_ns`` (the ring's
    ``spin_us``), stretched to 1.5x ``gap_ns`` (the time between the last two items it waited
    for) when that gap is short, at most ``MAX_SPIN_US``; ``base_ns`` alone when the gap is
    longer (sparse items: an idle or 24 fps ring spins no more than it did), 0 when
    ``base_ns`` is (the ring sleeps at once)."""
    if base_ns <= 0 or gap_ns > _MAX_SPIN_NS:
        return base_ns
    return min(_MAX_SPIN_NS, max(base_ns, gap_ns * 3 // 2))
