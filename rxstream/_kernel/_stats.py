"""Per-stage counters (mutable, owned by a run) and their frozen public snapshot."""

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rxstream._table import table

__all__ = [
    "Busy",
    "StageCounters",
    "StageStatistics",
    "duration_text",
    "egressed",
    "format_statistics",
    "repeated",
    "stats_from_wire",
    "stats_to_wire",
    "summarize",
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
    repeats: int = 0
    """Of ``items_out``, the idle repeats: items marked ``idle=True`` (``pace`` handing out its
    last frame again because no new one came in time). For a sink, ``items_out - repeats``
    are new frames."""
    busy_s: float = 0.0
    """Seconds the stage's thread has been on the item it works on now (0 while it waits or
    stalls); read by the run's watchdog, to within its scan (a threaded run only)."""
    busy_on: str = ""
    """The item it works on now (``pts=12, input_seq=40``), when ``busy_s`` is not 0."""
    overdue_now: bool = False
    """Whether the item it works on now has kept it busy past its bound (warned about)."""
    overdue: int = 0
    """Times the stage was busy on one item past its bound (docs/concepts.md, "A stage busy
    on one item"): each such episode is warned about once (``stage_busy``)."""
    longest_s: float = 0.0
    """The longest of those episodes, in seconds so far (0 when there was none)."""
    longest_on: str = ""
    """The item of the longest episode (``pts=12, input_seq=40``)."""
    longest_limit_s: float = 0.0
    """The bound that episode passed (seconds)."""
    mean_s: float = 0.0
    """Seconds of work an item, on average over the items this stage finished
    (``work_s / items_in``; 0 before its first)."""
    taken_s: float = field(default=0.0, compare=False, repr=False)
    """When the snapshot was taken, on its process's monotonic clock (0 for one made by
    hand): rates between two snapshots of a rank use that rank's own times."""

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
        "busy",
        "copies",
        "current",
        "cutovers",
        "failed_pulls",
        "held",
        "items_in",
        "items_out",
        "kind",
        "name",
        "repeats",
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
        self.repeats = 0
        """Idle repeats among the items out (counted by the sinks)."""
        self.current: Any = None
        """What the stage's thread works on now (an item, a timer), ``None`` while it waits or
        stalls: one store as an item starts, one as the thread goes back to its inbox; read by
        the run's watchdog (:mod:`rxstream.runtime._watchdog`), which times it."""
        self.busy = Busy()
        """The watchdog's view of this stage (written by the watchdog alone)."""
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
        busy = self.busy
        current = self.current
        on = current is not None and id(current) == busy.seen  # still on what the watchdog timed
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
            repeats=self.repeats,
            busy_s=busy.now_s if on else 0.0,
            busy_on=busy.now_on if on else "",
            overdue_now=on and busy.warned,
            overdue=busy.episodes,
            longest_s=busy.longest_s,
            longest_on=busy.longest_on,
            longest_limit_s=busy.longest_limit_s,
            mean_s=self.work_s / self.items_in if self.items_in else 0.0,
            taken_s=time.monotonic(),
        )


class Busy:
    """What the run's watchdog saw of one stage: the item it is on now and for how long, the
    episodes it was busy past its bound. One writer (the watchdog); read by snapshots."""

    __slots__ = (
        "episodes",
        "longest_limit_s",
        "longest_on",
        "longest_s",
        "now_on",
        "now_s",
        "seen",
        "since",
        "warned",
    )

    def __init__(self) -> None:
        self.seen: int | None = None
        """The ``id`` of the object the stage's thread worked on at the last scan (an id, so
        that the watchdog holds no item: a frame, a ring slot's lease)."""
        self.since = 0.0
        """When the watchdog first saw it (``time.monotonic()``)."""
        self.warned = False
        """Whether this episode was warned about already."""
        self.now_s = 0.0
        self.now_on = ""
        self.episodes = 0
        self.longest_s = 0.0
        self.longest_on = ""
        self.longest_limit_s = 0.0


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
    if any(s.repeats for s in stats.values()):  # pace's idle repeats, egressed by the sinks
        rows = [rows[0] + ("repeats",)] + [
            (*row, str(s.repeats) if s.kind == "stream" else "-")
            for row, s in zip(rows[1:], stats.values(), strict=True)
        ]
    if any(s.zero_copy or s.copies for s in stats.values()):
        sent = [s.zero_copy + s.copies for s in stats.values()]
        rows = [rows[0] + ("zero copy",)] + [
            (*row, f"{s.zero_copy}/{n}" if n else "-")
            for row, s, n in zip(rows[1:], stats.values(), sent, strict=True)
        ]
    return "\n".join(table(rows, left=2))


BOTTLENECK_BUSY = 0.5
"""A stage busy at least this share of its time sets the rate (:func:`summarize`); below it
no stage does (a ``pace``, a source's own timing or the input sets it)."""


def duration_text(seconds: float) -> str:
    """``40 µs``, ``12 ms`` or ``5.2 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def hung(statistics: Mapping[int, Mapping[str, StageStatistics]]) -> str | None:
    """The failure of a run (statistics by rank) that stopped with a stage still busy on one
    item past its bound, a line: the output is then not what the app asked for (its last
    frames are a ``pace``'s repeats of the frame before, or missing). ``None`` when none was."""
    ranked = len(statistics) > 1
    for rank, stages in sorted(statistics.items()):
        for name, s in stages.items():
            if s.overdue_now:
                where = f" (rank {rank})" if ranked else ""
                return (
                    f"stage {name!r}{where} hung: still busy on one item ({s.busy_on}) when "
                    f"the run stopped, for {duration_text(s.busy_s)}, past its bound of "
                    f"{duration_text(s.longest_limit_s)}"
                )
    return None


def summarize(statistics: Mapping[int, Mapping[str, StageStatistics]]) -> list[str]:
    """What the statistics of a run (by rank) say about it, a line each, for the end of
    ``rxstream run``: every stage that was busy on one item past its bound (the longest such
    item, and whether it was still on it), and the stage that set the rate (the busiest, with
    its items a second and its share of time at work) or that none did.

    A stage's time is its thread's: ``work_s`` (plus the item it is still on, ``busy_s``),
    ``wait_s`` and ``stalled_s``; a fused stage has none of its own and is left out.
    """
    lines = []
    ranked = len(statistics) > 1
    busiest: tuple[float, str, StageStatistics] | None = None
    for rank, stages in sorted(statistics.items()):
        where = f" (rank {rank})" if ranked else ""
        for name, s in stages.items():
            if s.overdue:
                still = "; still on it when the run stopped" if s.overdue_now else ""
                times = f", {s.overdue} times" if s.overdue > 1 else ""
                took, bound = duration_text(s.longest_s), duration_text(s.longest_limit_s)
                lines.append(
                    f"stage {name!r}{where} was busy on one item ({s.longest_on}) for {took}, "
                    f"past its bound of {bound}{times}{still}"
                )
            if s.fused_into:
                continue
            work = s.work_s + s.busy_s
            life = work + s.wait_s + s.stalled_s
            if life > 0 and (busiest is None or work / life > busiest[0]):
                busiest = (work / life, f"{name!r}{where}", s)
    if busiest is not None:
        share, named, s = busiest
        life = s.work_s + s.busy_s + s.wait_s + s.stalled_s
        rate = s.items_in / life
        if share >= BOTTLENECK_BUSY and s.kind in ("source", "input"):  # pulls: maybe a clock
            lines.append(
                f"rate set by the source {named}: {rate:.1f} items/s, its pulls "
                f"{share:.0%} of its time"
            )
        elif share >= BOTTLENECK_BUSY:
            lines.append(f"rate set by {named}: {rate:.1f} items/s, busy {share:.0%}")
        else:
            lines.append(
                f"no stage set the rate: the busiest, {named}, was busy {share:.0%} "
                f"({rate:.1f} items/s)"
            )
    return lines


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


def repeated(stats: Mapping[str, StageStatistics]) -> int:
    """Of the items the sinks among ``stats`` egressed, the idle repeats (``idle=True``)."""
    return sum(s.repeats for s in stats.values() if s.kind == "stream")
