"""A source's pull on its thread: a frame function's first result, an input's wait for samples."""

from __future__ import annotations

import itertools
import threading

import rxstream
from rxstream.testing import wait_idle
from rxstream.transport import MemoryTransport


def test_a_frame_function_gives_its_first_result_then_is_called_once_a_pull(
    ctx: rxstream.Context,
) -> None:
    """The open's call is the first payload (pts 0); every further pull calls it again."""
    calls = itertools.count()
    enough = threading.Event()
    got: list[int] = []

    def frame() -> int:
        return next(calls)

    def seen(x: int) -> int:
        got.append(x)
        if x >= 20:
            enough.set()
        return x

    pipeline = ctx.source(frame, name="src") | ctx.pipe(seen, name="p") | ctx.stream("out")
    pipeline.start()
    try:
        assert enough.wait(30)
    finally:
        pipeline.stop()
    assert isinstance(ctx.transport, MemoryTransport)
    assert got[:21] == list(range(21))
    items = ctx.transport.items("out")  # those a stop let through
    assert [(i.payload, i.metadata.pts) for i in items] == [(n, n) for n in range(len(items))]


def test_a_frame_function_under_drive_starts_with_its_open_result(ctx: rxstream.Context) -> None:
    """drive(): the same stream, the first frame the open's call, one call a frame after."""
    calls = itertools.count()
    pipeline = ctx.source(lambda: next(calls), name="src") | ctx.pipe(lambda x: x * 10)
    assert pipeline.drive(frames=4) == [0, 10, 20, 30]


def test_an_inputs_wait_for_samples_is_wait_not_work(ctx: rxstream.Context) -> None:
    """The input's source thread waits for a sample: its wait_s grows, its work_s does not."""
    pipeline = ctx.input("pointer") | ctx.pipe(lambda x: x, name="p") | ctx.stream("out")
    pipeline.start()
    try:
        pipeline.feed("pointer", 1)
        assert wait_idle(pipeline, 30)
        first = pipeline.statistics()["pointer"]
        pipeline.feed("pointer", 2)  # the pull that took it waited since the first
        assert wait_idle(pipeline, 30)
        stats = pipeline.statistics()["pointer"]
    finally:
        pipeline.stop()
    assert stats.items_out == 2
    assert stats.wait_s > first.wait_s
    assert stats.wait_s > stats.work_s


def test_a_source_counts_the_cutovers_it_emits() -> None:
    """The cutover a steer makes, and one an app's item carries, count at the source too."""
    ctx = rxstream.Context(transport=MemoryTransport())
    ctx.doc("control", defaults={"prompt": "a"})
    pipeline = ctx.source(range(100), name="src") | ctx.pipe(abs, name="f") | ctx.stream("out")
    pipeline.drive(frames=2)
    pipeline.update(prompt="b")
    pipeline.drive(frames=2)
    assert {name: s.cutovers for name, s in pipeline.statistics().items()} == {
        "src": 1,
        "f": 1,
        "out": 1,
    }
    ctx = rxstream.Context(transport=MemoryTransport())
    marked = rxstream.PipelineItem(1, rxstream.PipelineMetadata(cutover=True))
    pipeline = ctx.source([marked], name="src") | ctx.stream("out")
    pipeline.drive(frames=1)
    assert pipeline.statistics()["src"].cutovers == 1
