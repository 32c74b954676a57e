"""The main job of ``make demo``: a synthetic interactive "world", steered while it runs.

A pointer stream (``ctx.input``, fed here by a simulated mouse circling at 120 Hz) is
windowed to the frame rate; ``render`` turns each window into the world's next torch frame,
whose palette follows the prompt (an inline read of the control doc) and whose bright spot
follows the pointer. A decoder bound to the doc with ``doc.bind`` turns
frames into uint8 images and is rebuilt when ``vae.model`` changes; ``pace`` holds 24 fps and
the ``video`` sink egresses. The app checks itself with ``drive()`` first, then runs threaded:
after a third of the time it steers to a new prompt (stale frames are dropped, the first new
one is the cutover), after two thirds it swaps the decoder (built off the hot path, switched
between two frames). It prints per-stage statistics and writes the timing log (one
``[timing:video]`` line per pointer window), which ``rxstream timing`` summarises.

    python examples/demo.py [--seconds 3] [--log out/timing.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import torch

import rxstream
from rxstream import timing
from rxstream.doc import Snapshot
from rxstream.transport import MemoryTransport

HEIGHT, WIDTH = 144, 256
DEFAULTS = {"prompt": "a calm sea at dawn", "vae": {"model": "smooth"}}
YS = torch.linspace(0, 1, HEIGHT).view(HEIGHT, 1)
XS = torch.linspace(0, 1, WIDTH).view(1, WIDTH)


def render(t: int, pointer: list[tuple[float, float]], prompt: str) -> torch.Tensor:
    """A CHW float frame: a drifting pattern in the prompt's colours, lit at the pointer."""
    hue = (zlib.crc32(prompt.encode()) % 360) / 360.0
    wave = 0.5 + 0.5 * torch.sin(6.28 * (XS + YS / 2 + t / 24.0))
    x, y = pointer[-1] if pointer else (0.5, 0.5)
    spot = torch.exp(-((XS - x) ** 2 + (YS - y) ** 2) / 0.01)
    channels = [
        (0.5 + 0.5 * torch.cos(6.28 * (wave + hue + offset))) * 0.8 + spot
        for offset in (0.0, 1 / 3, 2 / 3)
    ]
    return torch.stack(channels) + 0.03 * torch.randn(3, HEIGHT, WIDTH)


class Decoder:
    """CHW float in [0, 1] to an HWC uint8 image, smoothed (3x3 box) or sharpened."""

    def __init__(self, model: str) -> None:
        if model == "smooth":
            kernel = torch.full((3, 3), 1 / 9)
        elif model == "sharp":
            kernel = torch.tensor([[0.0, -0.5, 0.0], [-0.5, 3.0, -0.5], [0.0, -0.5, 0.0]])
        else:
            raise ValueError(f"vae.model must be 'smooth' or 'sharp', got {model!r}")
        self.model = model
        self.kernel = kernel.expand(3, 1, 3, 3).contiguous()

    def __call__(self, frame: torch.Tensor) -> np.ndarray:
        out = torch.nn.functional.conv2d(frame.unsqueeze(0), self.kernel, padding=1, groups=3)[0]
        return (out.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()

    def close(self) -> None:
        """Called by doc.bind when a newer decoder replaces this one."""
        print(f"  decoder {self.model!r} closed")


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The demo pipeline (its doc is ``ctx.doc("control")``)."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    clock = [0]

    def world(pointer: list[tuple[float, float]]) -> torch.Tensor:
        clock[0] += 1
        return render(clock[0], pointer, doc.desired.prompt.value)

    def make_decoder(d: Snapshot) -> rxstream.Stage:
        return ctx.pipe(Decoder(d.vae.model.value), name="decode")

    return (
        ctx.input("pointer")
        | ctx.window(ms=1000 / 24)
        | ctx.pipe(world, name="render")
        | doc.bind(make_decoder, [doc.desired.vae.model], name="decode")
        | ctx.pace(fps=24)
        | ctx.stream("video")
    )


def move_mouse(pipeline: rxstream.Pipeline, stop: threading.Event) -> None:
    """A simulated user: the pointer circles the frame, 120 samples a second."""
    start = time.monotonic()
    while not stop.wait(1 / 120):
        angle = (time.monotonic() - start) * 2.0
        pipeline.feed("pointer", (0.5 + 0.3 * math.cos(angle), 0.5 + 0.3 * math.sin(angle)))


async def main(seconds: float, log: Path) -> None:
    transport = MemoryTransport(keep=8)
    ctx = rxstream.Context(transport=transport)
    pipeline = build(ctx)
    with ctx.self_test():
        pipeline.feed("pointer", (0.5, 0.5))
        (image,) = pipeline.drive(frames=1)
        assert image.shape == (HEIGHT, WIDTH, 3), image.shape
        assert image.dtype == np.uint8, image.dtype
    stages = " | ".join(pipeline.stages)
    print(f"self test passed: one {image.shape} {image.dtype} frame through {stages}")

    async def steer_and_leave() -> None:
        await asyncio.sleep(seconds / 3)
        print("  steer: prompt -> 'a storm over the mountains'")
        pipeline.update(prompt="a storm over the mountains")
        await asyncio.sleep(seconds / 3)
        print("  set: vae.model -> 'sharp' (doc.bind rebuilds the decoder)")
        ctx.control.set(vae={"model": "sharp"})
        await asyncio.sleep(seconds / 3)
        transport.disconnect()

    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    timing.configure_logging(log)  # the live run's records go to the log
    print(f"running {seconds:g} s at 24 fps with a simulated mouse at 120 Hz")
    stop = threading.Event()
    mouse = threading.Thread(target=move_mouse, args=(pipeline, stop), daemon=True)
    mouse.start()
    driver = asyncio.create_task(steer_and_leave())
    try:
        await pipeline.run()
        await driver
    finally:
        stop.set()
        mouse.join()
    sent = pipeline.statistics()["video"].items_out
    print(f"{sent} frames egressed on 'video'\n")
    print(rxstream.format_statistics(pipeline.statistics()))
    print(f"\ntiming log: {log} (summarise it with: rxstream timing {log})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="how long to run")
    parser.add_argument("--log", type=Path, default=Path("out/timing.jsonl"), help="timing log")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.log))
