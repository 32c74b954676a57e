"""bench/_photon_targets.py: the remote visitor's targets judged on a bench run's rows."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(1, str(BENCH))  # bench/'s modules import each other by their own names

from _photon_targets import judge, size_of  # noqa: E402


def row(
    name: str, p50: float, p95: float, stall: float = 50.0, fps: float = 24.0
) -> dict[str, Any]:
    """A bench row with the figures the targets read."""
    return {
        "name": name,
        "p50": p50,
        "p95": p95,
        "stall_ms": stall,
        "fps": fps,
        "total_p50": 25.0,
        "beyond_p50": p50 - 25.0,
    }


def test_each_row_is_judged_against_the_unimpaired_row_of_its_size() -> None:
    """The cap, loss and delay rules with their figures; a 720p row against 720p:clean."""
    rows = [
        row("loopback", 30, 60),
        row("clean", 35, 60),
        row("rtt=40ms", 84, 110),
        row("rtt=40ms,loss=3%", 100, 171, stall=201),
        row("rtt=40ms,rate=250kbit,queue=1s", 176, 300, fps=11.9),
        row("720p:clean", 60, 90),
        row("720p:rtt=40ms,rate=2mbit", 200, 250),
        row("rtt=40ms,blackout=500ms/10s", 90, 900, stall=600),
    ]
    lines = judge(rows)
    verdicts = [line for line in lines if not line.startswith("INFO ")]
    assert verdicts == [
        "PASS rtt=40ms: p50 84 <= unimpaired 35 + RTT 40 + 10 = 85",
        "FAIL rtt=40ms,loss=3%: longest stall 201 <= 200",
        "FAIL rtt=40ms,loss=3%: p95 171 <= loss-free 110 + 60 = 170",
        "FAIL rtt=40ms,rate=250kbit,queue=1s: p50 176 <= unimpaired 35 + RTT 40 + 100 = 175",
        "FAIL rtt=40ms,rate=250kbit,queue=1s: fps shown 11.9 >= 12",
        "PASS 720p:rtt=40ms,rate=2mbit: p50 200 <= unimpaired 60 + RTT 40 + 100 = 200",
        "PASS 720p:rtt=40ms,rate=2mbit: fps shown 24.0 >= 12",
    ]
    assert [line.split(":")[0] for line in lines if line.startswith("INFO ")] == ["INFO rtt=40ms"]
    assert size_of("720p:rtt=40ms") == ("720p", "rtt=40ms")
    assert size_of("rtt=40ms") == ("", "rtt=40ms")
