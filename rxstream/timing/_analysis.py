"""Reading timing logs back: load, summarise per hop, plot.

The log is JSON lines (``rxstream.timing.configure_logging``); lines whose ``event`` is
``[timing:<stream>]`` are records, other events are skipped, and a line that is not JSON or a
timing line that lacks its fields is counted as malformed with its line number — never a crash.
A ``[photon:<stream>]`` line (a page showed the frame) is joined to the latest record before it
of the same run with the same stream and ``input_seq``, as the record's ``client`` part.

Every line of a run carries its id (``run``); a line without one (written before runs had ids)
belongs to the run ``""``. One log may hold several runs (``configure_logging(path)`` appends):
:meth:`TimingLog.select` and :func:`summarize` take one of them — the last by default — never
pooling them unless asked (``"all"``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rxstream._exceptions import ArgumentError
from rxstream._table import table
from rxstream.timing._client import ClientTiming
from rxstream.timing._record import TimingRecord

__all__ = [
    "LoggedRun",
    "Malformed",
    "TimingLog",
    "format_summary",
    "load",
    "plot",
    "summarize",
]

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class Malformed:
    """A line of a timing log that could not be read."""

    line: int
    """1-based line number."""
    reason: str
    """What was wrong with it."""


@dataclass(frozen=True)
class LoggedRun:
    """One run's share of a timing log."""

    id: str
    """The run's id (``Pipeline.run_id``); ``""`` for lines written without one."""
    records: int
    """How many of the records held run under it."""
    first_at: str = ""
    """The ``timestamp`` of its first record's line (``""`` when unknown)."""
    self_test: bool = False
    """Whether every record of it is of an app's self test (the drives of ``ctx.self_test()``,
    kept by ``include_self_test``): such a run goes with the run after it (an app checks
    itself at start-up, then runs) and is never ``"last"``."""


@dataclass(frozen=True)
class TimingLog:
    """The records of a log, what could not be read, and how many other events it had."""

    records: tuple[TimingRecord, ...]
    malformed: tuple[Malformed, ...] = ()
    other_events: int = 0
    self_tests: int = 0
    """Records of an app's self test (``self_test``) that were left out."""
    first_at: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Per run id, the ``timestamp`` of the line of its first record."""

    @property
    def runs(self) -> tuple[LoggedRun, ...]:
        """The runs of the records held, in the order they started (their first record)."""
        return runs_of(self.records, self.first_at)

    def select(self, run: str = "last") -> TimingLog:
        """This log with only one run's records: ``"last"`` (the run that started last), a
        run's id or a unique prefix of one; ``"all"`` keeps every run's (this log). A run
        keeps the self-test runs just before it (:attr:`LoggedRun.self_test`).

        Raises :class:`~rxstream.ArgumentError` naming the runs held for an id that matches
        none of them, or a prefix that matches several.
        """
        runs = self.runs
        chosen = pick_run(runs, run)
        if chosen is None:
            return self
        kept = with_its_self_test(runs, chosen)
        return replace(self, records=tuple(r for r in self.records if r.run in kept))

    def dataframe(self) -> Any:
        """One row per (record, hop) as a pandas DataFrame (needs pandas installed).

        Columns: run, stream, input_seq, cutover, total_ms, photon_ms, hop, order, wait_ms,
        compute_ms, hold_ms. ``photon_ms`` is the record's input-to-pixels time (NaN without a
        page's report); ``run`` its run's id (``groupby("run")`` splits the runs).
        """
        import pandas as pd

        rows = [
            {
                "run": r.run,
                "stream": r.stream,
                "input_seq": r.input_seq,
                "cutover": r.cutover,
                "total_ms": r.total_ms,
                "photon_ms": r.photon_ms,
                "hop": hop.name,
                "order": index,
                "wait_ms": hop.wait_ms,
                "compute_ms": hop.compute_ms,
                "hold_ms": hop.hold_ms,
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
    Each record keeps its run (``run``); the log holds every run's (see :meth:`TimingLog.select`).
    """
    records: list[TimingRecord] = []
    malformed: list[Malformed] = []
    others = 0
    latest: dict[tuple[str, str, int], int] = {}  # (run, stream, input_seq) -> index in records
    first_at: dict[str, str] = {}
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
            if isinstance(event, str) and event.startswith("[photon:"):
                problem = _join_photon(entry, records, latest, stream)
                if problem == "unmatched":
                    others += 1
                elif problem:
                    malformed.append(Malformed(number, problem))
                continue
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
            latest[(record.run, record.stream, record.input_seq)] = len(records)
            first_at.setdefault(record.run, str(entry.get("timestamp", "")))
            records.append(record)
    return TimingLog(tuple(records), tuple(malformed), others, self_tests, first_at)


def runs_of(records: Iterable[TimingRecord], first_at: Mapping[str, str]) -> tuple[LoggedRun, ...]:
    """The runs of ``records`` in the order of their first record, each with its count."""
    counts: dict[str, int] = {}
    tests: dict[str, int] = {}
    for record in records:
        counts[record.run] = counts.get(record.run, 0) + 1
        tests[record.run] = tests.get(record.run, 0) + record.self_test
    return tuple(
        LoggedRun(run, n, first_at.get(run, ""), tests[run] == n) for run, n in counts.items()
    )


def with_its_self_test(runs: Sequence[LoggedRun], chosen: str) -> set[str]:
    """``chosen`` and the self-test runs just before it (none for a self-test run itself)."""
    ids = [r.id for r in runs]
    kept = {chosen}
    if chosen not in ids:
        return kept
    index = ids.index(chosen)
    if runs[index].self_test:
        return kept
    while index > 0 and runs[index - 1].self_test:
        index -= 1
        kept.add(ids[index])
    return kept


def run_label(run: str) -> str:
    """A run's id as printed: ``(no id)`` for the lines written without one."""
    return run or "(no id)"


def pick_run(runs: Sequence[LoggedRun], run: str) -> str | None:
    """The id ``run`` names among ``runs`` (``"last"``, an id or a unique prefix), or ``None``
    for ``"all"``; ``ArgumentError`` naming the runs when it names none, or several."""
    if run == "all":
        return None
    ids = [r.id for r in runs]
    if run == "last":
        live = [r.id for r in runs if not r.self_test] or ids
        return live[-1] if live else ""
    if run in ids:  # an exact id first: "" is the run of lines written without one
        return run
    matches = [i for i in ids if run and i.startswith(run)]
    if len(matches) == 1:
        return matches[0]
    held = ", ".join(run_label(i) for i in ids) or "none"
    if matches:
        raise ArgumentError(
            f"run {run!r} is the prefix of several runs ({', '.join(matches)}): give more of "
            f"the id; the log's runs are: {held}"
        )
    raise ArgumentError(
        f"run must be 'last', 'all' or the id (or a unique prefix) of one of the log's runs, "
        f"got {run!r}; its runs are: {held}"
    )


def describe_malformed(malformed: Sequence[Malformed]) -> str:
    """One line for all of a log's malformed lines: how many, and the first's number and reason."""
    first = malformed[0]
    count = len(malformed)
    lines = "line" if count == 1 else "lines"
    return f"{count} malformed {lines}, first at line {first.line}: {first.reason}"


def _join_photon(
    entry: dict[str, Any],
    records: list[TimingRecord],
    latest: dict[tuple[str, str, int], int],
    stream: str | None,
) -> str:
    """Join a ``[photon:…]`` line to its record (of its run: a line without ``run`` is of the
    run ``""``): ``""``, ``"unmatched"`` or why it is malformed."""
    try:
        key = (str(entry.get("run", "")), str(entry["stream"]), int(entry["input_seq"]))
        client = ClientTiming.from_fields(entry)
    except KeyError as exc:
        return f"photon line without field {exc.args[0]!r}"
    except (TypeError, ValueError) as exc:
        return f"photon line with a bad value: {exc}"
    if stream is not None and key[1] != stream:
        return ""
    index = latest.get(key)
    if index is None:
        return "unmatched"
    if records[index].client is None:  # the first page to show it wins
        records[index] = replace(records[index], client=client)
    return ""


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
    hold_ms: dict[int, float] = field(default_factory=dict)
    """Percentiles of the time the hop held its items (0 in records where it did not hold)."""
    holds: bool = False
    """Whether the hop held an item in any record (a ``pace``, a ``window``)."""


@dataclass(frozen=True)
class Summary:
    """A log summarised: per hop, end to end, and the slowest inputs."""

    records: int
    hops: tuple[HopSummary, ...]
    total_ms: dict[str, float]
    slowest: tuple[TimingRecord, ...]
    malformed: tuple[Malformed, ...] = field(default=())
    photon_ms: dict[str, float] = field(default_factory=dict)
    """Input to pixels over the records a page reported (p50, p95, p99, max); empty if none."""
    client: dict[str, dict[int, float]] = field(default_factory=dict)
    """The client hops (``up``, ``net``, ``decode``, ``present``) p50/p95/p99 over those."""
    shown: int = 0
    """Records that a page reported showing (they have ``photon_ms``)."""
    run: str = ""
    """The run summarised: its id, or ``"all"`` when every run's records were pooled."""
    runs: tuple[LoggedRun, ...] = ()
    """Every run of the log (or records) given, in the order they started."""

    def to_json(self) -> dict[str, Any]:
        """A plain dict for other tools (``rxstream timing --json``)."""
        return {
            "run": self.run,
            "runs": [
                {"id": r.id, "records": r.records, "first_at": r.first_at, "self_test": r.self_test}
                for r in self.runs
            ],
            "records": self.records,
            "hops": [_hop_json(h) for h in self.hops],
            "total_ms": {k: round(v, 3) for k, v in self.total_ms.items()},
            "slowest": [
                {"stream": r.stream, "input_seq": r.input_seq, "total_ms": round(r.total_ms, 3)}
                for r in self.slowest
            ],
            "malformed": [{"line": m.line, "reason": m.reason} for m in self.malformed],
            **self._photon_json(),
        }

    def _photon_json(self) -> dict[str, Any]:
        if not self.shown:
            return {}  # a log without a page reads as before
        return {
            "shown": self.shown,
            "photon_ms": {k: round(v, 3) for k, v in self.photon_ms.items()},
            "client": {
                hop: {f"p{q}": round(v, 3) for q, v in values.items()}
                for hop, values in self.client.items()
            },
        }


def _hop_json(h: HopSummary) -> dict[str, Any]:
    """One hop of ``Summary.to_json``: ``hold_ms`` only for a hop that held items."""
    entry: dict[str, Any] = {
        "name": h.name,
        "count": h.count,
        "wait_ms": {f"p{q}": round(v, 3) for q, v in h.wait_ms.items()},
        "compute_ms": {f"p{q}": round(v, 3) for q, v in h.compute_ms.items()},
    }
    if h.holds:
        entry["hold_ms"] = {f"p{q}": round(v, 3) for q, v in h.hold_ms.items()}
    return entry


def summarize(
    log: TimingLog | Iterable[TimingRecord], *, slowest: int = 5, run: str = "last"
) -> Summary:
    """Per hop count and p50/p95/p99 of wait, hold and compute; the end-to-end distribution.

    Of one run: ``run`` is ``"last"`` (the run that started last), an id or a unique prefix
    of one (``ArgumentError`` naming the runs held when it matches none or several), or
    ``"all"`` to pool every run's records. ``Summary.runs`` lists every run either way.
    """
    if isinstance(log, TimingLog):
        runs, malformed = log.runs, log.malformed
        records = list(log.select(run).records)
    else:
        given = list(log)
        runs, malformed = runs_of(given, {}), ()
        records = list(TimingLog(tuple(given)).select(run).records)
    chosen = pick_run(runs, run)
    shown_run = "all" if chosen is None else chosen
    waits: dict[str, list[float]] = {}
    computes: dict[str, list[float]] = {}
    holds: dict[str, list[float]] = {}
    order: list[str] = []  # the hops in path order, a hop first seen placed after its predecessor
    for record in records:
        previous = None
        for hop in record.hops:
            if hop.name not in waits:
                order.insert(0 if previous is None else order.index(previous) + 1, hop.name)
            waits.setdefault(hop.name, []).append(hop.wait_ms)
            computes.setdefault(hop.name, []).append(hop.compute_ms)
            holds.setdefault(hop.name, []).append(hop.hold_ms)
            previous = hop.name
    hops = tuple(
        HopSummary(
            name,
            len(waits[name]),
            {q: _percentile(waits[name], q) for q in PERCENTILES},
            {q: _percentile(computes[name], q) for q in PERCENTILES},
            {q: _percentile(holds[name], q) for q in PERCENTILES},
            any(holds[name]),
        )
        for name in order
    )
    totals = [r.total_ms for r in records]
    total = {f"p{q}": _percentile(totals, q) for q in PERCENTILES}
    total["max"] = max(totals) if totals else math.nan
    ranked = sorted(records, key=lambda r: r.total_ms, reverse=True)[:slowest]
    shown = [r.client for r in records if r.client is not None]
    photon: dict[str, float] = {}
    client: dict[str, dict[int, float]] = {}
    if shown:
        photons = [c.photon_ms for c in shown]
        photon = {f"p{q}": _percentile(photons, q) for q in PERCENTILES}
        photon["max"] = max(photons)
        for part in ("up", "net", "decode", "present"):
            values = [v for c in shown if (v := getattr(c, f"{part}_ms")) is not None]
            if values:
                client[part] = {q: _percentile(values, q) for q in PERCENTILES}
    return Summary(
        len(records),
        hops,
        total,
        tuple(ranked),
        tuple(malformed),
        photon_ms=photon,
        client=client,
        shown=len(shown),
        run=shown_run,
        runs=runs,
    )


def format_summary(summary: Summary) -> str:
    """The summary as the text table ``rxstream timing`` prints.

    Hold columns appear when some hop held items; a hop that never held shows ``-`` there.
    """
    held = any(h.holds for h in summary.hops)
    hold_header = ("hold p50", "p95", "p99") if held else ()
    header = ("hop", "count", "wait p50", "p95", "p99", *hold_header, "compute p50", "p95", "p99")
    rows = [header] + [
        (
            h.name,
            str(h.count),
            *(f"{h.wait_ms[q]:.2f}" for q in PERCENTILES),
            *(_hold_cells(h) if held else ()),
            *(f"{h.compute_ms[q]:.2f}" for q in PERCENTILES),
        )
        for h in summary.hops
    ]
    lines = [*_runs_line(summary), f"{summary.records} timing records (ms)", *table(rows)]
    t = summary.total_ms
    lines.append(
        "end to end: " + "  ".join(f"{key} {t[key]:.2f}" for key in ("p50", "p95", "p99", "max"))
    )
    if summary.shown:
        p = summary.photon_ms
        lines.append(
            f"photon (input to pixels, {summary.shown} shown by a page): "
            + "  ".join(f"{key} {p[key]:.2f}" for key in ("p50", "p95", "p99", "max"))
        )
        lines.append(
            "client p50: "
            + "  ".join(f"{hop} {values[50]:.2f}" for hop, values in summary.client.items())
        )
    if summary.slowest:
        lines.append(
            "slowest inputs: "
            + ", ".join(f"{r.stream}#{r.input_seq} {r.total_ms:.2f}" for r in summary.slowest)
        )
    if summary.malformed:
        lines.append(describe_malformed(summary.malformed))
    return "\n".join(lines)


RUNS_LISTED = 5
"""The runs ``format_summary``'s first line lists by name (the latest; the earlier counted)."""


def _runs_line(summary: Summary) -> list[str]:
    """The first line for a summary of a log of several runs: which it holds, which is shown."""
    runs = summary.runs
    if len(runs) < 2:
        return []
    listed = ", ".join(
        f"{run_label(r.id)} ({r.records} record{'s' * (r.records != 1)}"
        + (", self test" if r.self_test else "")
        + (f", first at {r.first_at[:19]}" if r.first_at else "")
        + ")"
        for r in runs[-RUNS_LISTED:]
    )
    if len(runs) > RUNS_LISTED:
        listed = f"{len(runs) - RUNS_LISTED} earlier, then {listed}"
    if summary.run == "all":
        showing = "showing all of them pooled; --run ID shows one"
    else:
        last = " (the last)" if summary.run == pick_run(runs, "last") else ""
        if len(with_its_self_test(runs, summary.run)) > 1:
            last += " with the self test before it"
        showing = f"showing {run_label(summary.run)}{last}; --run ID or --run all"
    return [f"log holds {len(runs)} runs: {listed}; {showing}"]


def _hold_cells(h: HopSummary) -> tuple[str, ...]:
    """A hop's hold percentiles as table cells (``-`` for a hop that never held)."""
    if not h.holds:
        return ("-",) * len(PERCENTILES)
    return tuple(f"{h.hold_ms[q]:.2f}" for q in PERCENTILES)


def plot(summary: Summary, records: Sequence[TimingRecord], path: str | Path) -> None:
    """Draw a stacked per-hop wait/hold/compute bar (p50) and the end-to-end CDF into a PNG
    (with ``photon_ms`` beside ``total_ms`` where a page reported)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(11, 4))
    names = [h.name for h in summary.hops]
    wait = [h.wait_ms[50] for h in summary.hops]
    hold = [h.hold_ms.get(50, 0.0) for h in summary.hops]
    compute = [h.compute_ms[50] for h in summary.hops]
    held = [w + h for w, h in zip(wait, hold, strict=True)]
    bars.barh(names, wait, label="queue-wait p50", color="#c8a2c8")
    bars.barh(names, hold, left=wait, label="hold p50", color="#e8a838")
    bars.barh(names, compute, left=held, label="compute p50", color="#4878a8")
    bars.invert_yaxis()
    bars.set_xlabel("ms")
    bars.set_title("per hop (p50)")
    bars.legend(loc="best")
    totals = sorted(r.total_ms for r in records)
    if totals:
        cdf.step(totals, [(i + 1) / len(totals) for i in range(len(totals))], where="post")
    photons = sorted(p for r in records if (p := r.photon_ms) is not None)
    if photons:  # beside total_ms: input to pixels, where a page reported
        steps = [(i + 1) / len(photons) for i in range(len(photons))]
        cdf.step(photons, steps, where="post", label="photon_ms (input to pixels)")
        cdf.legend(["total_ms (server)", "photon_ms (input to pixels)"], loc="lower right")
    cdf.set_xlabel("end-to-end ms")
    cdf.set_ylabel("fraction of inputs")
    of_run = f", run {run_label(summary.run)}" if len(summary.runs) > 1 else ""
    cdf.set_title(f"end to end ({len(totals)} records{of_run})")
    cdf.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
