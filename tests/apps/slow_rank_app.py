"""A source on rank 0 and a sink on rank 1, whose build is slow (as a rank importing a model).

Rank 1 writes when its build finished, and the source when it was first pulled, each as
``time.monotonic()`` (one clock for every process on a host) into the folder named by
``RXSTREAM_TEST_REPORT``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import rxstream

BUILD_S = 1.0


def _note(name: str) -> None:
    Path(os.environ["RXSTREAM_TEST_REPORT"], name).write_text(repr(time.monotonic()))


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """Ten numbers from rank 0, doubled and egressed on rank 1."""

    def numbers() -> Iterator[int]:
        _note("first_pull")
        yield from range(10)

    if ctx.rank == 1:
        time.sleep(BUILD_S)
    pipeline = (
        ctx.source(numbers, rank=0)
        | ctx.pipe(lambda x: 2 * x, name="double", rank=1)
        | ctx.stream("out", rank=1)
    )
    if ctx.rank == 1:
        _note("rank1_built")
    return pipeline
