"""What the bench scripts share: their stop marker and sources, spreads, and the commit."""

from __future__ import annotations

import statistics
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["STOP", "Threads", "ignore", "noop", "p99", "pulled", "revision", "spread", "verdict"]

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
