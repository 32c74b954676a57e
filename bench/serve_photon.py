"""The cost of sharing the machine: `rxstream serve` of the demo on 2 warm workers, each
session's displayed frame rate and on-screen mouse-to-photon p50 with one visitor alone
beside two visitors at once, in one run, in real Chromium.

Each visitor is a headless Debian chromium page of its own (Playwright) that opens the
server's link (sent on to a session of its own) and jumps the pointer between the corners of
the picture with bench/photon.py's measurement (``visit`` and ``measure_moves``: from the
pointer event to the first rendering update whose pixels show the light at the new spot; the
displayed frames' cadence over the jumps). "Together" runs two such pages at once, in two
threads, each jumping for at least ``--min-s`` seconds so that they overlap; "alone" runs one
for as long. The two cases alternate round by round (the order swapped each round).

    python bench/serve_photon.py [--rounds 2] [--moves 24] [--min-s 10]

(about a minute; needs chromium and playwright)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _report import revision  # noqa: E402  (the bench folder is the script's, on sys.path)
from _serve import Server  # noqa: E402
from photon import chromium, percentile, visit  # noqa: E402

DEMO = str(ROOT / "examples" / "demo.py")


def together(url: str, visitors: int, moves: int, settle_s: float, min_s: float) -> list[Any]:
    """``visitors`` pages at once, each a session of its own: each one's ``visit``."""
    out: list[Any] = [None] * visitors

    def one(index: int) -> None:
        try:
            out[index] = visit(url, None, moves, settle_s, min_s)
        except BaseException as exc:  # said in the table, the other page goes on
            out[index] = {"moves": [], "error": f"{type(exc).__name__}: {exc}"}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(visitors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def summary(visits: list[dict[str, Any]]) -> dict[str, Any]:
    """One session's figures over its visits: fps shown, on-screen p50/p95, longest stall."""
    ms = [m["page_ms"] for v in visits for m in v["moves"]]
    return {
        "n": len(ms),
        "fps": statistics.median(v["fps"] for v in visits if "fps" in v) if ms else 0.0,
        "p50": percentile(ms, 50) if ms else float("nan"),
        "p95": percentile(ms, 95) if ms else float("nan"),
        "stall": max((v.get("stall_ms", 0.0) for v in visits), default=0.0),
        "errors": [v["error"] for v in visits if v.get("error")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alone and together, alternated")
    parser.add_argument("--moves", type=int, default=24, help="pointer jumps per page a round")
    parser.add_argument("--settle-s", type=float, default=3.0, help="after a page's first frames")
    parser.add_argument("--min-s", type=float, default=10.0, help="each page jumps this long")
    args = parser.parse_args()
    if chromium() is None:
        raise SystemExit("bench/serve_photon.py needs chromium on PATH (apt-get install chromium)")
    alone: list[dict[str, Any]] = []
    shared: list[list[dict[str, Any]]] = [[], []]
    with Server(DEMO, "--workers", "2", "--grace", "0.5") as server:
        for round_ in range(args.rounds):
            cases = ("alone", "together") if round_ % 2 == 0 else ("together", "alone")
            for case in cases:
                pages = together(
                    server.url, 1 if case == "alone" else 2, args.moves, args.settle_s, args.min_s
                )
                if case == "alone":
                    alone.append(pages[0])
                else:
                    for index, page in enumerate(pages):
                        shared[index].append(page)
    rows = [("one session alone", summary(alone))] + [
        (f"two at once: session {i + 1}", summary(visits)) for i, visits in enumerate(shared)
    ]
    print(
        f"rxstream serve of the demo on 2 workers, {args.rounds} rounds, >= {args.moves} jumps"
        f" and >= {args.min_s:g} s per page a round; commit {revision()}"
    )
    print(
        f"{'case':<26} {'fps shown':>9} {'on screen p50 ms':>16} {'p95':>6}"
        f" {'longest stall ms':>16} {'jumps':>5}"
    )
    for name, row in rows:
        print(
            f"{name:<26} {row['fps']:9.1f} {row['p50']:16.1f} {row['p95']:6.1f}"
            f" {row['stall']:16.0f} {row['n']:5d}"
        )
        for error in row["errors"]:
            print(f"  {name}: {error}")


if __name__ == "__main__":
    main()
