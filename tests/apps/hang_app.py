"""A two-rank app for the stall tests; ``mode`` in the control doc picks a behaviour.

- ``hang``: rank 1's ``decode`` never returns from its 5th frame; ``pace`` on rank 1 keeps the
  stream going with idle repeats of the last frame, and rank 0's source stalls on the full ring.
- ``slow``: ``decode`` sleeps 0.05 s a frame (it sets the rate).
- ``normal``: frames cross and egress.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import numpy as np

import rxstream


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank."""
    doc = ctx.doc("control", defaults={"mode": "normal", "busy": 0.0})
    mode = doc.desired.mode.value
    if doc.desired.busy.value:
        ctx.busy_limit_s = doc.desired.busy.value
    never = threading.Event()

    def frames() -> Iterator[np.ndarray]:
        for index in itertools.count():
            yield np.full((4, 4), index, dtype=np.int64)

    def decode(frame: np.ndarray) -> np.ndarray:
        if mode == "hang" and int(frame.flat[0]) == 4:
            never.wait()
        if mode == "slow":
            time.sleep(0.05)
        return frame

    return (
        ctx.source(frames, name="frames", rank=0)
        | ctx.pipe(decode, name="decode", rank=1)
        | ctx.pace(fps=24, rank=1)
        | ctx.stream("video", rank=1)
    )
