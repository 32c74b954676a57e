"""What the bench scripts share: their stop marker and sources, spreads, and the commit."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "ONE_CPU",
    "OS",
    "PERFORMANCE_COLUMNS",
    "PLACEMENT_LABELS",
    "STOP",
    "Threads",
    "ignore",
    "noop",
    "on_cpus",
    "one_cpu",
    "p99",
    "performance_row",
    "placements",
    "pulled",
    "revision",
    "spread",
    "verdict",
]

STOP: Any = object()
"""What a ``pull`` returns to end :func:`pulled`."""


def noop(payload: Any) -> Any:
    """The stage function of every chain: the payload, unchanged."""
    return payload


def ignore(_value: Any) -> None:
    """A sink that keeps nothing."""


def pulled(pull: Callable[[], Any]) -> Iterator[Any]:
    """``pull()`` until it returns :data:`STOP` (the source every chain iterates)."""
    while True:
        value = pull()
        if value is STOP:
            return
        yield value


def spread(values: Sequence[float], digits: int | None = None, unit: str = "") -> str:
    """``median [min-max]``, with as many digits as the size of the median calls for."""
    median = statistics.median(values)
    if digits is None:
        size = abs(median)
        digits = 0 if size >= 100 else 1 if size >= 10 else 2
    low, high = min(values), max(values)
    return f"{median:.{digits}f}{unit} [{low:.{digits}f}-{high:.{digits}f}]"


PERFORMANCE_COLUMNS = ("what it measures", "command", "target", "latest result", "date", "commit")
"""The columns of docs/performance.md's current table, in order."""


def performance_row(
    what: str,
    command: str,
    target: str,
    result: str,
    *,
    when: datetime | None = None,
    commit: str | None = None,
) -> str:
    """One row of docs/performance.md's current table: the run's date (UTC, to the minute) and
    commit (:func:`revision`) unless given; a ``|`` inside a cell is escaped."""
    stamp = (when or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    cells = (what, command, target, result, stamp, commit or revision())
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def p99(samples: Sequence[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def revision() -> str:
    """The checkout's commit (``+dirty`` with uncommitted engine changes), or ``?``."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "-uno", "--", "rxstream"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return commit + ("+dirty" if dirty else "")


def verdict(
    values: Sequence[float], baseline: Sequence[float], check: Callable[[float], bool] | None
) -> tuple[list[float], str]:
    """The per-repetition ratios, and ``PASS``/``FAIL`` of their median (``info``: no target)."""
    ratios = [v / b for v, b in zip(values, baseline, strict=True)]
    result = "info" if check is None else "PASS" if check(statistics.median(ratios)) else "FAIL"
    return ratios, result


class Threads:
    """A chain of plain threads (``self._threads``, made by the subclass): started together,
    each joined within ``join_s``; ``what`` names the chain in the error."""

    what = "chain"
    join_s = 10.0
    _threads: list[threading.Thread]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wait(self) -> None:
        for thread in self._threads:
            thread.join(self.join_s)
            if thread.is_alive():
                raise RuntimeError(f"{self.what} did not finish")


# --- --placement: the in-process rows where the OS puts the threads, or all on one CPU ------

OS, ONE_CPU = "os", "one"
"""``--placement``'s sets of in-process rows: where the OS puts every thread (the tables as
they always were), and every thread of both sides pinned to one CPU."""
PLACEMENT_LABELS = {OS: "OS", ONE_CPU: "one CPU"}
"""How a row names its placement where a run prints more than the ``os`` set."""


def one_cpu() -> tuple[int | None, str]:
    """The CPU the ``one`` rows run on (the first this process may use), or ``None`` and why
    there is none (not Linux, or fewer than 2 CPUs allowed: one CPU would be no choice)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "sched_setaffinity"):
        return None, f"pinning needs Linux (sched_setaffinity, /proc); this is {sys.platform}"
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, f"this process may run on CPU {allowed} only: pinned is where it runs"
    return allowed[0], ""


def placements(wanted: str) -> tuple[list[str], int | None, str]:
    """The sets of rows ``--placement wanted`` runs (``os``, ``one``, ``both``: ``os`` then
    ``one``), the CPU of the ``one`` set, and why the ``one`` set is left out (empty if not)."""
    if wanted == OS:
        return [OS], None, ""
    cpu, why = one_cpu()
    if cpu is None:
        return [OS], None, f"--placement {wanted}: {why}; the os rows only"
    return ([ONE_CPU] if wanted == ONE_CPU else [OS, ONE_CPU]), cpu, ""


def _tasks(pid: int) -> list[int]:
    try:
        return [int(task) for task in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:  # the process ended
        return []


@contextmanager
def on_cpus(cpus: set[int] | None, pid: int | None = None) -> Iterator[None]:
    """Every thread of process ``pid`` (this one by default) on ``cpus`` for the block, then
    each back on the mask it had (a thread started meanwhile: on the calling thread's, the
    process's main thread's for another process). Threads started in the block inherit the
    mask from the thread that starts them, C threads too. ``None``: nothing changes."""
    if cpus is None:
        yield
        return
    pid = os.getpid() if pid is None else pid
    masks: dict[int, set[int]] = {}
    for task in _tasks(pid):
        try:
            masks[task] = os.sched_getaffinity(task)
            os.sched_setaffinity(task, cpus)
        except OSError:  # a thread that ended meanwhile
            continue
    fallback = masks.get(pid if pid != os.getpid() else threading.get_native_id())
    try:
        yield
    finally:
        for task in _tasks(pid):
            mask = masks.get(task, fallback)
            if mask is None:
                continue
            try:
                os.sched_setaffinity(task, mask)
            except OSError:  # a thread that ended meanwhile
                continue
