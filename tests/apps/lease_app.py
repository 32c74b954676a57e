"""Frames made in leased ring slots on rank 0 and read on rank 1, for tests/test_ipc_lease.py.

``render`` (rank 0) fills ``ctx.lease``'s array with the frame's index; ``check`` (rank 1)
checks every pixel and hands on the frame; ``video`` (rank 1) egresses it. rank 0's statistics
table says how many of ``render``'s frames crossed in place (its ``zero copy`` column).
"""

from __future__ import annotations

import itertools

import numpy as np

import rxstream

HEIGHT, WIDTH = 48, 64


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank."""

    def render(index: int) -> np.ndarray:
        frame: np.ndarray = ctx.lease((HEIGHT, WIDTH, 3), np.uint8)
        frame[...] = index % 251
        return frame

    def check(frame: np.ndarray) -> np.ndarray:
        value = int(frame[0, 0, 0])
        if not (frame == value).all():
            raise ValueError(f"frame {value} arrived torn")
        return frame

    return (
        ctx.source(itertools.count(), name="src")
        | ctx.pipe(render, name="render")
        | ctx.pipe(check, name="check", rank=1)
        | ctx.stream("video")
    )
