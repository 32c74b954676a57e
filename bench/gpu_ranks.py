"""A two-rank CUDA pipeline, end to end, on a machine with a GPU.

Rank 0 makes CUDA frames (a 1080x1920x3 uint8 frame and a 32M-element float16 tensor, each
filled from its index); they cross the rank boundary through the CUDA IPC bridge (no copy);
rank 1 checks every element on the GPU, bit-exact, and reports how long the boundary hop took
(from the item's own ``<up>><down>.in``/``.out`` stamps). Exits 1 on any mismatch, 0 with
"no CUDA: skipped" where there is no GPU.

    python bench/gpu_ranks.py [--frames 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import rxstream

SHAPES: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "frame 1080x1920x3 uint8": ((1080, 1920, 3), torch.uint8),
    "tensor 32M float16": ((32 << 20,), torch.float16),
}


def expected(index: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The tensor frame ``index`` must carry (built on the GPU, deterministic)."""
    base = torch.arange(int(torch.tensor(shape).prod()), device="cuda", dtype=torch.int64)
    return ((base + index) % 251).to(dtype).reshape(shape)


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """Frames made on rank 0, checked on rank 1."""
    doc = ctx.doc("control", defaults={"kind": "frame 1080x1920x3 uint8", "out": ""})
    shape, dtype = SHAPES[doc.desired.kind.value]

    def frames() -> Iterator[torch.Tensor]:
        index = 0
        while True:
            yield expected(index, shape, dtype)
            index += 1

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
    parser.add_argument("--frames", type=int, default=60)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA: skipped")
        return 0
    rows = []
    ok = True
    for kind in SHAPES:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "checks.jsonl"
            rxstream.launch(
                str(Path(__file__).resolve()),
                ranks=2,
                config={"kind": kind, "out": str(out)},
                frames=args.frames,
                timeout=120,
            )
            checks = [json.loads(line) for line in out.read_text().splitlines()]
        same = all(c["same"] for c in checks)
        ok = ok and same and len(checks) >= args.frames
        ms = sorted(c["ms"] for c in checks[5:]) or [float("nan")]
        p99 = ms[int(0.99 * (len(ms) - 1))]
        rows.append((kind, len(checks), same, statistics.median(ms), p99))
    print("| payload | frames checked | bit-exact | boundary hop median ms | p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    for kind, count, same, median, p99 in rows:
        print(f"| {kind} | {count} | {same} | {median:.3f} | {p99:.3f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
