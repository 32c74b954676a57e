"""Per-stage counters (mutable, owned by a run) and their frozen public snapshot."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["StageCounters", "StageStatistics"]


@dataclass(frozen=True)
class StageStatistics:
    """A stage's statistics at one moment of a run."""

    name: str
    """The stage's unique name in its pipeline."""
    kind: str
    """The builder that made it: ``source``, ``pipe``, ``pace``, ``stream``…"""
    items_in: int
    """Items the stage started work on (for a source: items it pulled)."""
    items_out: int
    """Items the stage emitted downstream."""
    dropped: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Items dropped here, by reason (``latest``, ``drop_new``, ``error``, ``stopped``…)."""
    inbox_depth: int = 0
    """Items waiting in the stage's inbox when the snapshot was taken."""
    inbox_capacity: int = 0
    """The inbox's bound (0 for a source, which has no inbox)."""
    wait_s: float = 0.0
    """Seconds the stage's thread spent idle, waiting for an item or a timer."""
    work_s: float = 0.0
    """Seconds the stage's thread spent working (its function and the hand-off downstream)."""
    blocked_s: float = 0.0
    """Seconds upstream threads spent blocked on this stage's full inbox (backpressure)."""

    @property
    def dropped_total(self) -> int:
        """All drops at this stage, whatever the reason."""
        return sum(self.dropped.values())


class StageCounters:
    """The live counters behind :class:`StageStatistics`.

    ``items_in``/``items_out``/``wait_s``/``work_s`` have one writer (the stage's thread);
    drops and ``blocked_s`` come from several threads and go through a lock.
    """

    __slots__ = (
        "_drops",
        "_lock",
        "blocked_s",
        "items_in",
        "items_out",
        "kind",
        "name",
        "wait_s",
        "work_s",
    )

    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind
        self.items_in = 0
        self.items_out = 0
        self.wait_s = 0.0
        self.work_s = 0.0
        self.blocked_s = 0.0
        self._drops: dict[str, int] = {}
        self._lock = threading.Lock()

    def drop(self, reason: str, count: int = 1) -> None:
        """Count ``count`` items dropped for ``reason``."""
        with self._lock:
            self._drops[reason] = self._drops.get(reason, 0) + count

    def add_blocked(self, seconds: float) -> None:
        """Add time an upstream thread spent blocked on this stage's inbox."""
        with self._lock:
            self.blocked_s += seconds

    def snapshot(self, depth: int = 0, capacity: int = 0) -> StageStatistics:
        """A frozen copy of the counters now."""
        with self._lock:
            drops = MappingProxyType(dict(self._drops))
            blocked = self.blocked_s
        return StageStatistics(
            name=self.name,
            kind=self.kind,
            items_in=self.items_in,
            items_out=self.items_out,
            dropped=drops,
            inbox_depth=depth,
            inbox_capacity=capacity,
            wait_s=self.wait_s,
            work_s=self.work_s,
            blocked_s=blocked,
        )
