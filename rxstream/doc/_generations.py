"""Generations: the control state that makes steers and flushes cut over cleanly.

``prompt`` counts steers; items stamped with a ``prompt_generation`` below ``drop`` are stale
and dropped at their next hop. ``flush`` counts flushes; a stage with ``reset()`` resets when
it first sees an item of a newer flush generation. Sources stamp all three on every item.
"""

import threading
import time
from collections.abc import Callable
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

    __slots__ = ("_lock", "drop", "epoch", "flush", "listeners", "prompt", "steered_at")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt = 0
        self.flush = 0
        self.drop = 0
        self.epoch = 0
        """Counts every change (steer, flush, replica): one compare tells "nothing changed"."""
        self.steered_at = 0.0
        """When the last steer happened (``time.monotonic``): the origin of cutover timing."""
        self.listeners: list[Callable[[GenerationState], None]] = []
        """Called with the new state after every steer or flush (the launcher replicates)."""

    def steer(self, *, drop_stale: bool = True) -> int:
        """Start a new prompt generation; unless ``drop_stale=False`` older items go stale."""
        with self._lock:
            self.steered_at = time.monotonic()
            self.epoch += 1
            self.prompt += 1
            if drop_stale:
                self.drop = self.prompt
            prompt = self.prompt
        self._tell()
        return prompt

    def bump_flush(self) -> int:
        """Start a new flush generation."""
        with self._lock:
            self.flush += 1
            self.epoch += 1
            flush = self.flush
        self._tell()
        return flush

    def _tell(self) -> None:
        if self.listeners:
            state = self.state()
            for listener in tuple(self.listeners):
                listener(state)

    def replicate(self, state: "GenerationState", steered_at: float) -> None:
        """Take the controller's generations (on another rank of the same host)."""
        with self._lock:
            self.steered_at = steered_at
            self.epoch += 1
            self.prompt = max(self.prompt, state.prompt)
            self.flush = max(self.flush, state.flush)
            self.drop = max(self.drop, state.drop)

    def state(self) -> "GenerationState":
        """The counters now, frozen."""
        with self._lock:
            return GenerationState(self.prompt, self.flush, self.drop)
