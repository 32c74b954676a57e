"""A two-rank app whose every frame is a new input: a timing record per frame, folded on rank 1.

rank 0: ``frames`` (items with ``input_seq`` 1, 2, … and ``input_at_ms`` set) and ``prepare``;
rank 1: ``work`` and the sink ``video``. Paced to ``fps`` (default 200) so that a run is short.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import rxstream


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank."""
    doc = ctx.doc("control", defaults={"fps": 200.0})

    def frames() -> Iterator[rxstream.PipelineItem]:
        for i in itertools.count():
            md = rxstream.PipelineMetadata(
                pts=i, input_seq=i + 1, input_at_ms=int(time.time() * 1000)
            )
            yield rxstream.PipelineItem(i, md)

    return (
        ctx.source(frames, name="frames", rank=0)
        | ctx.pace(fps=doc.desired.fps.value, rank=0)
        | ctx.pipe(lambda i: i + 1, name="prepare", rank=0)
        | ctx.pipe(lambda i: i * 2, name="work", rank=1)
        | ctx.stream("video", rank=1)
    )
