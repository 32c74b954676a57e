"""A producer-triggered partition for the walk tests: rank 0 thinks, rank 1 talks in chunks.

Rank 0's source emits 0..8. Its ``consumer_walk``, which must run on the producer's rank (it
raises anywhere else), picks ``loud`` for the items whose ``index // 2`` is even and ``quiet``
for the others, so every ``FixedSize(2)`` chunk has one walk. Rank 1 runs the picked walk on
each chunk; when ``out`` is set, each walk's stage appends a JSON line per chunk to that file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import rxstream
from rxstream.topology import FixedSize, ProducerWalkCtx


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank."""
    doc = ctx.doc("control", defaults={"out": ""})

    def pick(walk_ctx: ProducerWalkCtx) -> str:
        if ctx.rank != 0:
            raise RuntimeError(f"consumer_walk ran on rank {ctx.rank}, not the producer's")
        return "loud" if walk_ctx.loop_iters[walk_ctx.node] // 2 % 2 == 0 else "quiet"

    def record(walk: str) -> Callable[[list[int]], Any]:
        def write(chunk: list[int]) -> tuple[str, list[int]]:
            out = doc.desired.out.value
            if out:
                line = {"walk": walk, "chunk": chunk, "rank": ctx.rank}
                with open(out, "a", encoding="utf-8") as file:
                    file.write(json.dumps(line) + "\n")
            return walk, chunk

        return write

    return (
        ctx.source(range(9), name="think")
        | ctx.walks(
            {
                "loud": ctx.pipe(record("loud"), name="shout"),
                "quiet": ctx.pipe(record("quiet"), name="whisper"),
            },
            consumer_walk=pick,
            chunks=lambda: FixedSize(2),
            name="talk",
            rank=1,
        )
        | ctx.stream("speech")
    )
