"""Reading timing logs back: load, summarise per hop, plot.

The log is JSON lines (``rxstream.timing.configure_logging``); lines whose ``event`` is
``[timing:<stream>]`` are records, other events are skipped, and a line that is not JSON or a
timing line that lacks its fields is counted as malformed with its line number — never a crash.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rxstream._table import table
from rxstream.timing._record import TimingRecord

__all__ = ["Malformed", "TimingLog", "format_summary", "load", "plot", "summarize"]

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class Malformed:
    """A line of a timing log that could not be read."""

    line: int
    """1-based line number."""
    reason: str
    """What was wrong with it."""


@dataclass(frozen=True)
class TimingLog:
    """The records of a log, what could not be read, and how many other events it had."""

    records: tuple[TimingRecord, ...]
    malformed: tuple[Malformed, ...] = ()
    other_events: int = 0
    self_tests: int = 0
    """Records of an app's self test (``self_test``) that were left out."""

    def dataframe(self) -> Any:
        """One row per (record, hop) as a pandas DataFrame (needs pandas installed)."""
        import pandas as pd

        rows = [
            {
                "stream": r.stream,
                "input_seq": r.input_seq,
                "cutover": r.cutover,
                "total_ms": r.total_ms,
                "hop": hop.name,
                "order": index,
                "wait_ms": hop.wait_ms,
                "compute_ms": hop.compute_ms,
            }
            for r in self.records
            for index, hop in enumerate(r.hops)
        ]
        return pd.DataFrame(rows)


def load(
    path: str | Path, *, stream: str | None = None, include_self_test: bool = False
) -> TimingLog:
    """The timing records in the JSON-lines log at ``path`` (only ``stream``'s, if given).

    Records of the app's self test (tagged ``self_test``: frames driven at start-up, not a
    user's inputs) are left out and counted in ``self_tests``, unless ``include_self_test``.
    """
    records: list[TimingRecord] = []
    malformed: list[Malformed] = []
    others = 0
    self_tests = 0
    with Path(path).open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            text = line.strip()
            if not text:
                continue
            try:
                entry = json.loads(text)
            except json.JSONDecodeError as exc:
                malformed.append(Malformed(number, f"not JSON: {exc.msg} (column {exc.colno})"))
                continue
            if not isinstance(entry, dict):
                malformed.append(Malformed(number, f"not a JSON object: {type(entry).__name__}"))
                continue
            event = entry.get("event")
            if not (isinstance(event, str) and event.startswith("[timing:")):
                others += 1
                continue
            try:
                record = TimingRecord.from_fields(entry)
            except KeyError as exc:
                malformed.append(Malformed(number, f"timing line without field {exc.args[0]!r}"))
                continue
            except (TypeError, ValueError) as exc:
                malformed.append(Malformed(number, f"timing line with a bad value: {exc}"))
                continue
            if stream is not None and record.stream != stream:
                continue
            if record.self_test and not include_self_test:
                self_tests += 1
                continue
            records.append(record)
    return TimingLog(tuple(records), tuple(malformed), others, self_tests)


def describe_malformed(malformed: Sequence[Malformed]) -> str:
    """One line for all of a log's malformed lines: how many, and the first's number and reason."""
    first = malformed[0]
    count = len(malformed)
    lines = "line" if count == 1 else "lines"
    return f"{count} malformed {lines}, first at line {first.line}: {first.reason}"


def _percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile by linear interpolation (numpy's default method)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class HopSummary:
    """One hop's distribution over a log."""

    name: str
    count: int
    wait_ms: dict[int, float]
    compute_ms: dict[int, float]


@dataclass(frozen=True)
class Summary:
    """A log summarised: per hop, end to end, and the slowest inputs."""

    records: int
    hops: tuple[HopSummary, ...]
    total_ms: dict[str, float]
    slowest: tuple[TimingRecord, ...]
    malformed: tuple[Malformed, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """A plain dict for other tools (``rxstream timing --json``)."""
        return {
            "records": self.records,
            "hops": [
                {
                    "name": h.name,
                    "count": h.count,
                    "wait_ms": {f"p{q}": round(v, 3) for q, v in h.wait_ms.items()},
                    "compute_ms": {f"p{q}": round(v, 3) for q, v in h.compute_ms.items()},
                }
                for h in self.hops
            ],
            "total_ms": {k: round(v, 3) for k, v in self.total_ms.items()},
            "slowest": [
                {"stream": r.stream, "input_seq": r.input_seq, "total_ms": round(r.total_ms, 3)}
                for r in self.slowest
            ],
            "malformed": [{"line": m.line, "reason": m.reason} for m in self.malformed],
        }


def summarize(log: TimingLog | Iterable[TimingRecord], *, slowest: int = 5) -> Summary:
    """Per hop count and p50/p95/p99 of wait and compute; the end-to-end distribution."""
    records = list(log.records if isinstance(log, TimingLog) else log)
    malformed = log.malformed if isinstance(log, TimingLog) else ()
    waits: dict[str, list[float]] = {}
    computes: dict[str, list[float]] = {}
    order: list[str] = []  # the hops in path order, a hop first seen placed after its predecessor
    for record in records:
        previous = None
        for hop in record.hops:
            if hop.name not in waits:
                order.insert(0 if previous is None else order.index(previous) + 1, hop.name)
            waits.setdefault(hop.name, []).append(hop.wait_ms)
            computes.setdefault(hop.name, []).append(hop.compute_ms)
            previous = hop.name
    hops = tuple(
        HopSummary(
            name,
            len(waits[name]),
            {q: _percentile(waits[name], q) for q in PERCENTILES},
            {q: _percentile(computes[name], q) for q in PERCENTILES},
        )
        for name in order
    )
    totals = [r.total_ms for r in records]
    total = {f"p{q}": _percentile(totals, q) for q in PERCENTILES}
    total["max"] = max(totals) if totals else math.nan
    ranked = sorted(records, key=lambda r: r.total_ms, reverse=True)[:slowest]
    return Summary(len(records), hops, total, tuple(ranked), tuple(malformed))


def format_summary(summary: Summary) -> str:
    """The summary as the text table ``rxstream timing`` prints."""
    header = ("hop", "count", "wait p50", "p95", "p99", "compute p50", "p95", "p99")
    rows = [header] + [
        (
            h.name,
            str(h.count),
            *(f"{h.wait_ms[q]:.2f}" for q in PERCENTILES),
            *(f"{h.compute_ms[q]:.2f}" for q in PERCENTILES),
        )
        for h in summary.hops
    ]
    lines = [f"{summary.records} timing records (ms)", *table(rows)]
    t = summary.total_ms
    lines.append(
        "end to end: " + "  ".join(f"{key} {t[key]:.2f}" for key in ("p50", "p95", "p99", "max"))
    )
    if summary.slowest:
        lines.append(
            "slowest inputs: "
            + ", ".join(f"{r.stream}#{r.input_seq} {r.total_ms:.2f}" for r in summary.slowest)
        )
    if summary.malformed:
        lines.append(describe_malformed(summary.malformed))
    return "\n".join(lines)


def plot(summary: Summary, records: Sequence[TimingRecord], path: str | Path) -> None:
    """Draw a stacked per-hop wait/compute bar (p50) and the end-to-end CDF into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(11, 4))
    names = [h.name for h in summary.hops]
    wait = [h.wait_ms[50] for h in summary.hops]
    compute = [h.compute_ms[50] for h in summary.hops]
    bars.barh(names, wait, label="queue-wait p50", color="#c8a2c8")
    bars.barh(names, compute, left=wait, label="compute p50", color="#4878a8")
    bars.invert_yaxis()
    bars.set_xlabel("ms")
    bars.set_title("per hop (p50)")
    bars.legend(loc="lower right")
    totals = sorted(r.total_ms for r in records)
    if totals:
        cdf.step(totals, [(i + 1) / len(totals) for i in range(len(totals))], where="post")
    cdf.set_xlabel("end-to-end ms")
    cdf.set_ylabel("fraction of inputs")
    cdf.set_title(f"end to end ({len(totals)} records)")
    cdf.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
