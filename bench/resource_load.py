"""Launch to first frame of a two-rank app whose model takes ``--load-s`` seconds to load.

``rxstream run tests/apps/model_app.py --ranks 2 --frames 5`` with the model made two ways,
interleaved run by run: ``build`` (the model constructed in ``build(ctx)``, as an app does
without a resource: the launcher's check of the app, rank 0 and rank 1 each make it) and
``resource`` (``ctx.resource("model", …)``: loaded once, on rank 1 whose stage reads it). The
first frame is the wall-clock time rank 0's ``seen`` stage wrote on its first item; launch is
the time just before the command was started. Also counted: the model's loads, per process.

    python bench/resource_load.py [--load-s 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `python bench/resource_load.py` from a checkout: the app's own launch command
sys.path.insert(1, str(ROOT / "tests"))

from apps.model_app import run_command  # noqa: E402

WAYS = ("build", "resource")


def one_run(way: str, load_s: float) -> tuple[float, int]:
    """(seconds from launch to rank 0's first frame, the model's loads) of one launch."""
    with tempfile.TemporaryDirectory(prefix="rxstream-bench-") as folder:
        command = run_command(folder, way, load_s)
        launched = time.time()
        result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
        if result.returncode != 0:
            raise SystemExit(f"{way}: rxstream run exited {result.returncode}: {result.stderr}")
        (first,) = Path(folder).glob("first-*")
        loads = len(list(Path(folder).glob("load-*")))
        return float(first.read_text()) - launched, loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-s", type=float, default=2.0, help="the model's load time (s)")
    parser.add_argument("--rounds", type=int, default=3, help="launches of each way")
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    loads: dict[str, set[int]] = {way: set() for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:  # interleaved: both ways see the same machine
            took, made = one_run(way, args.load_s)
            seconds[way].append(took)
            loads[way].add(made)
    print(f"two ranks, a model that loads in {args.load_s:g} s, {args.rounds} launches each")
    print("way       loads  launch to first frame, s: median (min-max)")
    for way in WAYS:
        runs = seconds[way]
        counts = "/".join(str(n) for n in sorted(loads[way]))
        print(
            f"{way:<9} {counts:>5}  {statistics.median(runs):.2f} ({min(runs):.2f}-{max(runs):.2f})"
        )
    ratio = statistics.median(seconds["build"]) / statistics.median(seconds["resource"])
    print(f"build / resource: {ratio:.2f}x")


if __name__ == "__main__":
    main()
