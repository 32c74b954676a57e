"""A two-rank CUDA pipeline, end to end, on a machine with a GPU.

Rank 0 makes CUDA frames (a 1080x1920x3 uint8 frame and a 32M-element float16 tensor, each
filled from its index) at ``--fps``; they cross the rank boundary through its CUDA slot pool
(shared once; per frame a slot ref crosses): the ``leased`` frame is made straight into a slot
with ``ctx.lease`` (no copy at the boundary), the others are copied into a slot (one
device-to-device copy), and the 64 MB tensor makes the pool's slots its size. Rank 1 checks
every element on the GPU, bit-exact, and reports how long the boundary hop took (from the
item's own ``<up>><down>.in``/``.out`` stamps: the writer's send, the ring, the reader's open).
The 1080p rows must show a median hop of at most 0.5 ms and a p99 of at most 5 ms. Exits 1 on
any mismatch or a hop over those bounds, 0 with "no CUDA: skipped" where there is no GPU.

    python bench/gpu_ranks.py [--frames 120] [--fps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import rxstream

SHAPES: dict[str, tuple[tuple[int, ...], torch.dtype, bool]] = {
    "frame 1080x1920x3 uint8, leased": ((1080, 1920, 3), torch.uint8, True),
    "frame 1080x1920x3 uint8, copied": ((1080, 1920, 3), torch.uint8, False),
    "tensor 32M float16, copied": ((32 << 20,), torch.float16, False),
}
HOP_MEDIAN_MS = 0.5
HOP_P99_MS = 5.0
WARMUP = 5


def expected(index: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The tensor frame ``index`` must carry (built on the GPU, deterministic)."""
    base = torch.arange(int(torch.tensor(shape).prod()), device="cuda", dtype=torch.int64)
    return ((base + index) % 251).to(dtype).reshape(shape)


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """Frames made on rank 0 at ``fps``, checked on rank 1."""
    doc = ctx.doc("control", defaults={"kind": next(iter(SHAPES)), "out": "", "fps": 60.0})
    shape, dtype, leased = SHAPES[doc.desired.kind.value]
    period = 1.0 / doc.desired.fps.value

    def frames() -> Iterator[torch.Tensor]:
        index = 0
        tick = time.monotonic()
        while True:
            if leased:  # render straight into a slot of the boundary's pool
                frame = ctx.lease(shape, dtype)
                frame.copy_(expected(index, shape, dtype))
            else:
                frame = expected(index, shape, dtype)
            yield frame
            del frame
            index += 1
            tick += period
            time.sleep(max(0.0, tick - time.monotonic()))

    def check(item: rxstream.PipelineItem) -> rxstream.PipelineItem:
        tensor = item.payload
        want = expected(item.metadata.pts, shape, dtype)
        same = bool(torch.equal(tensor, want))
        hops = dict(item.metadata.timeline)
        transfer = (hops["make>check.out"] - hops["make>check.in"]) * 1e3
        with open(doc.desired.out.value, "a", encoding="utf-8") as file:
            file.write(json.dumps({"pts": item.metadata.pts, "same": same, "ms": transfer}) + "\n")
        if not same:
            raise AssertionError(f"frame {item.metadata.pts} differs after crossing")
        return item

    return (
        ctx.source(frames, name="make", rank=0)
        | ctx.pipe(check, name="check", rank=1, items=True)
        | ctx.pipe(lambda t: t.shape, name="shape", rank=1)
        | ctx.stream("checked", rank=1)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--fps", type=float, default=60.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA: skipped")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    rows = []
    failures = []
    for kind in SHAPES:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "checks.jsonl"
            rxstream.launch(
                str(Path(__file__).resolve()),
                ranks=2,
                config={"kind": kind, "out": str(out), "fps": args.fps},
                frames=args.frames,
                timeout=120,
            )
            checks = [json.loads(line) for line in out.read_text().splitlines()]
        same = all(c["same"] for c in checks)
        if not same or len(checks) < args.frames:
            failures.append(f"{kind}: {len(checks)} frames checked, bit-exact {same}")
        ms = sorted(c["ms"] for c in checks[WARMUP:]) or [float("nan")]
        p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
        median = statistics.median(ms)
        if kind.startswith("frame") and not (median <= HOP_MEDIAN_MS and p99 <= HOP_P99_MS):
            failures.append(
                f"{kind}: boundary hop median {median:.3f} ms, p99 {p99:.3f} ms (at most "
                f"{HOP_MEDIAN_MS} and {HOP_P99_MS})"
            )
        rows.append((kind, len(checks), same, median, p99))
    print(f"\nframes at {args.fps:g} fps, the first {WARMUP} left out of the figures\n")
    print("| payload | frames checked | bit-exact | boundary hop median ms | p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    for kind, count, same, median, p99 in rows:
        print(f"| {kind} | {count} | {same} | {median:.3f} | {p99:.3f} |")
    if failures:
        print("\nFAILED:\n- " + "\n- ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
