"""bench/_report.py's performance_row: a row in the shape of docs/performance.md's table."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _load_report() -> ModuleType:
    """bench/_report.py as a module (the bench scripts import it from their own folder)."""
    spec = importlib.util.spec_from_file_location(
        "rxstream_bench_report_rows", ROOT / "bench/_report.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPORT = _load_report()


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def test_the_columns_are_the_current_tables() -> None:
    """PERFORMANCE_COLUMNS is the header of docs/performance.md's current table."""
    text = (ROOT / "docs/performance.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| what it measures"))
    assert tuple(_cells(header)) == REPORT.PERFORMANCE_COLUMNS


def test_a_row_has_a_cell_per_column_date_in_utc_and_the_commit() -> None:
    """A row carries the four cells given, the date in UTC to the minute and the commit."""
    when = datetime(2026, 12, 4, 6, 30, tzinfo=timezone(timedelta(hours=1)))
    row = REPORT.performance_row(
        "hop latency", "`python bench/hop.py`", "<= 1.25x", "1.06x", when=when, commit="abc1234"
    )
    assert _cells(row) == [
        "hop latency",
        "`python bench/hop.py`",
        "<= 1.25x",
        "1.06x",
        "2026-12-04 05:30 UTC",
        "abc1234",
    ]


def test_a_pipe_inside_a_cell_is_escaped() -> None:
    """A ``|`` in a cell (a shell pipe, a composition) does not split the row."""
    row = REPORT.performance_row("a | b", "cmd", "t", "r", when=datetime.now(UTC), commit="c")
    assert "a \\| b" in row
    assert len(_cells(row.replace("\\|", "/"))) == len(REPORT.PERFORMANCE_COLUMNS)
