"""A world that moves on its own clock and reads the pointer *now* at each tick.

The ``world`` source ticks 24 times a second; at each tick it reads the newest pointer
sample (``pointer.latest()``, declared with ``reads=pointer``) and renders the frame lit
there. The frame carries that sample's correlation, so the ``video`` sink writes one
``[timing:video]`` record per pointer sample that reached the screen, its ``total_ms`` from
the sample's arrival (``input.recv``): the wait for the tick plus the render. No merge, no
window: the other way, the demo's (examples/demo.py), lets every sample reach the renderer.

The app's autopilot (a spawned task: ``ctx.spawn``) circles the pointer 120 times a second
when ``autopilot`` is on; a failure in it ends the run, naming it.

    rxstream run examples/pointer_world.py --serve                 # move the mouse on the page
    rxstream run examples/pointer_world.py --frames 48 --set autopilot=true \\
        --log out/pointer_world.jsonl                              # headless, then:
    rxstream timing out/pointer_world.jsonl
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

import numpy as np

import rxstream

HEIGHT, WIDTH = 72, 128
FPS = 24
SAMPLE_S = 1 / 120
"""The autopilot's mouse: 120 samples a second."""
POINTER = (rxstream.Field(float, min=0, max=1), rxstream.Field(float, min=0, max=1))
"""A pointer sample: ``(x, y)``, each in [0, 1] (the page sends ``[x, y]``)."""

YS = np.linspace(0, 1, HEIGHT, dtype=np.float32).reshape(HEIGHT, 1)
XS = np.linspace(0, 1, WIDTH, dtype=np.float32).reshape(1, WIDTH)


def render(t: float, x: float, y: float) -> np.ndarray:
    """An HWC uint8 frame: a drifting gradient, lit at ``(x, y)``."""
    wave = 0.5 + 0.5 * np.sin(6.28 * (XS + YS / 2 + t))
    light = np.exp(-((XS - x) ** 2 + (YS - y) ** 2) / 0.01)
    gray = np.clip(0.6 * wave + light, 0, 1) * 255
    return np.repeat(gray.astype(np.uint8)[..., None], 3, axis=2)


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The world source, reading the pointer at each tick, into ``video``."""
    ctx.doc("control", defaults={"autopilot": False})
    pointer = ctx.input("pointer", schema=POINTER)

    def world() -> Iterator[np.ndarray]:
        """A frame every 1/24 s, lit where the pointer is at that tick."""
        due = time.monotonic()
        ticks = 0
        while True:
            due = max(due + 1 / FPS, time.monotonic() - 1 / FPS)  # a late tick is not caught up
            time.sleep(max(0.0, due - time.monotonic()))
            x, y = pointer.latest((0.5, 0.5))  # the pointer now (the middle before a sample)
            ticks += 1
            yield render(ticks / FPS, x, y)

    return ctx.source(world, reads=pointer) | ctx.stream("video")


async def autopilot(pipeline: rxstream.Pipeline, ctx: rxstream.Context) -> None:
    """Circle the pointer while ``autopilot`` is on."""
    on = ctx.control.desired.autopilot
    started = time.monotonic()
    while True:
        await asyncio.sleep(SAMPLE_S)
        if on.value:
            angle = (time.monotonic() - started) * 2.0
            pipeline.feed("pointer", (0.5 + 0.3 * math.cos(angle), 0.5 + 0.3 * math.sin(angle)))


async def main(ctx: rxstream.Context) -> None:
    """Check one frame with drive(), then run with the autopilot beside it."""
    pipeline = build(ctx)
    with ctx.self_test():
        pipeline.feed("pointer", (0.25, 0.75))
        (frame,) = pipeline.drive(frames=1, items=True)
        assert frame.payload.shape == (HEIGHT, WIDTH, 3), frame.payload.shape
        assert frame.metadata.input_seq == 1, frame.metadata  # the sample the tick read
    ctx.spawn(autopilot(pipeline, ctx))  # its failure ends run(); run() ends it
    await pipeline.run()
