"""Lifecycle: start/stop/wait/run/drive, errors as PipelineError, skip, async stages, self_test."""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import rxstream
from rxstream import PipelineError, PipelineStateError, SelfTestError
from rxstream.testing import live_threads, wait_idle
from rxstream.transport import MemoryTransport, Session


def identity(x: int) -> int:
    return x


def boom_at(n: int) -> Callable[[int], int]:
    def boom(x: int) -> int:
        if x == n:
            raise ValueError(f"bad frame {x}")
        return x

    return boom


def endless() -> Iterator[int]:
    yield from itertools.count()


def test_stop_with_full_inboxes_is_bounded_and_leaves_no_thread(ctx: rxstream.Context) -> None:
    """stop() returns within 0.5 s with every inbox full and the source blocked."""

    def crawl(x: int) -> int:
        time.sleep(0.02)
        return x

    pipeline = (
        ctx.source(endless)
        | ctx.pipe(identity, name="a")
        | ctx.pipe(identity, name="b")
        | ctx.pipe(crawl, name="c")
        | ctx.stream("out")
    )
    pipeline.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = pipeline.statistics()
        if all(stats[k].inbox_depth == 2 for k in ("a", "b", "c")):
            break
        time.sleep(0.005)
    else:
        pytest.fail(f"inboxes never filled: {pipeline.statistics()}")
    started = time.monotonic()
    pipeline.stop()
    assert time.monotonic() - started < 0.5
    assert live_threads() == []
    stats = pipeline.statistics()
    assert sum(s.dropped.get("stopped", 0) for s in stats.values()) >= 6
    pipeline.stop()  # idempotent


def test_stop_before_start_is_a_no_op(ctx: rxstream.Context) -> None:
    """stop() on a pipeline that never ran does nothing."""
    (ctx.source([1]) | ctx.stream("out")).stop()


def test_wait_before_start_is_an_error(ctx: rxstream.Context) -> None:
    """wait() with nothing running says so."""
    with pytest.raises(PipelineStateError, match=r"^wait\(\) before start\(\)"):
        (ctx.source([1]) | ctx.stream("out")).wait()


def test_start_twice_is_an_error(ctx: rxstream.Context) -> None:
    """A running pipeline cannot be started again until stopped."""
    pipeline = ctx.source(endless) | ctx.stream("out")
    pipeline.start()
    try:
        with pytest.raises(PipelineStateError, match=r"^start\(\) on a running pipeline"):
            pipeline.start()
    finally:
        pipeline.stop()


def test_raising_stage_surfaces_from_drive(ctx: rxstream.Context) -> None:
    """drive() raises PipelineError naming the stage, the item and the cause."""
    pipeline = ctx.source(range(5)) | ctx.pipe(boom_at(3), name="decode") | ctx.stream("out")
    with pytest.raises(
        PipelineError,
        match=r"^stage 'decode' failed on item pts=3 input_seq=0: ValueError: bad frame 3$",
    ) as info:
        pipeline.drive(frames=5)
    assert info.value.stage == "decode"
    assert info.value.pts == 3
    assert isinstance(info.value.__cause__, ValueError)


def test_raising_stage_surfaces_from_wait_and_stops_everything(ctx: rxstream.Context) -> None:
    """A failure in a threaded run ends it: wait() raises and no thread is left."""
    pipeline = ctx.source(endless) | ctx.pipe(boom_at(10), name="decode") | ctx.stream("out")
    pipeline.start()
    with pytest.raises(PipelineError, match=r"^stage 'decode' failed on item pts=10"):
        pipeline.wait(timeout=10)
    assert live_threads() == []


def test_raising_stage_surfaces_from_run(ctx: rxstream.Context) -> None:
    """await run() raises the PipelineError."""
    pipeline = ctx.source(endless) | ctx.pipe(boom_at(5), name="decode") | ctx.stream("out")
    with pytest.raises(PipelineError, match=r"^stage 'decode' failed on item pts=5"):
        asyncio.run(pipeline.run())


def test_raising_source_names_the_source(ctx: rxstream.Context) -> None:
    """A generator that raises ends the run with an error naming the source."""

    def frames() -> Iterator[int]:
        yield 1
        raise OSError("camera unplugged")

    with pytest.raises(PipelineError, match=r"^stage 'frames' failed on item pts=1 .*camera"):
        (ctx.source(frames) | ctx.stream("out")).drive(frames=3)


def test_skip_drops_logs_and_counts(ctx: rxstream.Context) -> None:
    """on_error='skip' drops the failing item, counts it and goes on."""
    pipeline = (
        ctx.source(range(5))
        | ctx.pipe(boom_at(2), name="decode", on_error="skip")
        | ctx.stream("out")
    )
    assert pipeline.drive(frames=5) == [0, 1, 3, 4]
    assert pipeline.statistics()["decode"].dropped == {"error": 1}


def test_run_returns_when_the_pipeline_completes(ctx: rxstream.Context) -> None:
    """A finite source ends run() once everything drained."""
    pipeline = ctx.source(range(10)) | ctx.pipe(identity) | ctx.stream("out")
    asyncio.run(pipeline.run(poll_interval=0.01))
    assert isinstance(ctx.transport, MemoryTransport)
    assert ctx.transport.payloads("out") == list(range(10))
    assert live_threads() == []


def test_run_stops_on_disconnect(ctx: rxstream.Context) -> None:
    """run() holds an endless pipeline while connected and stops when the client leaves."""
    pipeline = ctx.source(endless) | ctx.pipe(identity) | ctx.stream("out")
    transport = ctx.transport
    assert isinstance(transport, MemoryTransport)

    async def main() -> None:
        task = asyncio.create_task(pipeline.run(poll_interval=0.01))
        while transport.counts.get("out", 0) < 5:
            await asyncio.sleep(0.01)
        assert not task.done()
        transport.disconnect()
        await asyncio.wait_for(task, timeout=5)

    asyncio.run(main())
    assert live_threads() == []


def test_run_stops_on_cancellation(ctx: rxstream.Context) -> None:
    """Cancelling the task awaiting run() stops the pipeline."""
    pipeline = ctx.source(endless) | ctx.stream("out")

    async def main() -> None:
        task = asyncio.create_task(pipeline.run())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not pipeline.running
    assert live_threads() == []


def test_run_forwards_config_and_update_writes_it(ctx: rxstream.Context) -> None:
    """run(**config) is the initial desired state; update() writes into it."""
    pipeline = ctx.source(range(3)) | ctx.stream("out")
    asyncio.run(pipeline.run(prompt="a cat", steps=4))
    assert dict(pipeline.config) == {"prompt": "a cat", "steps": 4}
    pipeline.update(prompt="a dog")
    assert dict(pipeline.config) == {"prompt": "a dog", "steps": 4}


def test_async_stage_runs_on_the_pipeline_loop(ctx: rxstream.Context) -> None:
    """An ``async def`` stage function runs on run()'s event loop, in order."""
    loops: set[int] = set()

    async def enrich(x: int) -> int:
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0)
        return x + 100

    pipeline = ctx.source(range(5)) | ctx.pipe(enrich) | ctx.stream("out")

    async def main() -> int:
        await pipeline.run(poll_interval=0.01)
        return id(asyncio.get_running_loop())

    main_loop = asyncio.run(main())
    assert loops == {main_loop}
    assert isinstance(ctx.transport, MemoryTransport)
    assert ctx.transport.payloads("out") == [100, 101, 102, 103, 104]


def test_async_stage_and_async_source_under_drive(ctx: rxstream.Context) -> None:
    """drive() runs async stage functions and async generator sources too."""

    async def frames() -> object:
        for i in range(3):
            await asyncio.sleep(0)
            yield i

    async def enrich(x: int) -> int:
        return x * 10

    assert (ctx.source(frames) | ctx.pipe(enrich)).drive(frames=3) == [0, 10, 20]
    assert live_threads() == []


def test_frame_function_source_is_called_per_item(ctx: rxstream.Context) -> None:
    """A callable that returns a payload (not an iterator) is called once per item."""
    counter = itertools.count()
    assert (ctx.source(lambda: next(counter) * 2) | ctx.pipe(identity)).drive(frames=4) == [
        0,
        2,
        4,
        6,
    ]


def test_source_may_set_metadata_with_items(ctx: rxstream.Context) -> None:
    """A source yielding PipelineItems keeps their metadata (custom cutover logic)."""
    first = rxstream.PipelineItem("a", rxstream.PipelineMetadata(cutover=True, pts=90))
    (item,) = (ctx.source([first]) | ctx.pipe(str.upper)).drive(items=True)
    assert isinstance(item, rxstream.PipelineItem)
    assert item.payload == "A"
    assert item.metadata.cutover is True
    assert item.metadata.pts == 90


def test_drive_is_repeatable(ctx: rxstream.Context) -> None:
    """Two sessions of one pipeline (reset() between them) return the same output."""
    pipeline = ctx.source(range(6)) | ctx.window(count=4) | ctx.pace(fps=24)
    first = pipeline.drive(frames=7)
    pipeline.reset()
    assert first == pipeline.drive(frames=7) == [[0, 1, 2, 3], [4, 5]]


def test_drive_rejects_bad_frames(ctx: rxstream.Context) -> None:
    """frames must be a non-negative int."""
    with pytest.raises(ValueError, match=r"^frames must be an int >= 0, got -1$"):
        (ctx.source([1]) | ctx.stream("out")).drive(frames=-1)


def test_self_test_passes_and_fails(ctx: rxstream.Context) -> None:
    """Reaching the end of the block is a pass; a raise is a SelfTestError with its cause."""
    pipeline = ctx.source(range(3)) | ctx.pipe(identity) | ctx.stream("out")
    with ctx.self_test():
        assert pipeline.drive(frames=1) == [0]
    assert ctx.self_test_passed is True
    with (
        pytest.raises(SelfTestError, match=r"^self test failed: AssertionError: shape"),
        ctx.self_test(),
    ):
        raise AssertionError("shape")
    assert ctx.self_test_passed is False


class _CountingTransport(MemoryTransport):
    """Counts opens and closes, to check a session is closed as often as it was opened."""

    def __init__(self) -> None:
        super().__init__(keep=1)
        self.opened = 0
        self.closed = 0

    def open(self, session: Session) -> None:
        self.opened += 1

    def close(self) -> None:
        self.closed += 1


def _race(start: Callable[[], object], stop: Callable[[], object]) -> list[BaseException]:
    """Run ``start`` once and ``stop`` over and over (until start returned) from two threads
    let go together by a barrier; what either raised."""
    barrier = threading.Barrier(2)
    started = threading.Event()
    errors: list[BaseException] = []

    def starter() -> None:
        barrier.wait()
        try:
            start()
        except BaseException as exc:
            errors.append(exc)
        finally:
            started.set()

    def stopper() -> None:
        barrier.wait()
        try:
            while True:  # stop() lands anywhere in start(): before, during, after
                done = started.is_set()
                stop()
                if done:
                    return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=starter), threading.Thread(target=stopper)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_stop_racing_start_never_raises_and_leaves_nothing_running() -> None:
    """pipeline.stop() concurrent with start(), 60 times: no error, no thread, session closed."""
    for _ in range(60):
        transport = _CountingTransport()
        ctx = rxstream.Context(transport=transport)
        pipeline = ctx.source(endless) | ctx.pipe(identity, name="a") | ctx.stream("out")
        pipeline.plan  # noqa: B018 - compiled before the race, so start() is quick
        errors = _race(pipeline.start, pipeline.stop)
        pipeline.stop()
        assert errors == []
        assert not pipeline.running
        assert live_threads() == []
        assert transport.opened == transport.closed


def test_run_stop_racing_run_start_never_joins_an_unstarted_thread(ctx: rxstream.Context) -> None:
    """The runtime's ThreadedRun.stop() concurrent with start(), 60 times: never raises."""
    from rxstream.runtime._aio import AsyncBridge
    from rxstream.runtime._threaded import ThreadedRun

    pipeline = ctx.source(endless, name="s1") | ctx.pipe(identity, name="a") | ctx.stream("out")
    for _ in range(60):
        run = ThreadedRun(
            pipeline.plan,
            bridge=AsyncBridge(),
            generations=ctx.generations,
        )
        errors = _race(run.start, functools.partial(run.stop, 1.0))
        assert errors == []
        assert run.stop(1.0) == []
        assert live_threads() == []


def test_wait_idle_returns_once_every_fed_item_has_left(ctx: rxstream.Context) -> None:
    """wait_idle() returns True once fed samples went through a slow stage; False unstarted."""
    release = threading.Event()

    def held(x: int) -> int:
        release.wait(10)
        return x

    pipeline = ctx.input("pointer") | ctx.pipe(held, name="slow") | ctx.stream("out")
    assert not wait_idle(pipeline, 0.01)
    pipeline.start()
    try:
        for i in range(3):
            pipeline.feed("pointer", i)
        assert not wait_idle(pipeline, 0.05)  # held: an item is at work, another queued
        release.set()
        assert wait_idle(pipeline, 30)
        stats = pipeline.statistics()
        assert (stats["out"].items_out, stats["slow"].inbox_depth) == (3, 0)
    finally:
        pipeline.stop()


def test_wait_idle_waits_for_the_frames_a_pace_holds(ctx: rxstream.Context) -> None:
    """wait_idle() returns only once a pace has released every frame it buffered for its ticks."""
    pipeline = ctx.input("pointer") | ctx.pace(5, name="pace") | ctx.stream("out")
    pipeline.start()
    try:
        for i in range(4):
            pipeline.feed("pointer", i)
        assert wait_idle(pipeline, 30)
        transport = ctx.transport
        assert isinstance(transport, MemoryTransport)
        shown = [item.payload for item in transport.items("out") if not item.metadata.idle]
        assert shown == [0, 1, 2, 3]
        assert pipeline.statistics()["pace"].dropped == {}
    finally:
        pipeline.stop()


def test_wait_idle_waits_for_a_timed_window_to_close(ctx: rxstream.Context) -> None:
    """wait_idle() returns only once a timed window holding items has closed and emitted them."""
    pipeline = ctx.input("pointer") | ctx.window(ms=300, name="window") | ctx.stream("out")
    pipeline.start()
    try:
        for i in range(2):
            pipeline.feed("pointer", i)
        assert wait_idle(pipeline, 30)
        transport = ctx.transport
        assert isinstance(transport, MemoryTransport)
        assert [item.payload for item in transport.items("out")] == [[0, 1]]
    finally:
        pipeline.stop()
