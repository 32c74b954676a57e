"""The GPU path end to end: render on rank 0, decode on rank 1, torch ops on CUDA throughout.

``render`` draws each frame (a moving plasma, float16 RGB) with torch ops straight into a slot
of the rank boundary's CUDA slot pool (``ctx.lease``), so crossing to rank 1 costs a
notification, not a copy; ``decode`` turns it into uint8 RGB on rank 1's GPU; the frame
leaves the GPU only at the sink's door (``present``). Without CUDA the same code runs on the
CPU (``ctx.lease`` then gives a CPU tensor over a slot of the shared-memory ring the frames
cross, and they cross without a copy there too).

Timing on a GPU: a kernel launch returns before the kernel ran, so a stage's ``.out`` stamp
times the launch, not the work. ``render`` and ``decode`` are declared ``device="cuda"``: the
engine records a CUDA event before and after each of their calls, on the stream the call
used, and resolves them without a ``synchronize()`` in the stage (``decode``'s when rank 1's
sink folds the record, ``render``'s as its frame leaves rank 0: ``None`` if the GPU was not
done by then). Each hop of the timing record has ``compute_ms`` (the launch) and ``gpu_ms``
(the GPU's work); ``rxstream timing`` shows both, and ``RXSTREAM_NVTX=1`` under ``nsys``
names each call's range (docs/timing.md; docs/ranks.md for the ranks). Run it with

    python examples/gpu_demo.py                 # 2 ranks, 120 frames of 1080x1920
    rxstream run examples/gpu_demo.py --ranks 2 --frames 120 --set height=540 --set width=960
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import rxstream

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PLACED = "cuda" if DEVICE == "cuda" else None
"""Where ``render`` and ``decode`` are declared: on CUDA (the engine times their GPU work),
else undeclared (the CPU ring, as before)."""


def render_frame(out: torch.Tensor, index: int) -> torch.Tensor:
    """Frame ``index`` of a moving plasma, written into ``out`` (H x W x 3, float16)."""
    height, width, _ = out.shape
    ys = torch.linspace(0.0, 6.28, height, device=out.device).view(-1, 1)
    xs = torch.linspace(0.0, 6.28, width, device=out.device).view(1, -1)
    t = index / 24.0
    wave = torch.sin(xs * 3 + t) + torch.sin(ys * 2 - t) + torch.sin((xs + ys) * 1.5 + t * 0.7)
    for channel, phase in enumerate((0.0, 2.1, 4.2)):
        torch.mul(torch.sin(wave + phase), 0.5, out=out[..., channel]).add_(0.5)
    return out


def decode_frame(frame: torch.Tensor) -> torch.Tensor:
    """Float RGB in [0, 1] to uint8 RGB, on the frame's device."""
    return (frame.clamp(0.0, 1.0) * 255.0).round_().to(torch.uint8)


def present(frame: torch.Tensor) -> Any:
    """The frame leaves the GPU here, at the sink's door: a numpy uint8 array."""
    return frame.cpu().numpy()


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """Render on rank 0, decode and present on rank 1."""
    doc = ctx.doc("control", defaults={"height": 1080, "width": 1920})
    height, width = doc.desired.height.value, doc.desired.width.value

    def draw(index: int) -> torch.Tensor:
        out = ctx.lease((height, width, 3), torch.float16, device=DEVICE)
        return render_frame(out, index)

    def frames() -> Iterator[int]:
        index = 0
        while True:
            yield index
            index += 1

    return (
        ctx.source(frames, name="frames", rank=0)
        | ctx.pipe(draw, name="render", rank=0, device=PLACED)
        | ctx.pipe(decode_frame, name="decode", rank=1, device=PLACED)
        | ctx.pipe(present, name="present", rank=1)
        | ctx.stream("video", rank=1)
    )


if __name__ == "__main__":
    result = rxstream.launch(str(Path(__file__)), ranks=2, frames=120, timeout=120)
    print(f"{result.egressed} frames egressed across {result.ranks} ranks on {DEVICE}\n")
    for rank, stats in sorted(result.statistics.items()):
        print(f"rank {rank}")
        print(rxstream.format_statistics(stats))
        print()
    sys.exit(0)
