"""An ``async def main(ctx)`` app whose self test fails: ``rxstream test`` must exit 1."""

from __future__ import annotations

import numpy as np

import rxstream


def check_frame(frame: np.ndarray) -> None:
    """The app's own check: it wants a frame twice the size it gets."""
    assert frame.shape == (8, 8, 3), f"frame shape {frame.shape}, wanted (8, 8, 3)"


async def main(ctx: rxstream.Context) -> None:
    """A self test that fails, then a run that never comes."""
    pipeline = ctx.source([np.zeros((4, 4, 3), dtype=np.uint8)]) | ctx.stream("video")
    with ctx.self_test():
        (frame,) = pipeline.drive(frames=1)
        check_frame(frame)
    await pipeline.run()
