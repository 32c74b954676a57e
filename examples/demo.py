"""The demo app, the main job of ``make demo``: an interactive synthetic "world".

A 24 Hz clock and a pointer stream (``ctx.input("pointer")``, fed by the page — or by the
autopilot's simulated mouse) are merged, and each clock tick closes a window of the pointer
samples since the last one, so the world moves on its own at the clock's rate and answers the
pointer within a frame; ``render`` turns each window into the world's next torch frame: a
drifting pattern in the prompt's colours (an inline read of the control doc), moving at
``speed``, lit where the pointer is with a spot of size ``spot``. A decoder bound to the doc
with ``doc.bind`` turns frames into uint8 images and is rebuilt when ``vae.model`` changes;
``pace`` holds 24 fps, its ticks locked to just after the frames arrive (it keeps the newest
frame only: a late frame is skipped, never queued), and the ``video`` stream egresses h264.
With two ranks, ``render`` and ``decode`` run on rank 1 (the worker) and the session stays on
rank 0.

    rxstream run examples/demo.py --serve                 # open the printed URL, move the mouse
    rxstream run examples/demo.py --ranks 2 --serve       # the same on two rank processes
    rxstream run examples/demo.py --frames 96 --set autopilot=true \\
        --out out/demo.mp4 --log out/timing.jsonl         # headless (what make demo runs)
    rxstream test examples/demo.py                        # the app's self test
    RXSTREAM_DEMO_SCALE=5 rxstream run examples/demo.py --serve   # a 1280x720 video

With ``autopilot`` on, the app moves the mouse itself (a circle, 120 samples a second),
steers to a new prompt after two seconds (stale frames are dropped, the first new one is the
cutover) and swaps the decoder after four (built off the hot path, switched between frames).
The autopilot reads the doc on every step: ticking it on the page starts it, unticking it
stops it (its seconds count only while it is on).

Why the window closes on the clock's tick (``until=``) rather than on time: a window opened by
a tick and closed ``1000/24`` ms later is due at the very instant the next tick arrives, so
whichever of the window's timer and the tick runs first decides. When the tick wins, two ticks
share one window (one frame for two ticks), and the next window opens only with the next item:
about 14 distinct frames a second, the other 10 idle repeats by ``pace``. A window the tick
itself closes has no race: one frame per tick, the world at the clock's rate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import time
import zlib
from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch

import rxstream
from rxstream.doc import Snapshot
from rxstream.typing import PaceOverflow, PacePhase

HEIGHT, WIDTH = 144, 256


def _upscale() -> int:
    """``RXSTREAM_DEMO_SCALE``: the video's width and height are the render's times this whole
    number (1, the default: 256x144; 5: 1280x720), each rendered pixel repeated: a stream of
    that size and its bytes, at the render's cost of 144p."""
    text = os.environ.get("RXSTREAM_DEMO_SCALE", "1")
    if not text.isdigit() or not 1 <= int(text) <= 8:
        raise ValueError(f"RXSTREAM_DEMO_SCALE must be a whole number from 1 to 8, got {text!r}")
    return int(text)


UPSCALE = _upscale()
TORCH_THREADS = 1
"""torch's intra-op threads in this process (see ``build``); ``bench/pace.py --threads``
compares 2."""


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


def render(
    t: float, pointer: list[tuple[float, float]], prompt: str, spot: float, out: torch.Tensor
) -> torch.Tensor:
    """A CHW float frame, made in ``out``: a drifting pattern in the prompt's colours, lit at
    the pointer."""
    hue = (zlib.crc32(prompt.encode()) % 360) / 360.0
    wave = 0.5 + 0.5 * torch.sin(6.28 * (XS + YS / 2 + t))
    x, y = pointer[-1] if pointer else (0.5, 0.5)
    light = torch.exp(-((XS - x) ** 2 + (YS - y) ** 2) / max(spot, 1e-3) ** 2)
    channels = [
        (0.5 + 0.5 * torch.cos(6.28 * (wave + hue + offset))) * 0.8 + light
        for offset in (0.0, 1 / 3, 2 / 3)
    ]
    torch.stack(channels, out=out)
    return out.add_(torch.randn(3, HEIGHT, WIDTH), alpha=0.03)


def load_kernels() -> dict[str, torch.Tensor]:
    """The decoder's weights, one 3x3 kernel a model: what the app declares expensive to make
    (``ctx.resource``), so it is made once per process, where ``decode`` runs (rank 1 on two
    ranks), before the first frame, and never by a build that only composes nor by the self
    test (which reads :func:`stand_in_kernels`)."""
    kernels = {
        "smooth": torch.full((3, 3), 1 / 9),
        "sharp": torch.tensor([[0.0, -0.5, 0.0], [-0.5, 3.0, -0.5], [0.0, -0.5, 0.0]]),
    }
    return {name: kernel.expand(3, 1, 3, 3).contiguous() for name, kernel in kernels.items()}


def stand_in_kernels() -> dict[str, torch.Tensor]:
    """What the self test decodes with instead (``stand_in=``): kernels of the same shape,
    made at no cost, so that the check loads no model in the process that drives it (the
    launcher, on two ranks)."""
    identity = torch.zeros(3, 1, 3, 3)
    identity[:, :, 1, 1] = 1.0
    return {"smooth": identity, "sharp": identity}


class Decoder:
    """CHW float in [0, 1] to an HWC uint8 image, smoothed (3x3 box) or sharpened."""

    def __init__(self, model: str, kernels: dict[str, torch.Tensor]) -> None:
        if model not in kernels:
            known = " or ".join(repr(name) for name in kernels)
            raise ValueError(f"vae.model must be {known}, got {model!r}")
        self.model = model
        self.kernel = kernels[model]

    def __call__(self, frame: torch.Tensor) -> np.ndarray:
        out = torch.nn.functional.conv2d(frame.unsqueeze(0), self.kernel, padding=1, groups=3)[0]
        image = (out.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
        if UPSCALE > 1:
            image = image.repeat(UPSCALE, axis=0).repeat(UPSCALE, axis=1)
        return image

    def close(self) -> None:
        """Called by doc.bind when a newer decoder replaces this one."""
        print(f"  decoder {self.model!r} closed", flush=True)


def clock() -> Iterator[None]:
    """A tick every 1/24 s, forever (the world's own time).

    A tick more than a period late (the process stalled, or the pipeline held the clock back)
    starts the grid again instead of bursting the missed ticks: a burst would queue frames
    that the 24 fps ``pace`` can only hand out one per period, each then that much older.
    """
    due = time.monotonic()
    while True:
        due += 1 / 24
        late = time.monotonic() - due
        if late > 1 / 24:
            due += late
        time.sleep(max(0.0, due - time.monotonic()))
        yield None


PACE_CAPACITY = 1
PACE_OVERFLOW: PaceOverflow = "latest"
"""The pace keeps one frame, the newest: a frame that comes after its tick (the pace then
repeated the last one) gives way to the next when that one arrives first, and is dropped
(counted, reason ``latest``). With the default (throttle, 2 slots) it would leave a period
late and every frame after it would wait behind it until the lock's 10 %-a-tick slew caught
up (about ten ticks): a ~5 ms hiccup upstream cost the next 0.4 s of inputs up to a period
each (bench/photon.py's p95; docs/decisions.md)."""


SAMPLE_S = 1 / 120
"""The autopilot's mouse: 120 samples a second, as a gaming mouse reports."""
POINTER = (rxstream.Field(float, min=0, max=1), rxstream.Field(float, min=0, max=1))
"""What a pointer sample must be: ``(x, y)``, each in [0, 1] (the page sends ``[x, y]``)."""


def is_tick(sample: tuple[float, float] | None) -> bool:
    """Whether a merged item is the clock's tick (``None``) rather than a pointer sample."""
    return sample is None


def build(ctx: rxstream.Context, *, pace_phase: PacePhase = "lock") -> rxstream.Pipeline:
    """The demo pipeline (its doc is ``ctx.doc("control")``); ``pace_phase`` for bench/pace.py."""
    doc = ctx.doc("control", schema=Control)
    worker = 1 if ctx.world > 1 else None  # render and decode on the worker rank
    # One intra-op thread: a 256x144 frame is too small for torch to gain from splitting it,
    # and each split waits for a core that the stage threads, the session and a browser share
    # (render + decode took 4-17 ms with 2 threads, 3 ms with one: docs/performance.md).
    torch.set_num_threads(TORCH_THREADS)
    phase = [0.0]
    pointer = [(0.5, 0.5)]

    def world(window: list[tuple[float, float] | None]) -> torch.Tensor:
        """The next frame: clock ticks (``None``) advance it, pointer samples move the light."""
        pointer.extend(sample for sample in window if sample is not None)
        del pointer[:-1]
        ticks = sum(1 for sample in window if sample is None)
        phase[0] += doc.desired.speed.value * ticks / 24.0
        # made in ctx.lease's tensor: where render's output crosses to another rank, a slot of
        # that boundary's ring, sent without a copy; here (decode runs on render's rank) and
        # under drive(), a new tensor
        out = ctx.lease((3, HEIGHT, WIDTH), torch.float32, device="cpu")
        return render(phase[0], pointer, doc.desired.prompt.value, doc.desired.spot.value, out)

    # loaded where decode runs; the self test in main() decodes with the stand-in
    kernels = ctx.resource("demo.kernels", load_kernels, stand_in=stand_in_kernels)

    def make_decoder(d: Snapshot) -> rxstream.Stage:
        return ctx.pipe(Decoder(d.vae.model.value, kernels.get()), name="decode")

    return (
        [ctx.source(clock, name="clock"), ctx.input("pointer", schema=POINTER)]
        | ctx.merge()
        | ctx.window(until=is_tick)  # one window per clock tick (see the module docstring)
        | ctx.pipe(world, name="render", rank=worker)
        | doc.bind(make_decoder, [doc.desired.vae.model], name="decode", rank=worker)
        | ctx.pace(fps=24, phase=pace_phase, overflow=PACE_OVERFLOW, capacity=PACE_CAPACITY)
        | ctx.stream("video", codec="h264")
    )


async def autopilot(pipeline: rxstream.Pipeline, ctx: rxstream.Context) -> None:
    """A simulated user while ``autopilot`` is on: circles the mouse, steers the prompt after
    2 s of it, swaps the decoder after 4 s. Reads the doc every step, so the page's checkbox
    starts and stops it."""
    on = ctx.control.desired.autopilot
    elapsed = 0.0
    last = due = time.monotonic()
    steered = swapped = False
    while True:
        # to a deadline, not ``sleep(1 / 120)`` a step: each sleep overshoots (~2 ms here),
        # which made ~98 samples a second; a step late by more than one period is not caught up
        due += SAMPLE_S
        if due < time.monotonic() - SAMPLE_S:
            due = time.monotonic()
        await asyncio.sleep(due - time.monotonic())
        now = time.monotonic()
        step, last = now - last, now
        if not on.value:
            continue
        elapsed += step
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
        # one window per clock tick: the first tick's, then the sample's (closed at the end)
        images = pipeline.drive(frames=1)
        assert images, "no frame"
        for image in images:
            assert image.shape == (HEIGHT * UPSCALE, WIDTH * UPSCALE, 3), image.shape
            assert image.dtype == np.uint8, image.dtype
    shape = images[-1].shape
    print(f"self test passed: one {shape} frame per window through {' | '.join(pipeline.stages)}")
    # idle until autopilot is ticked; if it raises, run() ends with its error (a TaskError
    # naming it), and run() cancels it when the session ends
    ctx.spawn(autopilot(pipeline, ctx))
    await pipeline.run()
