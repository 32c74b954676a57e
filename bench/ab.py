"""Two trees of rxstream side by side: did a change make the hot path slower?

``python bench/ab.py --base REV`` checks ``REV`` out into a temporary git worktree and measures
it and the working tree, interleaved process by process (``--rounds`` rounds, the order
swapped every round), each figure a ratio to the hand-written chain measured in the same
process just before it (bench/hop.py's, five plain threads over ``queue.Queue``), so the
drift of these shared machines cancels out. Per tree: the medians of the rounds; last column:
the working tree's median over the base's (below 1.00x: the working tree costs less).

Rows (CPU seconds of the whole process per item, every thread's: the figure a loaded machine
disturbs least):
- ``thread a stage, capacity C``: bench/hop.py's chain, a source and four ``ctx.pipe`` threads;
- ``fused, capacity 256``: the same with ``p2``..``p4`` fused onto ``p1``'s thread;
- ``codec sink, capacity 256``: a source of 64x64 ``uint8`` frames, a pipe and
  ``ctx.stream("video", codec="jpeg")`` into the in-memory transport (the sink's payload
  check and its timing fold, no encoding);
- ``drive, codec sink``: ``pipeline.drive`` of the same graph, no threads (ns an item).

The base's bench files are not used: both trees run this file's measures, importing
``rxstream`` from their own tree.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FRAME_SIDE = 64


def _sink_cpu(items: int, capacity: int) -> float:
    """CPU seconds an item through source | pipe | codec sink, threaded (see the module)."""
    import numpy as np

    import rxstream

    frame = np.zeros((FRAME_SIDE, FRAME_SIDE, 3), dtype=np.uint8)
    gate = threading.Event()

    def frames() -> Iterator[Any]:
        gate.wait()
        for _ in range(items):
            yield frame

    ctx = rxstream.Context()
    pipeline = (
        ctx.source(frames, name="src")
        | ctx.pipe(lambda x: x, name="p1", capacity=capacity)
        | ctx.stream("video", codec="jpeg", capacity=capacity)
    )
    pipeline.start()
    time.sleep(0.02)
    started = time.process_time()
    gate.set()
    if not pipeline.wait(60):
        pipeline.stop()
        raise RuntimeError("the codec sink chain did not finish")
    spent = time.process_time() - started
    pipeline.stop()
    return spent / items


def _drive_ns(items: int) -> float:
    """ns an item of ``drive`` through source | pipe | codec sink."""
    import numpy as np

    import rxstream

    frame = np.zeros((FRAME_SIDE, FRAME_SIDE, 3), dtype=np.uint8)
    ctx = rxstream.Context()
    pipeline = (
        ctx.source(lambda: frame, name="src")
        | ctx.pipe(lambda x: x, name="p1")
        | ctx.stream("video", codec="jpeg")
    )
    pipeline.drive(frames=10)
    started = time.perf_counter()
    pipeline.drive(frames=items)
    return (time.perf_counter() - started) / items * 1e9


def child(items: int) -> dict[str, float]:
    """One process's figures, each over the hand-written chain's CPU an item measured in it."""
    sys.path.insert(0, str(HERE))
    import hop

    def hand(capacity: int) -> float:
        gc.collect()
        cpu: list[float] = []
        hop.throughput(hop.HandChain, items, capacity, cpu=cpu)
        return cpu[0]

    def chain(kind: Any, capacity: int) -> float:
        gc.collect()
        cpu: list[float] = []
        hop.throughput(kind, items, capacity, cpu=cpu)
        return cpu[0]

    got: dict[str, float] = {}
    for capacity in (2, 256):
        base = hand(capacity)
        got[f"thread a stage, capacity {capacity}"] = chain(hop.RxsChain, capacity) / base
    base = hand(256)
    got["fused, capacity 256"] = chain(hop.FusedChain, 256) / base
    base = hand(256)
    gc.collect()
    got["codec sink, capacity 256"] = _sink_cpu(items, 256) / base
    got["drive, codec sink (ns an item)"] = _drive_ns(items)
    return got


def _run_child(tree: Path, items: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--items", str(items)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"the measure in {tree} failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    return result


def _revision(tree: Path, rev: str = "HEAD") -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", rev],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def compare(base_rev: str, rounds: int, items: int) -> str:
    """The table (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="rxstream-ab-") as scratch:
        base = Path(scratch) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), base_rev],
            check=True,
        )
        try:
            figures: dict[str, dict[str, list[float]]] = {"base": {}, "head": {}}
            for index in range(rounds):
                order = [("base", base), ("head", ROOT)]
                for side, tree in order if index % 2 == 0 else order[::-1]:
                    for key, value in _run_child(tree, items).items():
                        figures[side].setdefault(key, []).append(value)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True
            )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    head = _revision(ROOT) + (" + changes" if dirty else "")
    rows = [("measure", f"base {_revision(ROOT, base_rev)}", f"head {head}", "head / base")]
    for key, values in figures["base"].items():
        was, now = statistics.median(values), statistics.median(figures["head"][key])
        unit = "" if "ns" in key else "x"
        rows.append((key, f"{was:.3f}{unit}", f"{now:.3f}{unit}", f"{now / was:.2f}x"))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    lines = [
        f"# python bench/ab.py --base {base_rev} --rounds {rounds} --items {items}: medians of "
        f"{rounds} rounds, the trees interleaved process by process; CPU an item over the "
        "hand-written chain's in the same process (drive: ns an item)",
        "",
    ]
    for number, row in enumerate(rows):
        lines.append(
            "| "
            + " | ".join(
                cell.ljust(width) if column == 0 else cell.rjust(width)
                for column, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
            + " |"
        )
        if number == 0:
            lines.append("| " + " | ".join("-" * width for width in widths) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="two trees of rxstream side by side")
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (each tree once a round)")
    parser.add_argument("--items", type=int, default=20_000, help="items a measure")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.items)))
        return
    print(compare(args.base, args.rounds, args.items))


if __name__ == "__main__":
    main()
