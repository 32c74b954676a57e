"""The examples run as documented: the demo checks itself, runs, steers, and logs timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rxstream.timing import load

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_demo_runs_steers_and_writes_a_timing_log(tmp_path: Path) -> None:
    """examples/demo.py passes its self test, steers, swaps its decoder and logs timing."""
    log = tmp_path / "timing.jsonl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--seconds", "1.2", "--log", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "self test passed: one (144, 256, 3) uint8 frame" in out
    assert "steer: prompt -> 'a storm over the mountains'" in out
    assert "decoder 'smooth' closed" in out
    stats = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha()}
    assert stats["video"][1] == "stream"
    timing = load(log)
    assert timing.records
    assert not timing.malformed
    assert {r.stream for r in timing.records} == {"video"}
    seqs = [r.input_seq for r in timing.records]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert [h.name for h in timing.records[0].hops] == [
        "pointer",
        "window",
        "render",
        "decode",
        "pace",
        "video",
    ]
