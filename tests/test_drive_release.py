"""A driven pipeline is garbage once its session ended and nothing refers to it."""

from __future__ import annotations

import gc
import weakref

import numpy as np

import rxstream


def _pipeline(ctx: rxstream.Context) -> rxstream.Pipeline:
    """A pipeline one of whose stages refers to it (as a stage that steers it does, or a
    context whose transport holds the session's pipeline)."""
    held: list[rxstream.Pipeline] = []

    def frame() -> np.ndarray:
        assert held
        return np.zeros((4, 4, 3), dtype=np.uint8)

    pipeline = ctx.source(frame) | ctx.stream("video")
    held.append(pipeline)
    return pipeline


def test_a_reset_pipeline_is_collected() -> None:
    """After ``reset()`` the session's finalizer no longer holds the run, so the pipeline and
    its context are collected once unreferenced (a warm worker builds one per session)."""
    ctx = rxstream.Context()
    pipeline = _pipeline(ctx)
    pipeline.drive(frames=1)
    pipeline.reset()
    gone = weakref.ref(pipeline), weakref.ref(ctx)
    del pipeline, ctx
    gc.collect()
    assert [ref() for ref in gone] == [None, None]


def test_a_self_tested_pipeline_is_collected() -> None:
    """A pipeline driven inside ``ctx.self_test()`` is collected once unreferenced: the
    block's end ends its session."""
    ctx = rxstream.Context()
    pipeline = _pipeline(ctx)
    with ctx.self_test():
        pipeline.drive(frames=1)
    gone = weakref.ref(pipeline)
    del pipeline, ctx
    gc.collect()
    assert gone() is None
