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

from rxstream._table import table
from rxstream.timing._client import ClientTiming
from rxstream.timing._record import TimingRecord, run_of
from rxstream.timing._runs import (
    NO_ID,
    RUNS_LISTED,
    LoggedRun,
    order_runs,
    pick_run,
    run_label,
    runs_of,
    show_time,
    with_its_self_test,
)

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
class TimingLog:
    """The records of a log, what could not be read, and how many other events it had."""

    records: tuple[TimingRecord, ...]
    malformed: tuple[Malformed, ...] = ()
    other_events: int = 0
    self_tests: int = 0
    """Records of an app's self test (``self_test``) that were left out."""
    first_at: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Per run id, the ``timestamp`` of the line of its first record (left out ones too)."""
    left_out: Mapping[str, int] = field(default_factory=dict, hash=False)
    """Per run id, the self-test records left out (``self_tests`` in all)."""
    unjoined: Mapping[str, int] = field(default_factory=dict, hash=False)
    """Per run id, the ``[photon:…]`` lines joined to no record (none of their run, stream and
    ``input_seq`` before them)."""

    @property
    def runs(self) -> tuple[LoggedRun, ...]:
        """The runs of the records held, in the order they started (see ``order_runs``)."""
        return runs_of(self.records, self.first_at)

    def select(self, run: str = "last") -> TimingLog:
        """This log with only one run's records: ``"last"`` (the run that started last), a
        run's id or a unique prefix of one, ``"(no id)"`` (or ``""``) for the lines written
        without one, ``"id:VALUE"`` for an id that is ``all`` or ``last``; ``"all"`` keeps
        every run's (this log). A run keeps the self-test runs just before it
        (:attr:`LoggedRun.self_test`).

        Raises :class:`~rxstream.ArgumentError` naming the runs held for an id that matches
        none of them (or a self-test run left out), or a prefix that matches several;
        :class:`~rxstream.ArgumentTypeError` for a ``run`` that is not a string.
        """
        runs = self.runs
        chosen = pick_run(runs, run, self.left_out)
        if chosen is None:
            return self
        kept = with_its_self_test(runs, chosen)
        return replace(self, records=tuple(r for r in self.records if r.run in kept))

    def self_tests_of(self, run: str = "last") -> int:
        """The self-test records left out that go with ``run`` (``select``'s names): those
        of the self-test runs just before it (and its own); every one for ``"all"``."""
        chosen = pick_run(self.runs, run, self.left_out)
        if chosen is None:
            return self.self_tests
        known = {r.id: r for r in self.runs}
        for i, n in self.left_out.items():
            known.setdefault(i, LoggedRun(i, n, self.first_at.get(i, ""), self_test=True))
        position = dict.fromkeys([*self.first_at, *known])  # first_at: in the log's order
        every = order_runs([known[i] for i in position if i in known])
        return sum(self.left_out.get(i, 0) for i in with_its_self_test(every, chosen))

    def dataframe(self) -> Any:
        """One row per (record, hop) as a pandas DataFrame (needs pandas installed).

        Columns: run, stream, input_seq, cutover, total_ms, photon_ms, hop, order, wait_ms,
        compute_ms, hold_ms, gpu_ms. ``gpu_ms`` is a CUDA stage's GPU time (``None`` for any
        other hop, and where it was unresolved). ``photon_ms`` is the record's input-to-pixels
        time (NaN without a page's report); ``run`` its run's id (``groupby("run")`` splits
        the runs).
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
                "gpu_ms": hop.gpu_ms,
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
    left_out: dict[str, int] = {}
    unjoined: dict[str, int] = {}
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
            except RecursionError:  # [[[[… past the parser's depth: a line, not a crash
                malformed.append(Malformed(number, "not JSON: nested too deeply"))
                continue
            if not isinstance(entry, dict):
                malformed.append(Malformed(number, f"not a JSON object: {type(entry).__name__}"))
                continue
            event = entry.get("event")
            if isinstance(event, str) and event.startswith("[photon:"):
                problem = _join_photon(entry, records, latest, stream)
                if problem.startswith(_UNJOINED):
                    run = problem[len(_UNJOINED) :]
                    unjoined[run] = unjoined.get(run, 0) + 1
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
            first_at.setdefault(record.run, str(entry.get("timestamp", "")))
            if record.self_test and not include_self_test:
                left_out[record.run] = left_out.get(record.run, 0) + 1
                continue
            latest[(record.run, record.stream, record.input_seq)] = len(records)
            records.append(record)
    self_tests = sum(left_out.values())
    return TimingLog(
        tuple(records), tuple(malformed), others, self_tests, first_at, left_out, unjoined
    )


def describe_malformed(malformed: Sequence[Malformed]) -> str:
    """One line for all of a log's malformed lines: how many, and the first's number and reason."""
    first = malformed[0]
    count = len(malformed)
    lines = "line" if count == 1 else "lines"
    return f"{count} malformed {lines}, first at line {first.line}: {first.reason}"


_UNJOINED = "unjoined:"
"""``_join_photon``'s answer for a line of no record, followed by the line's run."""


def _join_photon(
    entry: dict[str, Any],
    records: list[TimingRecord],
    latest: dict[tuple[str, str, int], int],
    stream: str | None,
) -> str:
    """Join a ``[photon:…]`` line to its record (of its run: a line without ``run`` is of the
    run ``""``): ``""``, ``"unjoined:<run>"`` or why it is malformed."""
    try:
        key = (run_of(entry), str(entry["stream"]), int(entry["input_seq"]))
        client = ClientTiming.from_fields(entry)
    except KeyError as exc:
        return f"photon line without field {exc.args[0]!r}"
    except (TypeError, ValueError) as exc:
        return f"photon line with a bad value: {exc}"
    if stream is not None and key[1] != stream:
        return ""
    index = latest.get(key)
    if index is None:
        return _UNJOINED + key[0]
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
    gpu_ms: dict[int, float] = field(default_factory=dict)
    """Percentiles of the hop's GPU time over the records that resolved it (a CUDA stage);
    empty for any other hop, or when none did."""
    gpu: bool = False
    """Whether the hop was timed on its CUDA device in any record."""
    gpu_unresolved: int = 0
    """Records where the hop was timed on its device but its ``gpu_ms`` was ``None``."""


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
    included: tuple[str, ...] = ()
    """The ids of the runs whose records it summarised: ``run`` and the self-test runs
    counted with it (empty when ``run`` is ``"all"``)."""
    stream: str | None = None
    """The stream it summarised (``None``: every stream's records)."""

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
    if h.gpu:  # only for a CUDA stage: a log without one reads as before
        entry["gpu_ms"] = {f"p{q}": round(v, 3) for q, v in h.gpu_ms.items()}
        entry["gpu_unresolved"] = h.gpu_unresolved
    return entry


def summarize(
    log: TimingLog | Iterable[TimingRecord],
    *,
    slowest: int = 5,
    run: str = "last",
    stream: str | None = None,
) -> Summary:
    """Per hop count and p50/p95/p99 of wait, hold and compute; the end-to-end distribution.

    Of one run: ``run`` is ``"last"`` (the run that started last), an id or a unique prefix
    of one, ``"(no id)"`` for the lines written without one, ``"id:VALUE"`` for an id named
    ``all`` or ``last`` (``ArgumentError`` naming the runs held when it matches none or
    several; ``ArgumentTypeError`` when it is not a string), or ``"all"`` to pool every run's
    records. ``stream``: only that stream's records of the run, the run being picked among
    every stream's (``"last"`` is the log's last run, not the last with ``stream``).
    ``Summary.runs`` lists every run either way.
    """
    base = log if isinstance(log, TimingLog) else TimingLog(tuple(log))
    runs, malformed = base.runs, base.malformed
    chosen = pick_run(runs, run, base.left_out)
    kept = None if chosen is None else with_its_self_test(runs, chosen)
    records = [
        r
        for r in base.records
        if (kept is None or r.run in kept) and (stream is None or r.stream == stream)
    ]
    shown_run = "all" if chosen is None else chosen
    waits: dict[str, list[float]] = {}
    computes: dict[str, list[float]] = {}
    holds: dict[str, list[float]] = {}
    gpus: dict[str, list[float]] = {}
    unresolved: dict[str, int] = {}
    order: list[str] = []  # the hops in path order, a hop first seen placed after its predecessor
    for record in records:
        previous = None
        for hop in record.hops:
            if hop.name not in waits:
                order.insert(0 if previous is None else order.index(previous) + 1, hop.name)
            waits.setdefault(hop.name, []).append(hop.wait_ms)
            computes.setdefault(hop.name, []).append(hop.compute_ms)
            holds.setdefault(hop.name, []).append(hop.hold_ms)
            if hop.gpu:
                times = gpus.setdefault(hop.name, [])
                if hop.gpu_ms is None:
                    unresolved[hop.name] = unresolved.get(hop.name, 0) + 1
                else:
                    times.append(hop.gpu_ms)
            previous = hop.name
    hops = tuple(
        HopSummary(
            name,
            len(waits[name]),
            {q: _percentile(waits[name], q) for q in PERCENTILES},
            {q: _percentile(computes[name], q) for q in PERCENTILES},
            {q: _percentile(holds[name], q) for q in PERCENTILES},
            any(holds[name]),
            {q: _percentile(gpus[name], q) for q in PERCENTILES} if gpus.get(name) else {},
            name in gpus,
            unresolved.get(name, 0),
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
        included=() if kept is None else tuple(r.id for r in runs if r.id in kept),
        stream=stream,
    )


def format_summary(summary: Summary) -> str:
    """The summary as the text table ``rxstream timing`` prints.

    Hold columns appear when some hop held items; a hop that never held shows ``-`` there.
    GPU columns appear when some hop was timed on its CUDA device (``-`` for the others),
    and a line counts the records whose ``gpu_ms`` was unresolved.
    """
    held = any(h.holds for h in summary.hops)
    on_gpu = any(h.gpu for h in summary.hops)
    hold_header = ("hold p50", "p95", "p99") if held else ()
    gpu_header = ("gpu p50", "p95", "p99") if on_gpu else ()
    header = (
        "hop",
        "count",
        "wait p50",
        "p95",
        "p99",
        *hold_header,
        "compute p50",
        "p95",
        "p99",
        *gpu_header,
    )
    rows = [header] + [
        (
            h.name,
            str(h.count),
            *(f"{h.wait_ms[q]:.2f}" for q in PERCENTILES),
            *(_hold_cells(h) if held else ()),
            *(f"{h.compute_ms[q]:.2f}" for q in PERCENTILES),
            *(_gpu_cells(h) if on_gpu else ()),
        )
        for h in summary.hops
    ]
    lines = [*_runs_line(summary), f"{summary.records} timing records (ms)", *table(rows)]
    t = summary.total_ms
    lines.append(
        "end to end: " + "  ".join(f"{key} {t[key]:.2f}" for key in ("p50", "p95", "p99", "max"))
    )
    missing = [
        f"{h.name} {h.gpu_unresolved} of {h.count}" for h in summary.hops if h.gpu_unresolved
    ]
    if missing:
        lines.append("gpu_ms unresolved (work not done when folded): " + ", ".join(missing))
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


def _runs_line(summary: Summary) -> list[str]:
    """The first line for a summary of a log of several runs: which it holds, which is shown."""
    runs = summary.runs
    if len(runs) < 2:
        return []
    listed = ", ".join(
        f"{run_label(r.id)} ({r.records} record{'s' * (r.records != 1)}"
        + (", self test" if r.self_test else "")
        + (f", first at {show_time(r.first_at)}" if r.first_at else "")
        + ")"
        for r in runs[-RUNS_LISTED:]
    )
    if len(runs) > RUNS_LISTED:  # as many as an error about --run names
        listed = f"{len(runs) - RUNS_LISTED} earlier, then {listed}"
    if summary.run == "all" and not summary.included:  # pooled (not a run whose id is "all")
        showing = "showing all of them pooled; --run ID shows one"
    else:
        last = " (the last)" if summary.run == pick_run(runs, "last") else ""
        if len(with_its_self_test(runs, summary.run)) > 1:
            last += " with the self test before it"
        showing = f"showing {run_label(summary.run)}{last}; --run ID or --run all"
    if any(not r.id for r in runs):
        showing += f" (--run {NO_ID!r}: the lines written without an id)"
    return [f"log holds {len(runs)} runs: {listed}; {showing}"]


def _hold_cells(h: HopSummary) -> tuple[str, ...]:
    """A hop's hold percentiles as table cells (``-`` for a hop that never held)."""
    if not h.holds:
        return ("-",) * len(PERCENTILES)
    return tuple(f"{h.hold_ms[q]:.2f}" for q in PERCENTILES)


def _gpu_cells(h: HopSummary) -> tuple[str, ...]:
    """A hop's GPU-time percentiles as table cells (``-`` where it has none)."""
    if not h.gpu_ms:
        return ("-",) * len(PERCENTILES)
    return tuple(f"{h.gpu_ms[q]:.2f}" for q in PERCENTILES)


def plotted(summary: Summary, records: Iterable[TimingRecord]) -> list[TimingRecord]:
    """The ``records`` that ``plot`` draws for ``summary``: those of the runs it included
    (every one's for ``"all"``), of its stream when it was of one."""
    return [
        r
        for r in records
        if (not summary.included or r.run in summary.included)
        and (summary.stream is None or r.stream == summary.stream)
    ]


def plot(summary: Summary, records: Sequence[TimingRecord], path: str | Path) -> None:
    """Draw a stacked per-hop wait/hold/compute bar (p50) and the end-to-end CDF into a PNG
    (with ``photon_ms`` beside ``total_ms`` where a page reported, and a CUDA stage's
    ``gpu_ms`` p50 as a thin bar from where its compute starts).

    The CDF draws the records of what ``summary`` summarised: of ``records`` (a log's, say,
    of every run), those of ``summary.run`` and the self-test runs counted with it, of
    ``summary.stream`` when it was of one stream; every one for a summary of ``"all"``.
    """
    records = plotted(summary, records)
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
    if any(h.gpu_ms for h in summary.hops):  # a CUDA stage's GPU time, under its compute bar
        gpu = [h.gpu_ms.get(50, 0.0) for h in summary.hops]
        bars.barh(names, gpu, left=held, height=0.3, label="gpu p50", color="#76b900")
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
