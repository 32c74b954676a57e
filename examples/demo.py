"""The demo app, the main job of ``make demo``: an interactive synthetic "world".

A 24 Hz clock and a pointer stream (``ctx.input("pointer")``, fed by the page — or by the
autopilot's simulated mouse) are merged and windowed to the frame rate, so the world moves on
its own and answers the pointer within a frame; ``render`` turns each window into the world's
next torch frame: a drifting pattern in the prompt's colours (an inline read of the control doc),
moving at ``speed``, lit where the pointer is with a spot of size ``spot``. A decoder bound to
the doc with ``doc.bind`` turns frames into uint8 images and is rebuilt when ``vae.model``
changes; ``pace`` holds 24 fps and the ``video`` stream egresses h264. With two ranks,
``render`` and ``decode`` run on rank 1 (the worker) and the session stays on rank 0.

    rxstream run examples/demo.py --serve                 # open the printed URL, move the mouse
    rxstream run examples/demo.py --ranks 2 --serve       # the same on two rank processes
    rxstream run examples/demo.py --frames 96 --set autopilot=true \\
        --out out/demo.mp4 --log out/timing.jsonl         # headless (what make demo runs)
    rxstream test examples/demo.py                        # the app's self test

With ``autopilot`` on, the app moves the mouse itself (a circle, 120 samples a second),
steers to a new prompt after two seconds (stale frames are dropped, the first new one is the
cutover) and swaps the decoder after four (built off the hot path, switched between frames).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import zlib
from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch

import rxstream
from rxstream.doc import Snapshot

HEIGHT, WIDTH = 144, 256


@dataclasses.dataclass
class Vae:
    """The decoder section."""

    model: Literal["smooth", "sharp"] = "smooth"


@dataclasses.dataclass
class Control:
    """The control doc's schema: the page builds its controls from it (ranges, choices)."""

    prompt: str = "a calm sea at dawn"
    speed: float = dataclasses.field(default=1.0, metadata={"min": 0.0, "max": 4.0})
    spot: float = dataclasses.field(default=0.1, metadata={"min": 0.02, "max": 1.0})
    vae: Vae = dataclasses.field(default_factory=Vae)
    autopilot: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.speed <= 4.0:
            raise ValueError(f"speed must be in [0, 4], got {self.speed}")
        if not 0.02 <= self.spot <= 1.0:
            raise ValueError(f"spot must be in [0.02, 1], got {self.spot}")


YS = torch.linspace(0, 1, HEIGHT).view(HEIGHT, 1)
XS = torch.linspace(0, 1, WIDTH).view(1, WIDTH)


def render(t: float, pointer: list[tuple[float, float]], prompt: str, spot: float) -> torch.Tensor:
    """A CHW float frame: a drifting pattern in the prompt's colours, lit at the pointer."""
    hue = (zlib.crc32(prompt.encode()) % 360) / 360.0
    wave = 0.5 + 0.5 * torch.sin(6.28 * (XS + YS / 2 + t))
    x, y = pointer[-1] if pointer else (0.5, 0.5)
    light = torch.exp(-((XS - x) ** 2 + (YS - y) ** 2) / max(spot, 1e-3) ** 2)
    channels = [
        (0.5 + 0.5 * torch.cos(6.28 * (wave + hue + offset))) * 0.8 + light
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
        print(f"  decoder {self.model!r} closed", flush=True)


def clock() -> Iterator[None]:
    """A tick every 1/24 s, forever (the world's own time)."""
    due = time.monotonic()
    while True:
        due += 1 / 24
        time.sleep(max(0.0, due - time.monotonic()))
        yield None


POINTER = (rxstream.Field(float, min=0, max=1), rxstream.Field(float, min=0, max=1))
"""What a pointer sample must be: ``(x, y)``, each in [0, 1] (the page sends ``[x, y]``)."""


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The demo pipeline (its doc is ``ctx.doc("control")``)."""
    doc = ctx.doc("control", schema=Control)
    worker = 1 if ctx.world > 1 else None  # render and decode on the worker rank
    phase = [0.0]
    pointer = [(0.5, 0.5)]

    def world(window: list[tuple[float, float] | None]) -> torch.Tensor:
        """The next frame: clock ticks (``None``) advance it, pointer samples move the light."""
        pointer.extend(sample for sample in window if sample is not None)
        del pointer[:-1]
        phase[0] += doc.desired.speed.value / 24.0
        return render(phase[0], pointer, doc.desired.prompt.value, doc.desired.spot.value)

    def make_decoder(d: Snapshot) -> rxstream.Stage:
        return ctx.pipe(Decoder(d.vae.model.value), name="decode")

    return (
        [ctx.source(clock, name="clock"), ctx.input("pointer", schema=POINTER)]
        | ctx.merge()
        | ctx.window(ms=1000 / 24)
        | ctx.pipe(world, name="render", rank=worker)
        | doc.bind(make_decoder, [doc.desired.vae.model], name="decode", rank=worker)
        | ctx.pace(fps=24)
        | ctx.stream("video", codec="h264")
    )


async def autopilot(pipeline: rxstream.Pipeline, ctx: rxstream.Context) -> None:
    """A simulated user: circles the mouse, steers the prompt at 2 s, swaps the decoder at 4 s."""
    start = time.monotonic()
    steered = swapped = False
    while True:
        await asyncio.sleep(1 / 120)
        elapsed = time.monotonic() - start
        angle = elapsed * 2.0
        pipeline.feed("pointer", (0.5 + 0.3 * math.cos(angle), 0.5 + 0.3 * math.sin(angle)))
        if elapsed > 2 and not steered:
            steered = True
            print("  autopilot: steer prompt -> 'a storm over the mountains'", flush=True)
            pipeline.update(prompt="a storm over the mountains")
        if elapsed > 4 and not swapped:
            swapped = True
            print("  autopilot: set vae.model -> 'sharp' (doc.bind rebuilds it)", flush=True)
            ctx.control.set(vae={"model": "sharp"})


async def main(ctx: rxstream.Context) -> None:
    """Check the app with drive(), then run it threaded until the session ends."""
    pipeline = build(ctx)
    with ctx.self_test():
        pipeline.feed("pointer", (0.5, 0.5))
        (image,) = pipeline.drive(frames=1)
        assert image.shape == (HEIGHT, WIDTH, 3), image.shape
        assert image.dtype == np.uint8, image.dtype
    print(f"self test passed: one {image.shape} frame through {' | '.join(pipeline.stages)}")
    pilot = None
    if ctx.control.desired.autopilot.value:
        pilot = asyncio.ensure_future(autopilot(pipeline, ctx))
    try:
        await pipeline.run()
    finally:
        if pilot is not None:
            pilot.cancel()
