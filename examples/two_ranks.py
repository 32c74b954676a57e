"""Two ranks: a generator and a denoiser on rank 0, a decoder and the sink on rank 1.

Frames cross the rank boundary through a shared-memory ring: written once into a slot by
rank 0, read in place by rank 1. Run it with

    python examples/two_ranks.py            # launches 2 processes, 48 frames
    rxstream run examples/two_ranks.py --ranks 2 --frames 48
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import rxstream

HEIGHT, WIDTH = 270, 480


def frames() -> Iterator[np.ndarray]:
    """Float frames of a moving gradient, forever."""
    xs = np.linspace(0.0, 1.0, WIDTH, dtype=np.float32)
    t = 0
    while True:
        row = (xs + t / 48.0) % 1.0
        yield np.broadcast_to(row, (HEIGHT, WIDTH)).copy()
        t += 1


def denoise(frame: np.ndarray) -> np.ndarray:
    """A horizontal 3-tap box blur."""
    out = frame.copy()
    out[:, 1:-1] = (frame[:, :-2] + frame[:, 1:-1] + frame[:, 2:]) / 3
    return out


def decode(frame: np.ndarray) -> np.ndarray:
    """Float in [0, 1] to uint8 RGB."""
    gray = (frame * 255).astype(np.uint8)
    return np.stack([gray, gray, 255 - gray], axis=-1)


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank; each rank runs its own stages."""
    return (
        ctx.source(frames, rank=0)
        | ctx.pipe(denoise, rank=0)
        | ctx.pipe(decode, rank=1)
        | ctx.pace(fps=24, rank=1)
        | ctx.stream("video", rank=1)
    )


if __name__ == "__main__":
    result = rxstream.launch(str(Path(__file__)), ranks=2, frames=48, timeout=60)
    print(f"{result.egressed} frames egressed across {result.ranks} ranks\n")
    for rank, stats in sorted(result.statistics.items()):
        print(f"rank {rank}")
        print(rxstream.format_statistics(stats))
        print()
    sys.exit(0)
