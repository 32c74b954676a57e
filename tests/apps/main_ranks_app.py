"""An ``async def main(ctx)`` app for launching on two ranks; ``mode`` picks a behaviour.

``main`` feeds numbered ticks into ``ticks`` (rank 0); ``work`` (rank 1 when ``ctx.world > 1``)
turns each into ``{"n", "tag", "rank", "pid"}``, reading the control doc's ``tag`` inline, and
``out`` (rank 1 too) egresses it, with the prompt generation ``work``'s rank knows. ``main``
writes ``tag`` twice: ``before run`` (a steer: generation 1) before its pipeline runs and
``during run`` after feeding tick 1 — on two ranks with ``seen`` set, only once rank 1 wrote
its pid to the file ``seen`` names, on its first tick.

- ``normal``: as above, until the session ends.
- ``raise``: ``work`` raises on tick 5; ``main`` prints ``main caught: <error>`` and re-raises.
- ``die``: ``work`` ends its process on tick 5 (exit code 3).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import rxstream

DEFAULTS = {"mode": "normal", "tag": "", "seen": ""}


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """ticks (rank 0) -> work -> out (rank 1 on two ranks)."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    worker = 1 if ctx.world > 1 else None

    def work(n: int) -> dict[str, Any]:
        mode = doc.desired.mode.value
        if n == 5 and mode == "raise":
            raise RuntimeError(f"rank {ctx.rank} broke on tick 5")
        if n == 5 and mode == "die":
            os._exit(3)
        out = {
            "n": n,
            "tag": doc.desired.tag.value,
            "rank": ctx.rank,
            "pid": os.getpid(),
            "generation": ctx.generations.prompt,
        }
        seen = doc.desired.seen.value
        if seen and ctx.rank > 0 and not os.path.exists(seen):
            Path(seen).write_text(str(os.getpid()))
        return out

    return (
        ctx.input("ticks", capacity=1000)
        | ctx.pipe(work, name="work", rank=worker)
        | ctx.stream("out", rank=worker)
    )


async def main(ctx: rxstream.Context) -> None:
    """Self test in this process, then run on every rank and feed ticks until it ends."""
    pipeline = build(ctx)
    with ctx.self_test():
        pipeline.feed("ticks", 1)
        (first,) = pipeline.drive(frames=1)
        assert first["n"] == 1, first
    doc = ctx.control
    doc.steer(tag="before run")
    session = asyncio.ensure_future(pipeline.run())
    try:
        pipeline.feed("ticks", 1)
        seen = Path(doc.desired.seen.value) if ctx.world > 1 and doc.desired.seen.value else None
        while seen is not None and not seen.exists() and not session.done():
            await asyncio.sleep(0.01)
        doc.set(tag="during run")
        for n in itertools.count(2):
            if session.done():
                break
            pipeline.feed("ticks", n)
            await asyncio.sleep(0.01)
        await session
    except rxstream.PipelineError as exc:
        print(f"main caught: {exc}", flush=True)
        raise
    finally:
        session.cancel()
