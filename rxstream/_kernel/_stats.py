"""Per-stage counters (mutable, owned by a run) and their frozen public snapshot."""

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rxstream._table import table

__all__ = [
    "StageCounters",
    "StageStatistics",
    "egressed",
    "format_statistics",
    "stats_from_wire",
    "stats_to_wire",
]


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
    cutovers: int = 0
    """Items marked ``cutover=True`` that reached this stage (a steer or a bind swap)."""
    dropped: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Items dropped here, by reason (``latest``, ``drop_new``, ``error``, ``stopped``…)."""
    inbox_depth: int = 0
    """Items waiting in the stage's inbox when the snapshot was taken."""
    inbox_capacity: int = 0
    """The inbox's bound (0 for a source, which has no inbox)."""
    wait_s: float = 0.0
    """Seconds the stage's thread spent idle, waiting for an item or a timer."""
    work_s: float = 0.0
    """Seconds the stage's thread spent working (its function; a stalled hand-off excluded)."""
    blocked_s: float = 0.0
    """Seconds upstream threads spent blocked on this stage's full inbox (backpressure)."""
    stalled_s: float = 0.0
    """Seconds this stage's thread spent blocked handing items to a full inbox downstream."""
    failed_pulls: int = 0
    """Pulls of a source that raised under ``on_error="skip"``: they made no item, so they
    are not drops (a failing stage's item is: dropped, reason ``error``)."""
    zero_copy: int = 0
    """Items this stage sent across a rank boundary's shared-memory ring in place: their
    arrays were written into a slot leased with ``ctx.lease`` (docs/ranks.md)."""
    copies: int = 0
    """Items this stage sent across a shared-memory ring whose arrays were copied into a slot."""
    fused_into: str = ""
    """The stage whose thread runs this one, for a pipe built with ``fuse=True`` in a threaded
    run (no inbox, no thread of its own; its wait and work time are that thread's); else ``""``."""

    @property
    def dropped_total(self) -> int:
        """All drops at this stage, whatever the reason."""
        return sum(self.dropped.values())


class StageCounters:
    """The live counters behind :class:`StageStatistics`.

    ``items_in``/``items_out``/``cutovers``/``wait_s``/``work_s``/``stalled_s``/``failed_pulls``
    and ``zero_copy``/``copies`` have one writer (the stage's thread);
    drops and ``blocked_s`` come from several threads and go through a lock.
    """

    __slots__ = (
        "_drops",
        "_lock",
        "blocked_s",
        "copies",
        "cutovers",
        "failed_pulls",
        "held",
        "items_in",
        "items_out",
        "kind",
        "name",
        "stalled_s",
        "wait_s",
        "work_s",
        "zero_copy",
    )

    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind
        self.items_in = 0
        self.items_out = 0
        self.cutovers = 0
        self.wait_s = 0.0
        self.work_s = 0.0
        self.blocked_s = 0.0
        self.stalled_s = 0.0
        self.failed_pulls = 0
        self.zero_copy = 0
        self.copies = 0
        self._drops: dict[str, int] = {}
        self._lock = threading.Lock()
        self.held = 0
        """Items the stage holds until one of its timers releases them: a ``pace`` buffer's
        frames (until their ticks), a timed ``window``'s open window (until it closes). One
        writer (the stage's thread); read by ``testing.wait_idle``, which waits for them."""

    def drop(self, reason: str, count: int = 1) -> None:
        """Count ``count`` items dropped for ``reason``."""
        with self._lock:
            self._drops[reason] = self._drops.get(reason, 0) + count

    def add_blocked(self, seconds: float) -> None:
        """Add time an upstream thread spent blocked on this stage's inbox."""
        with self._lock:
            self.blocked_s += seconds

    def snapshot(self, depth: int = 0, capacity: int = 0) -> "StageStatistics":
        """A frozen copy of the counters now."""
        with self._lock:
            drops = MappingProxyType(dict(self._drops))
            blocked = self.blocked_s
        return StageStatistics(
            name=self.name,
            kind=self.kind,
            items_in=self.items_in,
            items_out=self.items_out,
            cutovers=self.cutovers,
            dropped=drops,
            inbox_depth=depth,
            inbox_capacity=capacity,
            wait_s=self.wait_s,
            work_s=self.work_s,
            blocked_s=blocked,
            stalled_s=self.stalled_s,
            failed_pulls=self.failed_pulls,
            zero_copy=self.zero_copy,
            copies=self.copies,
        )


def format_statistics(stats: Mapping[str, "StageStatistics"]) -> str:
    """A fixed-width table of per-stage statistics, one row per stage, upstream first.

    Where a stage sent arrays across a shared-memory ring, a last column ``zero copy`` says how
    many of them crossed in place, of all it sent with arrays (``zero_copy/(zero_copy+copies)``).
    """
    header = (
        "stage",
        "kind",
        "in",
        "out",
        "cutovers",
        "dropped",
        "depth",
        "wait s",
        "work s",
        "stalled s",
    )
    rows: list[tuple[str, ...]] = [header]
    for s in stats.values():
        drops = ", ".join(f"{k}={v}" for k, v in sorted(s.dropped.items())) or "-"
        depth = f"{s.inbox_depth}/{s.inbox_capacity}" if s.inbox_capacity else "-"
        rows.append(
            (
                s.name,
                s.kind,
                str(s.items_in),
                str(s.items_out),
                str(s.cutovers),
                drops,
                depth,
                f"{s.wait_s:.3f}",
                f"{s.work_s:.3f}",
                f"{s.stalled_s:.3f}",
            )
        )
    if any(s.fused_into for s in stats.values()):  # fuse=True: whose thread runs each
        rows = [rows[0] + ("thread",)] + [
            (*row, f"fused into {s.fused_into}" if s.fused_into else "own")
            for row, s in zip(rows[1:], stats.values(), strict=True)
        ]
    if any(s.zero_copy or s.copies for s in stats.values()):
        sent = [s.zero_copy + s.copies for s in stats.values()]
        rows = [rows[0] + ("zero copy",)] + [
            (*row, f"{s.zero_copy}/{n}" if n else "-")
            for row, s, n in zip(rows[1:], stats.values(), sent, strict=True)
        ]
    return "\n".join(table(rows, left=2))


def stats_to_wire(stats: Mapping[str, StageStatistics]) -> dict[str, dict[str, Any]]:
    """Statistics as plain dicts, to cross a process boundary (a MappingProxyType does not
    pickle); :func:`stats_from_wire` reads them back."""
    return {
        name: {**stage.__dict__, "dropped": dict(stage.dropped)} for name, stage in stats.items()
    }


def stats_from_wire(payload: Mapping[str, Mapping[str, Any]]) -> dict[str, StageStatistics]:
    """The statistics :func:`stats_to_wire` sent."""
    return {
        name: StageStatistics(**{**fields, "dropped": MappingProxyType(dict(fields["dropped"]))})
        for name, fields in payload.items()
    }


def egressed(stats: Mapping[str, StageStatistics]) -> int:
    """Items the sinks among ``stats`` egressed."""
    return sum(s.items_out for s in stats.values() if s.kind == "stream")
