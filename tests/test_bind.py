"""doc.bind hot swaps, steer generations and cutover, flush resets — under drive and threads."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import rxstream
from rxstream import PipelineItem, PipelineStateError
from rxstream.doc import Snapshot
from rxstream.transport import MemoryTransport


class Scaler:
    """A stateful stage function with ``close()`` and ``reset()``, as models have."""

    def __init__(self, factor: int, log: list[str]) -> None:
        self.factor = factor
        self.log = log
        self.seen = 0

    def __call__(self, x: int) -> int:
        self.seen += 1
        return x * self.factor

    def close(self) -> None:
        self.log.append(f"close x{self.factor}")

    def reset(self) -> None:
        self.log.append(f"reset x{self.factor} after {self.seen}")
        self.seen = 0


def scaler_construct(
    ctx: rxstream.Context, log: list[str], delay: float = 0.0
) -> Callable[[Snapshot], rxstream.Stage]:
    def construct(d: Snapshot) -> rxstream.Stage:
        log.append(f"build x{d.model.factor.value}")
        time.sleep(delay)
        return ctx.pipe(Scaler(d["model"]["factor"], log))

    return construct


def test_inline_read_sees_a_write_on_the_next_item(ctx: rxstream.Context) -> None:
    """A stage reading ``doc.desired`` inline uses a write from the very next item on."""
    doc = ctx.doc("control", defaults={"offset": 0})

    def frames() -> Iterator[int]:
        for i in range(5):
            if i == 3:
                doc.set(offset=100)
            yield i

    pipeline = ctx.source(frames) | ctx.pipe(lambda x: x + doc.desired.offset.value)
    assert pipeline.drive(frames=5) == [0, 1, 2, 103, 104]


def test_bind_builds_once_and_ignores_unrelated_writes(ctx: rxstream.Context) -> None:
    """With its deps unchanged, construct runs once, however many other writes happen."""
    doc = ctx.doc("control", defaults={"model": {"factor": 2}, "prompt": "a"})
    log: list[str] = []

    def frames() -> Iterator[int]:
        for i in range(4):
            doc.set(prompt=f"p{i}")
            doc.set(model={"factor": 2})  # same value: no rebuild
            yield i

    bound = doc.bind(scaler_construct(ctx, log), [doc.desired.model.factor])
    pipeline = ctx.source(frames) | bound
    assert pipeline.drive(frames=4) == [0, 2, 4, 6]
    assert log == ["build x2"]
    pipeline.reset()
    assert log == ["build x2", "close x2"]  # the stage in use is closed when the session ends


def test_bind_rebuilds_before_the_next_item_under_drive(ctx: rxstream.Context) -> None:
    """A dep change rebuilds synchronously: the next item uses the new stage, marked cutover."""
    doc = ctx.doc("control", defaults={"model": {"factor": 2}})
    log: list[str] = []

    def frames() -> Iterator[int]:
        for i in range(5):
            if i == 2:
                doc.set(model={"factor": 10})
            yield i

    bound = doc.bind(scaler_construct(ctx, log), [doc.desired.model.factor], name="vae")
    pipeline = ctx.source(frames) | bound
    out = pipeline.drive(frames=5, items=True)
    assert [item.payload for item in out] == [0, 2, 20, 30, 40]
    assert [item.metadata.cutover for item in out] == [False, False, True, False, False]
    pipeline.stop()  # stop() ends a driven session too
    assert log == ["build x2", "build x10", "close x2", "close x10"]
    assert [hop for hop, _ in out[0].metadata.timeline][-2:] == ["vae.in", "vae.out"]


def test_failing_construct_keeps_the_old_stage_and_reports(ctx: rxstream.Context) -> None:
    """A construct that raises on rebuild leaves the old stage serving and lands in doc.errors."""
    doc = ctx.doc("control", defaults={"model": {"factor": 2}})
    log: list[str] = []
    good = scaler_construct(ctx, log)

    def construct(d: Snapshot) -> rxstream.Stage:
        if d.model.factor.value == 0:
            raise ValueError("no model with factor 0")
        return good(d)

    def frames() -> Iterator[int]:
        for i in range(3):
            if i == 1:
                doc.set(model={"factor": 0})
            yield i

    bound = doc.bind(construct, [doc.desired.model.factor], name="vae")
    assert (ctx.source(frames) | bound).drive(frames=3) == [0, 2, 4]
    (failure,) = doc.errors
    assert (failure.stage, failure.version, failure.error) == (
        "vae",
        1,
        "ValueError: no model with factor 0",
    )


@pytest.mark.slow
def test_threaded_swap_under_load_has_no_gap(ctx: rxstream.Context) -> None:
    """A 200 ms construct swaps with no hole: pace never underflows, one cutover per swap."""
    doc = ctx.doc("control", defaults={"model": {"factor": 1}})
    log: list[str] = []
    bound = doc.bind(scaler_construct(ctx, log, delay=0.2), [doc.desired.model.factor])
    pipeline = ctx.source(itertools.count) | bound | ctx.pace(fps=24) | ctx.stream("video")
    transport = ctx.transport
    assert isinstance(transport, MemoryTransport)
    pipeline.start()
    try:
        _wait_for(lambda: transport.counts.get("video", 0) >= 6)
        doc.set(model={"factor": 1000})
        _wait_for(lambda: any(i.payload >= 1000 for i in transport.items("video")[-3:]))
        swapped = transport.counts["video"]
        _wait_for(lambda: transport.counts["video"] >= swapped + 3)
    finally:
        pipeline.stop()
    items = transport.items("video")
    assert [i.metadata.pts for i in items] == list(range(len(items)))
    assert not any(i.metadata.idle for i in items), "pace repeated a frame: the swap stalled"
    assert sum(i.metadata.cutover for i in items) == 1
    first_new = next(n for n, i in enumerate(items) if i.payload >= 1000)
    assert items[first_new].metadata.cutover
    assert all(i.payload < 1000 for i in items[:first_new])
    assert log[:3] == ["build x1", "build x1000", "close x1"]


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def test_steer_cuts_over_and_drops_stale_items_on_a_slow_pipeline(ctx: rxstream.Context) -> None:
    """After a steer no old-generation item reaches the sink once a new one has; all accounted."""

    def work(x: int) -> int:
        time.sleep(0.003)
        return x

    pipeline = (
        ctx.source(itertools.count, name="source")
        | ctx.pipe(work, name="a")
        | ctx.pipe(work, name="b")
        | ctx.pipe(work, name="c")
        | ctx.stream("out")
    )
    transport = ctx.transport
    assert isinstance(transport, MemoryTransport)
    pipeline.start()
    try:
        _wait_for(lambda: transport.counts.get("out", 0) >= 10)
        pipeline.update(prompt="a dog")
        _wait_for(
            lambda: sum(i.metadata.prompt_generation == 1 for i in transport.items("out")) >= 10
        )
    finally:
        pipeline.stop()
    items = transport.items("out")
    generations = [i.metadata.prompt_generation for i in items]
    first_new = generations.index(1)
    assert set(generations[first_new:]) == {1}
    assert generations == sorted(generations)
    assert [i.metadata.cutover for i in items].count(True) == 1
    assert items[first_new].metadata.cutover
    stats = pipeline.statistics()
    stale = sum(s.dropped.get("stale", 0) for s in stats.values())
    assert stale > 0
    dropped = sum(s.dropped_total for s in stats.values())
    assert stats["source"].items_out == len(items) + dropped


def test_flush_resets_stateful_stages_on_first_sight(ctx: rxstream.Context) -> None:
    """pipeline.flush() makes a stage with reset() reset once, at the first flushed item."""
    log: list[str] = []
    scaler = Scaler(1, log)
    pipeline_box: list[rxstream.Pipeline] = []

    def frames() -> Iterator[int]:
        for i in range(6):
            if i == 4:
                pipeline_box[0].flush()
            yield i

    pipeline = ctx.source(frames) | ctx.pipe(scaler)
    pipeline_box.append(pipeline)
    out = pipeline.drive(frames=6, items=True)
    assert [i.metadata.flush_generation for i in out] == [0, 0, 0, 0, 1, 1]
    assert log == ["reset x1 after 4"]


def test_bind_resets_its_current_inner_stage_on_flush(ctx: rxstream.Context) -> None:
    """A flush reaches the function of the stage a bind currently serves."""
    doc = ctx.doc("control", defaults={"model": {"factor": 3}})
    log: list[str] = []

    def frames() -> Iterator[int]:
        for i in range(3):
            if i == 2:
                doc.flush()
            yield i

    bound = doc.bind(scaler_construct(ctx, log), [doc.desired.model.factor])
    pipeline = ctx.source(frames) | bound
    assert pipeline.drive(frames=3) == [0, 3, 6]
    pipeline.reset()
    assert log == ["build x3", "reset x3 after 2", "close x3"]


Op = tuple[str, int]


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["item", "set", "steer", "steer_keep", "flush"]), st.integers(0, 9)
        ),
        max_size=40,
    )
)
def test_generations_never_go_backwards_at_the_sink(ops: list[Op]) -> None:
    """For any interleaving of writes, steers and flushes, the sink's generations only grow."""
    ctx = rxstream.Context()
    doc = ctx.doc("control", defaults={"v": 0})
    produced = [0]

    def frames() -> Iterator[int]:
        for op, value in ops:
            if op == "set":
                doc.set(v=value)
            elif op == "steer":
                doc.steer(v=value)
            elif op == "steer_keep":
                doc.set(v=value)
                ctx.generations.steer(drop_stale=False)
            elif op == "flush":
                doc.flush()
            else:
                produced[0] += 1
                yield value

    window = ctx.window(count=2)
    pipeline = ctx.source(frames) | ctx.pipe(lambda x: x) | window | ctx.unbatch()
    if not any(op == "item" for op, _ in ops):  # a source that ends empty: nothing to drive
        with pytest.raises(PipelineStateError, match=r"sources have ended \('frames'\)"):
            pipeline.drive(frames=1)
        return
    # one pull more than there are ops ends the source, which flushes the last window
    out: list[PipelineItem] = pipeline.drive(frames=len(ops) + 1, items=True)
    prompts = [i.metadata.prompt_generation for i in out]
    flushes = [i.metadata.flush_generation for i in out]
    assert prompts == sorted(prompts)
    assert flushes == sorted(flushes)
    stats = pipeline.statistics()
    stale = sum(s.dropped.get("stale", 0) for s in stats.values())
    assert stats["frames"].items_out == produced[0]
    assert stale <= produced[0]
