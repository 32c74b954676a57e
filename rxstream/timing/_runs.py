"""The runs of a timing log: their order, how they are named, and how one is picked.

A run is named by its id (``Pipeline.run_id``: 12 lowercase hex digits); the lines written
before runs had ids are the run ``""``, printed and picked as ``(no id)``. Runs are ordered
by the timestamp of their first line when every run has one that reads as a time, by their
position in the log otherwise (ties: position), so that logs concatenated in any order still
show the run that started last as ``"last"``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rxstream._exceptions import ArgumentError, ArgumentTypeError
from rxstream.timing._record import TimingRecord

__all__ = [
    "ID_PREFIX",
    "NO_ID",
    "LoggedRun",
    "listing",
    "order_runs",
    "pick_run",
    "run_label",
    "runs_of",
    "show_time",
    "with_its_self_test",
]

NO_ID = "(no id)"
"""How the run of the lines written without an id is printed, and a name ``--run`` takes."""
ID_PREFIX = "id:"
"""``--run id:VALUE`` picks the run whose id is (or starts with) VALUE, even ``all``/``last``."""
LABEL_CHARS = 40
"""The longest id printed whole; a longer one is cut with an ellipsis."""
RUNS_LISTED = 5
"""The runs a line names (the latest; the earlier counted)."""
_PLAIN = re.compile(r"[\w.:-]+")
"""An id printed as it is (any other is quoted)."""


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


def parse_time(stamp: str) -> datetime | None:
    """A line's ``timestamp`` as an aware UTC time (a naive one read as UTC), or ``None``."""
    try:
        when = datetime.fromisoformat(stamp)
    except (TypeError, ValueError):
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def show_time(stamp: str) -> str:
    """A ``first_at`` as printed: UTC to the millisecond with a ``Z`` (a stamp that is not a
    time: as given, made safe)."""
    when = parse_time(stamp)
    if when is None:
        return safe(stamp)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def order_runs(runs: Sequence[LoggedRun]) -> tuple[LoggedRun, ...]:
    """``runs`` (in the order of their first line) ordered by ``first_at`` when every run
    has one that reads as a time; as given otherwise. Equal times keep their order."""
    times = [parse_time(r.first_at) for r in runs]
    if any(t is None for t in times):
        return tuple(runs)
    ranked = sorted(range(len(runs)), key=lambda i: (times[i], i))
    return tuple(runs[i] for i in ranked)


def runs_of(records: Iterable[TimingRecord], first_at: Mapping[str, str]) -> tuple[LoggedRun, ...]:
    """The runs of ``records`` with their counts, in the order they started (``order_runs``)."""
    counts: dict[str, int] = {}
    tests: dict[str, int] = {}
    for record in records:
        counts[record.run] = counts.get(record.run, 0) + 1
        tests[record.run] = tests.get(record.run, 0) + record.self_test
    return order_runs(
        [LoggedRun(run, n, first_at.get(run, ""), tests[run] == n) for run, n in counts.items()]
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


def safe(text: str) -> str:
    """``text`` with its control (unprintable) characters escaped, cut to LABEL_CHARS."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= LABEL_CHARS else shown[: LABEL_CHARS - 1] + "…"


def run_label(run: str) -> str:
    """A run's id as printed: ``(no id)`` for the lines written without one; an id of other
    than word characters, ``.``, ``:`` and ``-`` quoted (``repr``: control characters
    escaped, so that an id cannot pass for the text around it); cut to LABEL_CHARS."""
    if not run:
        return NO_ID
    return safe(run if _PLAIN.fullmatch(run) else repr(run))


def listing(ids: Sequence[str]) -> str:
    """The ids named in an error: the latest RUNS_LISTED, and how many more."""
    if not ids:
        return "none"
    listed = ", ".join(run_label(i) for i in ids[-RUNS_LISTED:])
    more = len(ids) - RUNS_LISTED
    return f"{listed} (…and {more} earlier)" if more > 0 else listed


def _matches(ids: Sequence[str], value: str) -> list[str]:
    """The ids equal to ``value`` (that one alone) or else starting with it."""
    if value in ids:
        return [value]
    return [i for i in ids if value and i.startswith(value)]


def pick_run(runs: Sequence[LoggedRun], run: Any, hidden: Collection[str] = ()) -> str | None:
    """The id ``run`` names among ``runs``, or ``None`` for ``"all"``.

    ``run`` is ``"last"``, ``"all"``, an id or a unique prefix of one, ``(no id)`` (or ``""``)
    for the lines written without one, or ``id:VALUE`` for the id (or prefix) VALUE whatever
    it is (``id:all``). ``hidden`` are the ids of self-test runs left out of ``runs``.
    ``ArgumentTypeError`` when ``run`` is not a string; ``ArgumentError`` naming the runs
    when it names none, or several."""
    if not isinstance(run, str):
        raise ArgumentTypeError(
            f"run must be a string ('last', 'all', a run's id or a unique prefix of one), "
            f"got {safe(repr(run))} ({type(run).__name__})"
        )
    ids = [r.id for r in runs]
    if run == "all":
        return None
    if run == "last":
        live = [r.id for r in runs if not r.self_test] or ids
        return live[-1] if live else ""
    value = run.removeprefix(ID_PREFIX)
    if run == NO_ID and "" in ids and NO_ID not in ids:
        value = ""
    matches = _matches(ids, value)
    if len(matches) == 1:
        return matches[0]
    held = listing(ids)
    if matches:
        raise ArgumentError(
            f"run {safe(repr(run))} is the prefix of several runs ({listing(matches)}): give "
            f"more of the id; the log's runs are: {held}"
        )
    tests = _matches(list(hidden), value)
    if tests:
        raise ArgumentError(
            f"run {safe(repr(run))} is an app's self test ({listing(tests)}), left out by "
            f"default: --include-self-test (include_self_test=True) selects it"
        )
    upper = " (run ids are lowercase hex: a prefix matches case by case)" * (value != value.lower())
    raise ArgumentError(
        f"run must be 'last', 'all', {NO_ID!r} or the id (or a unique prefix; 'id:' before "
        f"an id named 'all' or 'last') of one of the log's runs, got {safe(repr(run))}"
        f"{upper}; its runs are: {held}"
    )
