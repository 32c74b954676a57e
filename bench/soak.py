"""A soak: the demo runs for N minutes with ``--out`` and ``--log``; RSS per process over time.

    python bench/soak.py                       # 10 minutes, 2 ranks, a sample every 5 s
    python bench/soak.py --minutes 3           # a shorter look at the trend
    python bench/soak.py --no-files            # the same without --out/--log (the baseline)

It starts ``python -m rxstream run examples/demo.py --set autopilot=true --timeout S --out
DIR/soak.mp4 --log DIR/soak.jsonl`` (the autopilot feeds the pointer 120 times a second and
steers once), reads the resident set size (``VmRSS`` in ``/proc/<pid>/status``) of the run's
process and of each of its rank processes every ``--interval`` seconds, and prints one row per
sample. At the end, per process: the RSS at the middle and at the end, the growth over the last
half (end minus middle) and the Theil-Sen slope over the last half, extrapolated to 5
minutes; PASS when that is under 1 MB (the bound of issue 15). Nothing here runs under
``make test``; it takes as long as it says.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOUND_KB = 1024.0
"""The most a process may grow over 5 minutes of the second half (issue 15)."""


def rss_kb(pid: int) -> int | None:
    """The resident set size of ``pid`` in kB; ``None`` once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return None


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (every thread's children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ValueError):
            continue
    return sorted(set(found))


def label(pid: int) -> str | None:
    """``rank`` for a spawned rank process, ``None`` for a helper (the resource tracker)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return None
    return "rank" if "spawn_main" in cmdline else None


def slope(points: list[tuple[float, float]]) -> float:
    """The Theil-Sen slope of ``points`` (kB per second): the median of the slopes between
    every pair, which a few outliers (the allocator returning memory, a collection) do not
    tilt as they tilt a least-squares fit."""
    slopes = sorted(
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(points)
        for t2, v2 in points[i + 1 :]
        if t2 > t1
    )
    return statistics.median(slopes) if slopes else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--ranks", type=int, default=2, help="rank processes (default 2)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--app", default=str(ROOT / "examples" / "demo.py"))
    parser.add_argument(
        "--no-files", action="store_true", help="without --out and --log (the baseline)"
    )
    args = parser.parse_args()
    seconds = args.minutes * 60
    folder = Path(tempfile.mkdtemp(prefix="rxstream-soak-"))
    command = [
        sys.executable, "-m", "rxstream", "run", args.app, "--ranks", str(args.ranks),
        "--set", "autopilot=true", "--timeout", f"{seconds + 10:g}",
    ]  # fmt: skip
    if not args.no_files:
        command += ["--out", str(folder / "soak.mp4"), "--log", str(folder / "soak.jsonl")]
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {args.minutes:g} min")
    print("# " + " ".join(command))
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    series: dict[str, list[tuple[float, float]]] = {}
    started = time.monotonic()
    try:
        while proc.poll() is None and (elapsed := time.monotonic() - started) < seconds:
            pids = {"parent": proc.pid}
            ranks = [c for c in children(proc.pid) if label(c) == "rank"]
            pids.update((f"rank{i + 1}", pid) for i, pid in enumerate(ranks))
            row = []
            for name, pid in pids.items():
                kb = rss_kb(pid)
                if kb is not None:
                    series.setdefault(name, []).append((elapsed, kb))
                    row.append(f"{name} {kb:>9,} kB")
            print(f"{elapsed:7.0f} s  " + "  ".join(row), flush=True)
            time.sleep(args.interval)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # stops it as Ctrl-C does
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
    if proc.returncode not in (0, 130):
        print(f"# the run ended with {proc.returncode}:\n{err}", file=sys.stderr)
        return 1
    print("\n| process | RSS, middle | RSS, end | last half | slope | per 5 min | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    passed = True
    for name, points in series.items():
        half = [p for p in points if p[0] >= points[-1][0] / 2]
        grown = half[-1][1] - half[0][1]
        rate = slope(half)
        per5 = rate * 300
        ok = per5 < BOUND_KB
        passed &= ok
        print(
            f"| {name} | {half[0][1]:,.0f} kB | {half[-1][1]:,.0f} kB | {grown:+,.0f} kB "
            f"over {half[-1][0] - half[0][0]:.0f} s | {rate * 1000:+.0f} B/s | {per5:+,.0f} kB "
            f"| {'PASS' if ok else 'FAIL'} (< {BOUND_KB:,.0f} kB) |"
        )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
