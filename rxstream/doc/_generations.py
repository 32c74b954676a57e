"""Generations: the control state that makes steers and flushes cut over cleanly.

``prompt`` counts steers; items stamped with a ``prompt_generation`` below ``drop`` are stale
and dropped at their next hop. ``flush`` counts flushes; a stage with ``reset()`` resets when
it first sees an item of a newer flush generation. Sources stamp all three on every item.
"""

import threading
import time
from dataclasses import dataclass

__all__ = ["GenerationState", "Generations"]


@dataclass(frozen=True)
class GenerationState:
    """The generations at one moment."""

    prompt: int = 0
    """Steers so far: the ``prompt_generation`` new items get."""
    flush: int = 0
    """Flushes so far: the ``flush_generation`` new items get."""
    drop: int = 0
    """Items with a ``prompt_generation`` below this are stale."""


class Generations:
    """The live generation counters of one context (one writer lock, lock-free reads)."""

    __slots__ = ("_lock", "drop", "flush", "prompt", "steered_at")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt = 0
        self.flush = 0
        self.drop = 0
        self.steered_at = 0.0
        """When the last steer happened (``time.monotonic``): the origin of cutover timing."""

    def steer(self, *, drop_stale: bool = True) -> int:
        """Start a new prompt generation; unless ``drop_stale=False`` older items go stale."""
        with self._lock:
            self.steered_at = time.monotonic()
            self.prompt += 1
            if drop_stale:
                self.drop = self.prompt
            return self.prompt

    def bump_flush(self) -> int:
        """Start a new flush generation."""
        with self._lock:
            self.flush += 1
            return self.flush

    def state(self) -> "GenerationState":
        """The counters now, frozen."""
        with self._lock:
            return GenerationState(self.prompt, self.flush, self.drop)
