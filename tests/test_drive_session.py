"""Consecutive drive() calls are one continuing session; reset(), stop() and start() end it."""

from __future__ import annotations

import asyncio
import gc
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from reactivex import operators as ops

import rxstream
from rxstream import PipelineItem, PipelineStateError
from rxstream.doc import Snapshot
from rxstream.testing import drive, drive_items, live_threads


def test_two_drives_continue_a_generator(ctx: rxstream.Context) -> None:
    """A generator source is not closed by a drive: the next drive gets its next items."""
    closed: list[bool] = []

    def counting() -> Iterator[int]:
        try:
            yield from range(10)
        finally:
            closed.append(True)

    pipeline = ctx.source(counting()) | ctx.pipe(lambda x: x * 2)
    assert drive(pipeline, 3) == [0, 2, 4]
    assert closed == []
    assert drive(pipeline, 3) == [6, 8, 10]
    assert drive(pipeline, 0) == []  # pulls nothing, closes nothing
    assert drive(pipeline, 2) == [12, 14]
    pipeline.reset()
    assert closed == [True]


@pytest.mark.parametrize(
    "make_source",
    [
        pytest.param(lambda: iter(range(10)), id="iterator"),
        pytest.param(lambda: range(10), id="iterable"),
        pytest.param(lambda: lambda: iter(range(10)), id="generator-function"),
    ],
)
def test_every_kind_of_source_continues_alike(ctx: rxstream.Context, make_source: Any) -> None:
    """An iterator, an iterable and a generator function all continue between drives."""
    pipeline = ctx.source(make_source()) | ctx.stream("out")
    assert [drive(pipeline, 3), drive(pipeline, 3)] == [[0, 1, 2], [3, 4, 5]]


def test_a_generator_function_is_called_once_per_session(ctx: rxstream.Context) -> None:
    """Drives call the generator function once; reset() makes the next drive call it again."""
    calls = itertools.count()

    def frames() -> Iterator[tuple[int, int]]:
        session = next(calls)
        for i in range(100):
            yield session, i

    pipeline = ctx.source(frames) | ctx.stream("out")
    assert drive(pipeline, 2) + drive(pipeline, 2) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    pipeline.reset()
    assert drive(pipeline, 2) == [(1, 0), (1, 1)]


def test_a_bound_stage_is_built_once_across_drives(ctx: rxstream.Context) -> None:
    """doc.bind constructs once for many drives; a dep change between drives rebuilds once."""
    doc = ctx.doc("control", defaults={"model": {"factor": 2}, "prompt": "a"})
    built: list[int] = []

    def construct(d: Snapshot) -> Any:
        factor = d.model.factor.value
        built.append(factor)
        return lambda x: x * factor

    bound = doc.bind(construct, [doc.desired.model.factor], name="scale")
    pipeline = ctx.source(itertools.count()) | bound
    assert drive(pipeline, 3) == [0, 2, 4]
    doc.set(prompt="b")  # not a dep: nothing rebuilds
    assert drive(pipeline, 3) == [6, 8, 10]
    assert built == [2]
    doc.set(model={"factor": 10})
    out = drive_items(pipeline, 3)
    assert [item.payload for item in out] == [60, 70, 80]
    assert [item.metadata.cutover for item in out] == [True, False, False]
    assert drive(pipeline, 1) == [90]
    assert built == [2, 10]


def test_pace_continues_its_clock_between_drives(ctx: rxstream.Context) -> None:
    """Drives of 3 + 3 frames through a pace give the pts/idle sequence of one drive of 6."""

    def run(splits: list[int]) -> list[tuple[Any, int, bool]]:
        pipeline = ctx.source(range(20)) | ctx.pace(fps=10)
        out: list[PipelineItem] = []
        for frames in splits:
            out += drive_items(pipeline, frames, interval=0.25)
        return [(i.payload, i.metadata.pts, i.metadata.idle) for i in out]

    whole = run([6])
    assert run([3, 3]) == whole
    assert run([2, 1, 3]) == whole
    assert [pts for _, pts, _ in whole] == list(range(len(whole)))


def test_a_partial_batch_carries_on(ctx: rxstream.Context) -> None:
    """A window(count=) batch left open by one drive is completed by the next."""
    pipeline = ctx.source(range(10)) | ctx.window(count=4) | ctx.pipe(sum)
    assert drive(pipeline, 5) == [0 + 1 + 2 + 3]
    assert drive(pipeline, 3) == [4 + 5 + 6 + 7]


def test_a_time_window_continues_on_the_same_clock(ctx: rxstream.Context) -> None:
    """The second drive's pulls come interval after the first's last one, on one clock."""
    pipeline = ctx.source(range(10)) | ctx.window(ms=250)
    first = drive_items(pipeline, 2, interval=0.1)
    second = drive_items(pipeline, 4, interval=0.1)
    assert [i.payload for i in first + second] == [[0, 1], [2, 3, 4], [5]]


def test_statistics_add_up_over_a_session(ctx: rxstream.Context) -> None:
    """A stage's counters count every drive of the session, and start over after reset()."""
    pipeline = ctx.source(range(10)) | ctx.pipe(lambda x: x, name="same")
    drive(pipeline, 2)
    drive(pipeline, 3)
    assert pipeline.statistics()["same"].items_out == 5
    pipeline.reset()
    assert pipeline.statistics()["same"].items_out == 5  # the ended session's, still readable
    drive(pipeline, 1)
    assert pipeline.statistics()["same"].items_out == 1


def test_reset_starts_over(ctx: rxstream.Context) -> None:
    """reset() ends the session: an iterable source, windows and pace start from scratch."""
    pipeline = ctx.source(range(10)) | ctx.window(count=3) | ctx.pace(fps=10)
    first = drive_items(pipeline, 4)
    pipeline.reset()
    again = drive_items(pipeline, 4)
    assert [(i.payload, i.metadata.pts) for i in first] == [([0, 1, 2], 0)]
    assert [(i.payload, i.metadata.pts) for i in again] == [([0, 1, 2], 0)]


def test_reset_drops_what_the_stages_held_and_counts_it(ctx: rxstream.Context) -> None:
    """Items in an open window when the session ends are dropped with reason 'stopped'."""
    pipeline = ctx.source(range(10)) | ctx.window(count=4)
    drive(pipeline, 6)
    pipeline.reset()
    assert dict(pipeline.statistics()["window"].dropped) == {"stopped": 2}


def test_start_after_drives_starts_a_fresh_threaded_run(ctx: rxstream.Context) -> None:
    """start() after drives runs the sources from their start, and a later drive starts over."""
    pipeline = ctx.source(range(4)) | ctx.stream("out")
    assert drive(pipeline, 2) == [0, 1]
    pipeline.start()
    assert pipeline.wait(10.0)
    transport = ctx.transport
    assert isinstance(transport, rxstream.transport.MemoryTransport)
    assert transport.payloads("out") == [0, 1, 2, 3]
    assert drive(pipeline, 2) == [0, 1]  # a drive after a threaded run: a new session


def test_a_drive_after_the_sources_ended_raises(ctx: rxstream.Context) -> None:
    """Driving past the end returns the rest once, then raises PipelineStateError."""
    pipeline = ctx.source(iter(range(5)), name="frames") | ctx.window(count=2)
    assert drive(pipeline, 4) == [[0, 1], [2, 3]]
    assert drive(pipeline, 4) == [[4]]  # the end is found: the open window is flushed
    message = (
        r"^drive\(frames=4\) can produce nothing: the pipeline's sources have ended "
        r"\('frames'\); pipeline.reset\(\) starts the session over$"
    )
    with pytest.raises(PipelineStateError, match=message):
        drive(pipeline, 4)
    with pytest.raises(PipelineStateError, match=message):
        drive(pipeline, 4)
    assert drive(pipeline, 0) == []  # asks for nothing: not an error


def test_an_empty_source_raises_on_its_first_drive(ctx: rxstream.Context) -> None:
    """A source that ends before its first item makes the drive raise, not return []."""
    pipeline = ctx.source([], name="nothing") | ctx.stream("out")
    with pytest.raises(PipelineStateError, match=r"sources have ended \('nothing'\)"):
        drive(pipeline, 1)


def test_one_ended_source_of_two_does_not_raise(ctx: rxstream.Context) -> None:
    """With one source still giving items, a drive goes on (merge of two sources)."""
    short = ctx.source(range(1), name="short")
    long = ctx.source(range(10, 20), name="long")
    pipeline = [short, long] | ctx.merge()
    assert drive(pipeline, 1) == [0, 10]
    assert drive(pipeline, 1) == [11]


def test_a_completed_pipeline_raises_though_a_source_goes_on(ctx: rxstream.Context) -> None:
    """A zip completes with its shorter input: later drives say so rather than return []."""
    short = ctx.source(range(2), name="short")
    long = ctx.source(itertools.count(10), name="long")
    pipeline = [short, long] | ctx.zip()
    assert drive(pipeline, 3) == [(0, 10), (1, 11)]  # the third pull ends 'short'
    message = (
        r"^drive\(frames=2\) can produce nothing: the pipeline has completed "
        r"\(sources ended: 'short'\); pipeline.reset\(\) starts the session over$"
    )
    with pytest.raises(PipelineStateError, match=message):
        drive(pipeline, 2)


def test_a_failed_drive_ends_its_session(ctx: rxstream.Context) -> None:
    """A stage that raises ends the session: the next drive starts a new one."""
    fail = [True]

    def flaky(x: int) -> int:
        if x == 1 and fail[0]:
            fail[0] = False
            raise ValueError("once")
        return x

    pipeline = ctx.source(range(5)) | ctx.pipe(flaky)
    with pytest.raises(rxstream.PipelineError):
        drive(pipeline, 3)
    assert drive(pipeline, 3) == [0, 1, 2]


def test_a_driven_input_waits_for_more_samples(ctx: rxstream.Context) -> None:
    """An input with nothing queued is not ended by a drive: later samples go through."""
    pipeline = ctx.input("keys") | ctx.stream("out")
    pipeline.feed("keys", "a")
    assert drive(pipeline, 3) == ["a"]
    assert drive(pipeline, 3) == []  # nothing fed: nothing out, no error
    pipeline.feed("keys", "b")
    pipeline.feed("keys", "c")
    assert drive(pipeline, 3) == ["b", "c"]


def test_a_periodic_rx_operator_does_not_keep_a_drive_going(ctx: rxstream.Context) -> None:
    """ops.sample ticks forever; a drive still returns once its pulls are done."""
    pipeline = ctx.source(itertools.count()) | ctx.rx(ops.sample(0.25))
    assert drive(pipeline, 6, interval=0.1) == [2, 4]
    assert drive(pipeline, 3, interval=0.1) == [7]


def test_an_async_source_continues_and_leaves_no_thread(ctx: rxstream.Context) -> None:
    """An async generator continues between drives; no thread runs between them."""

    async def frames() -> AsyncIterator[int]:
        for i in range(10):
            await asyncio.sleep(0)
            yield i

    pipeline = ctx.source(frames) | ctx.stream("out")
    assert drive(pipeline, 2) == [0, 1]
    assert live_threads() == []
    assert drive(pipeline, 2) == [2, 3]
    pipeline.reset()
    assert live_threads() == []


def test_an_async_session_never_reset_is_cleaned_up(ctx: rxstream.Context) -> None:
    """A driven session with an async source that is simply dropped closes its loop quietly."""

    async def frames() -> AsyncIterator[int]:
        for i in range(10):
            yield i

    pipeline = ctx.source(frames) | ctx.stream("out")
    assert drive(pipeline, 2) == [0, 1]
    del pipeline
    gc.collect()  # an unclosed loop would warn here (warnings are errors in this suite)


def test_a_self_tests_drives_end_with_the_block(ctx: rxstream.Context) -> None:
    """What a self test drove is released when its block ends: bound stage closed, source reset."""
    doc = ctx.doc("control", defaults={"gain": 2})
    log: list[str] = []

    class Gain:
        def __init__(self, gain: int) -> None:
            self.gain = gain
            log.append(f"build {gain}")

        def __call__(self, x: int) -> int:
            return x * self.gain

        def close(self) -> None:
            log.append(f"close {self.gain}")

    probe = ctx.source(range(10)) | doc.bind(lambda d: Gain(d.gain.value), [doc.desired.gain])
    with ctx.self_test():
        assert drive(probe, 2) == [0, 2]
        assert drive(probe, 1) == [4]  # inside the block the session goes on
    assert log == ["build 2", "close 2"]
    doc.set(gain=3)  # the ended session is not subscribed: nothing rebuilds
    assert log == ["build 2", "close 2"]
    assert drive(probe, 1) == [0]  # a new session
    assert log == ["build 2", "close 2", "build 3"]


def test_reset_on_a_running_pipeline_raises(ctx: rxstream.Context) -> None:
    """reset() is for driven sessions: on a threaded run it says to stop first."""
    pipeline = ctx.input("keys") | ctx.stream("out")
    pipeline.start()
    try:
        with pytest.raises(PipelineStateError, match=r"^reset\(\) on a running pipeline"):
            pipeline.reset()
    finally:
        pipeline.stop()
