"""The main job of ``make demo``: a synthetic interactive "world" rendered frame by frame.

A torch source renders frames of a moving pattern, a ``denoise`` stage smooths them, a
``decode`` stage turns them into uint8 HWC images, ``pace`` holds 24 fps and the ``video``
sink egresses them. The app checks itself with ``drive()`` first, then runs threaded for a
few seconds and prints per-stage statistics.

    python examples/demo.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator

import numpy as np
import torch

import rxstream
from rxstream.transport import MemoryTransport

HEIGHT, WIDTH = 144, 256


def render(t: int) -> torch.Tensor:
    """A CHW float frame of a pattern that drifts with ``t``."""
    ys = torch.linspace(0, 1, HEIGHT).view(HEIGHT, 1)
    xs = torch.linspace(0, 1, WIDTH).view(1, WIDTH)
    phase = t / 24.0
    r = 0.5 + 0.5 * torch.sin(6.28 * (xs + phase))
    g = 0.5 + 0.5 * torch.sin(6.28 * (ys - phase / 2))
    b = 0.5 + 0.5 * torch.cos(6.28 * (xs + ys + phase / 3))
    return torch.stack([r.expand(HEIGHT, WIDTH), g.expand(HEIGHT, WIDTH), b])


def world() -> Iterator[torch.Tensor]:
    """Frames of the synthetic world, forever."""
    t = 0
    while True:
        yield render(t) + 0.05 * torch.randn(3, HEIGHT, WIDTH)
        t += 1


def denoise(frame: torch.Tensor) -> torch.Tensor:
    """A 3x3 box blur per channel."""
    kernel = torch.full((3, 1, 3, 3), 1 / 9)
    return torch.nn.functional.conv2d(frame.unsqueeze(0), kernel, padding=1, groups=3)[0]


def decode(frame: torch.Tensor) -> np.ndarray:
    """CHW float in [0, 1] to an HWC uint8 image."""
    return (frame.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The demo pipeline."""
    return (
        ctx.source(world)
        | ctx.pipe(denoise)
        | ctx.pipe(decode)
        | ctx.pace(fps=24)
        | ctx.stream("video")
    )


async def main(seconds: float) -> None:
    transport = MemoryTransport(keep=8)
    ctx = rxstream.Context(transport=transport)
    pipeline = build(ctx)
    with ctx.self_test():
        (frame,) = pipeline.drive(frames=1)
        assert frame.shape == (HEIGHT, WIDTH, 3), frame.shape
        assert frame.dtype == np.uint8, frame.dtype
    stages = len(pipeline.stages)
    print(f"self test passed: one {frame.shape} {frame.dtype} frame through {stages} stages")

    async def disconnect_later() -> None:
        await asyncio.sleep(seconds)
        transport.disconnect()

    stopper = asyncio.create_task(disconnect_later())
    await pipeline.run()
    await stopper
    sent = transport.counts.get("video", 0)
    print(f"ran {seconds:g} s at 24 fps: {sent} frames egressed on 'video'\n")
    print(rxstream.format_statistics(pipeline.statistics()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="how long to run")
    asyncio.run(main(parser.parse_args().seconds))
