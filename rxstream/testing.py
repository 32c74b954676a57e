"""Helpers for testing apps and pipelines built on rxstream."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from rxstream._exceptions import ArgumentTypeError
from rxstream.item import PipelineItem
from rxstream.pipeline import Pipeline
from rxstream.runtime._threaded import ThreadedRun
from rxstream.timing import TimingRecord
from rxstream.timing._emit import listen
from rxstream.transport import MemoryTransport

__all__ = [
    "MemoryTransport",
    "assert_same",
    "capture_timing",
    "drive",
    "drive_items",
    "live_threads",
    "wait_idle",
]


def live_threads() -> list[threading.Thread]:
    """The live threads rxstream started (all are named ``rxstream:<stage>``)."""
    return [t for t in threading.enumerate() if t.name.startswith("rxstream:")]


def wait_idle(pipeline: Pipeline, timeout: float) -> bool:
    """Wait until every stage of ``pipeline``'s threaded run is idle: inboxes empty, no stage
    at work, no timer due, no item held for a timer (a ``pace``'s buffered frames wait for
    their ticks, a timed ``window``'s open window for its close). With its sources quiet (a
    fed ``ctx.input``, a finished source), every item taken in has then left the pipeline or
    been dropped (or waits in a window closed by ``count``/``until`` for the items that close
    it), and ``statistics()`` says so. Returns whether that happened within ``timeout`` seconds
    (``False`` when nothing runs).
    """
    run = pipeline._run
    if not isinstance(run, ThreadedRun):
        return False
    deadline = time.monotonic() + timeout
    while not run.idle():  # looked at every 2 ms: the stage threads signal nothing for this
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, 0.002))
    return True


@contextlib.contextmanager
def capture_timing() -> Iterator[list[TimingRecord]]:
    """Collect every timing record emitted inside the block, from any pipeline or thread."""
    records: list[TimingRecord] = []
    lock = threading.Lock()

    def keep(record: TimingRecord) -> None:
        with lock:
            records.append(record)

    with listen(keep):
        yield records


def drive(pipeline: Pipeline, frames: int, interval: float = 0.0) -> list[Any]:
    """``pipeline.drive(frames)`` for a pipeline with one end: its payloads, typed as a list."""
    out = pipeline.drive(frames=frames, interval=interval)
    if not isinstance(out, list):
        raise ArgumentTypeError(
            f"drive() of a pipeline with several ends gives a dict, got {out!r}"
        )
    return out


def drive_items(pipeline: Pipeline, frames: int, interval: float = 0.0) -> list[PipelineItem]:
    """``pipeline.drive(frames, items=True)`` for a pipeline with one end: its items."""
    out = pipeline.drive(frames=frames, items=True, interval=interval)
    if not isinstance(out, list):
        raise ArgumentTypeError(
            f"drive() of a pipeline with several ends gives a dict, got {out!r}"
        )
    return out


def assert_same(got: Any, want: Any) -> None:
    """Deep equality for payloads: arrays and tensors by dtype, shape and values (and a
    tensor's ``requires_grad``), containers element by element, items by metadata and payload.
    """
    import numpy as np

    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        np.testing.assert_array_equal(got, want)
    elif type(want).__module__ == "torch":  # a tensor, without importing torch for others
        import torch

        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert got.requires_grad == want.requires_grad
        assert torch.equal(got.detach(), want.detach())
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, list | tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    elif isinstance(want, PipelineItem):
        assert got.metadata == want.metadata
        assert_same(got.payload, want.payload)
    else:
        assert got == want
