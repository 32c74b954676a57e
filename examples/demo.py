"""The main job of ``make demo``: a synthetic interactive "world", steered while it runs.

A torch source renders frames whose palette follows the prompt (an inline read of the
control doc), a decoder bound to the doc with ``doc.bind`` turns them into uint8 images and is
rebuilt when ``vae.model`` changes, ``pace`` holds 24 fps and the ``video`` sink egresses
them. The app checks itself with ``drive()`` first, then runs threaded: after one second it
steers to a new prompt (stale frames are dropped, the first new one is the cutover), after two
it swaps the decoder (built off the hot path, then switched between two frames). At the end it
prints per-stage statistics.

    python examples/demo.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import zlib
from collections.abc import Callable, Iterator

import numpy as np
import torch

import rxstream
from rxstream.doc import Doc, Snapshot
from rxstream.transport import MemoryTransport

HEIGHT, WIDTH = 144, 256
DEFAULTS = {"prompt": "a calm sea at dawn", "vae": {"model": "smooth"}}


def render(t: int, prompt: str) -> torch.Tensor:
    """A CHW float frame of a pattern that drifts with ``t``, coloured by ``prompt``."""
    hue = (zlib.crc32(prompt.encode()) % 360) / 360.0
    ys = torch.linspace(0, 1, HEIGHT).view(HEIGHT, 1)
    xs = torch.linspace(0, 1, WIDTH).view(1, WIDTH)
    phase = t / 24.0
    wave = 0.5 + 0.5 * torch.sin(6.28 * (xs + ys / 2 + phase))
    channels = [
        (0.5 + 0.5 * torch.cos(6.28 * (wave + hue + offset))).expand(HEIGHT, WIDTH)
        for offset in (0.0, 1 / 3, 2 / 3)
    ]
    return torch.stack(channels)


def make_world(doc: Doc) -> Callable[[], Iterator[torch.Tensor]]:
    """The source: frames of the world, forever, in the prompt's colours (read inline)."""

    def world() -> Iterator[torch.Tensor]:
        t = 0
        while True:
            frame = render(t, doc.desired.prompt.value)
            yield frame + 0.05 * torch.randn(3, HEIGHT, WIDTH)
            t += 1

    return world


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
    """The demo pipeline (the doc is ``ctx.doc("control")``)."""
    doc = ctx.doc("control", defaults=DEFAULTS)

    def make_decoder(d: Snapshot) -> rxstream.Stage:
        return ctx.pipe(Decoder(d.vae.model.value), name="decode")

    return (
        ctx.source(make_world(doc))
        | doc.bind(make_decoder, [doc.desired.vae.model], name="decode")
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
    stages = " | ".join(pipeline.stages)
    print(f"self test passed: one {frame.shape} {frame.dtype} frame through {stages}")

    async def steer_and_leave() -> None:
        await asyncio.sleep(seconds / 3)
        print("  steer: prompt -> 'a storm over the mountains'")
        pipeline.update(prompt="a storm over the mountains")
        await asyncio.sleep(seconds / 3)
        print("  set: vae.model -> 'sharp' (doc.bind rebuilds the decoder)")
        ctx.control.set(vae={"model": "sharp"})
        await asyncio.sleep(seconds / 3)
        transport.disconnect()

    print(f"running {seconds:g} s at 24 fps")
    driver = asyncio.create_task(steer_and_leave())
    await pipeline.run()
    await driver
    last = transport.items("video")[-1].metadata
    sent = pipeline.statistics()["video"].items_out
    print(
        f"{sent} frames egressed on 'video'; the last has "
        f"pts={last.pts} prompt_generation={last.prompt_generation}\n"
    )
    print(rxstream.format_statistics(pipeline.statistics()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="how long to run")
    asyncio.run(main(parser.parse_args().seconds))
