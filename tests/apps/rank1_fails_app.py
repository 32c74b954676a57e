"""A two-rank app whose rank-1 stage raises on item 3, for the CLI's failure output.

Rank 1's process lingers ``LINGER_S`` at its exit (an ``atexit`` wait, as an app's own
clean-up may): the controller's last word to it (``stop``) then arrives while the process is
still there, which is when a control pipe closed under its listener's read showed an internal
traceback.
"""

from __future__ import annotations

import atexit
import itertools
import time

import rxstream

LINGER_S = 0.3


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank: numbers on rank 0, a stage on rank 1 that breaks."""
    if ctx.rank == 1:
        atexit.register(time.sleep, LINGER_S)

    def work(index: int) -> int:
        if index == 3:
            raise RuntimeError("rank 1 broke on item 3")
        return index

    return (
        ctx.source(itertools.count(), rank=0)
        | ctx.pipe(work, name="work", rank=1)
        | ctx.stream("numbers")
    )
