"""An ``async def main(ctx)`` app for the ``rxstream run``/``test`` tests: it clicks itself.

Each click fed to the ``clicks`` input (declared bound: 10 a session) becomes a ``size`` x
``size`` frame on ``video``. ``main`` checks one frame in its self test (on a probe pipeline of
its own), runs the pipeline, feeds ``clicks`` clicks — printing ``refused after N: …`` when the
input's limit refuses one — and then holds the session until it ends. ``build`` is the same
pipeline, for launching without ``main`` (``main_app.py:build``).
"""

from __future__ import annotations

import asyncio

import numpy as np

import rxstream
from rxstream.topology import ClientStreamLimitExceeded, ClientStreamLimits

DEFAULTS = {"clicks": 10, "size": 16}


def compose(ctx: rxstream.Context, doc: rxstream.Doc) -> rxstream.Pipeline:
    """clicks -> a frame a click -> video."""
    size = doc.desired.size.value

    def paint(click: int) -> np.ndarray:
        return np.full((size, size, 3), click * 20 % 256, dtype=np.uint8)

    return (
        ctx.input("clicks", limits=ClientStreamLimits(max_items=10))
        | ctx.pipe(paint)
        | ctx.stream("video")
    )


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The pipeline alone."""
    return compose(ctx, ctx.doc("control", defaults=DEFAULTS))


async def main(ctx: rxstream.Context) -> None:
    """Self test, then run and click."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    with ctx.self_test():
        probe = compose(ctx, doc)
        probe.feed("clicks", 1)
        (frame,) = probe.drive(frames=1)
        assert frame.shape == (doc.desired.size.value,) * 2 + (3,), frame.shape
    pipeline = compose(ctx, doc)
    session = asyncio.ensure_future(pipeline.run())
    await asyncio.sleep(0)  # run() has started the pipeline
    fed = 0
    try:
        for click in range(1, doc.desired.clicks.value + 1):
            pipeline.feed("clicks", click)
            fed += 1
    except ClientStreamLimitExceeded as exc:
        print(f"refused after {fed}: {exc}", flush=True)
    print(f"fed {fed} clicks", flush=True)
    await session
