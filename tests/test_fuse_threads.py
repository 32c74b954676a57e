"""``ctx.pipe(..., fuse=True)`` in threaded runs: the stage runs on its upstream's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from reactivex import Observable
from reactivex.subject import Subject

import rxstream
from rxstream import PipelineError, StageBuildError
from rxstream._exceptions import ArgumentTypeError
from rxstream._kernel._stats import format_statistics
from rxstream.item import PipelineItem
from rxstream.topology import FixedSize
from rxstream.transport import MemoryTransport


def inc(x: int) -> int:
    return x + 1


def double(x: int) -> int:
    return 2 * x


def chain(ctx: rxstream.Context, fuse: tuple[bool, ...], n: int = 300) -> rxstream.Pipeline:
    """``source | p1 | … | pk | stream("out")``, pipe ``i`` fused when ``fuse[i]``."""
    pipeline: rxstream.Pipeline | rxstream.Stage = ctx.source(range(n), name="src")
    fns = (inc, double)
    for index, flag in enumerate(fuse):
        pipeline = pipeline | ctx.pipe(fns[index % 2], name=f"p{index + 1}", fuse=flag)
    return pipeline | ctx.stream("out")


def run(pipeline: rxstream.Pipeline, ctx: rxstream.Context) -> list[PipelineItem]:
    pipeline.start()
    assert pipeline.wait(timeout=60)
    assert isinstance(ctx.transport, MemoryTransport)
    return ctx.transport.items("out")


def fresh() -> rxstream.Context:
    return rxstream.Context(transport=MemoryTransport())


def hops(item: PipelineItem) -> list[str]:
    return [hop for hop, _ in item.metadata.timeline]


def counts(pipeline: rxstream.Pipeline) -> dict[str, tuple[int, int, int]]:
    return {
        name: (s.items_in, s.items_out, s.dropped_total)
        for name, s in pipeline.statistics().items()
    }


def test_fused_chain_gives_the_unfused_outputs_stamps_and_counts() -> None:
    """Outputs, order, hop stamps and per-stage counts of a fused chain equal the unfused one's."""
    plain_ctx, fused_ctx = fresh(), fresh()
    plain = chain(plain_ctx, (False, False, False, False))
    fused = chain(fused_ctx, (False, True, True, True))
    plain_items, fused_items = run(plain, plain_ctx), run(fused, fused_ctx)
    assert [i.payload for i in fused_items] == [i.payload for i in plain_items]
    assert [i.payload for i in fused_items] == [4 * x + 6 for x in range(300)]
    assert [hops(i) for i in fused_items] == [hops(i) for i in plain_items]
    assert counts(fused) == counts(plain)
    for item in fused_items:
        stamps = dict(item.metadata.timeline)
        times = [t for _, t in item.metadata.timeline]
        assert times == sorted(times)
        for before, after in (("p1", "p2"), ("p2", "p3"), ("p3", "p4")):
            assert stamps[f"{after}.in"] == stamps[f"{before}.out"]  # no queue between them


def test_an_item_fed_back_into_a_fused_chain_by_a_member_keeps_both_items_stamps() -> None:
    """A member whose call sends another item through the same chain (a user's feedback loop
    through a subject): each item's stamps stay its own, in order, an inner item set by a
    member included (a shared row of stamps once gave the outer item the inner's times)."""
    subject: Subject[int] = Subject()

    def merged(upstream: Observable[Any]) -> Observable[Any]:
        def subscribe(observer: Any, scheduler: Any = None) -> Any:
            subject.subscribe(observer.on_next)
            return upstream.subscribe(observer.on_next, observer.on_error, observer.on_completed)

        return Observable(subscribe)

    def feeding(x: int) -> Any:
        if x == 2:
            subject.on_next(100)  # the inner item runs through a, b, c before this call returns
        if x == 101:
            return PipelineItem(x, rxstream.PipelineMetadata(pts=100))
        return x

    ctx = fresh()
    source = [
        PipelineItem(i, rxstream.PipelineMetadata(pts=i, input_seq=i + 1, input_at_ms=1))
        for i in range(3)
    ]
    pipeline = (
        ctx.source(source, name="src")
        | ctx.rx(merged, name="m")
        | ctx.pipe(inc, name="a", fuse=True)
        | ctx.pipe(feeding, name="b", fuse=True)
        | ctx.pipe(inc, name="c", fuse=True)
    )
    items = run(pipeline | ctx.stream("out"), ctx)  # the sink folds each input's record
    assert [i.payload for i in items] == [2, 102, 3, 4]
    for item in items:
        times = [t for _, t in item.metadata.timeline]
        assert all(isinstance(t, float) for t in times)
        assert times == sorted(times)
    outer = items[2].metadata.timeline
    assert [hop for hop, _ in outer][-6:] == ["a.in", "a.out", "b.in", "b.out", "c.in", "c.out"]
    inner = dict(items[1].metadata.timeline)
    assert dict(outer)["b.in"] < inner["b.out"] < dict(outer)["b.out"]  # inside the outer's call


@pytest.mark.parametrize("at", [0, 1, 3])
def test_a_fused_member_that_returns_an_item_keeps_its_stamps_as_unfused(at: int) -> None:
    """A pipe returning a PipelineItem mid-chain: its metadata, then its and later stamps."""

    def relabel(x: int) -> Any:
        timeline = (("origin", 1.0),)
        return PipelineItem(x, rxstream.PipelineMetadata(pts=7 * x, timeline=timeline))

    def build(ctx: rxstream.Context, fuse: bool) -> rxstream.Pipeline:
        pipeline: rxstream.Pipeline | rxstream.Stage = ctx.source(range(50), name="src")
        for index in range(4):
            fn = relabel if index == at else inc
            pipeline = pipeline | ctx.pipe(fn, name=f"p{index + 1}", fuse=fuse and index > 0)
        return pipeline | ctx.stream("out")

    plain_ctx, fused_ctx = fresh(), fresh()
    plain_items = run(build(plain_ctx, False), plain_ctx)
    fused_items = run(build(fused_ctx, True), fused_ctx)
    expected = ["origin"] + [f"p{i + 1}.{end}" for i in range(at, 4) for end in ("in", "out")]
    assert [hops(i) for i in fused_items] == [expected] * 50
    assert [hops(i) for i in plain_items] == [expected] * 50
    assert [(i.payload, i.metadata.pts) for i in fused_items] == [
        (i.payload, i.metadata.pts) for i in plain_items
    ]


def test_fused_stages_run_on_their_upstreams_thread(ctx: rxstream.Context) -> None:
    """A fused pipe runs on its upstream's thread: a source's pump or a pipe's stage thread."""
    seen: dict[str, set[str]] = {}

    def record(name: str) -> Callable[[int], int]:
        def fn(x: int) -> int:
            seen.setdefault(name, set()).add(threading.current_thread().name)
            return x

        return fn

    pipeline = (
        ctx.source(range(50), name="src")
        | ctx.pipe(record("a"), name="a", fuse=True)
        | ctx.pipe(record("b"), name="b")
        | ctx.pipe(record("c"), name="c", fuse=True)
        | ctx.pipe(record("d"), name="d", fuse=True)
        | ctx.stream("out")
    )
    assert [i.payload for i in run(pipeline, ctx)] == list(range(50))
    assert seen == {
        "a": {"rxstream:src"},
        "b": {"rxstream:b"},
        "c": {"rxstream:b"},
        "d": {"rxstream:b"},
    }


def test_statistics_and_their_table_show_fusion(ctx: rxstream.Context) -> None:
    """Each stage keeps its row; a fused one names the stage whose thread runs it, no inbox."""
    pipeline = chain(ctx, (False, True, True))
    run(pipeline, ctx)
    stats = pipeline.statistics()
    assert {name: s.fused_into for name, s in stats.items()} == {
        "src": "",
        "p1": "",
        "p2": "p1",
        "p3": "p1",
        "out": "",
    }
    assert (stats["p2"].inbox_capacity, stats["p1"].inbox_capacity) == (0, 2)
    table = format_statistics(stats).splitlines()
    assert table[0].split()[-1] == "thread"
    assert [row.split()[0] for row in table[1:]] == ["src", "p1", "p2", "p3", "out"]
    assert table[3].endswith("fused into p1")
    assert table[2].endswith("own")


def test_drive_gives_the_same_outputs_fused_or_not() -> None:
    """Under drive() a fused pipe behaves as the drive's own fused chains: the same outputs."""
    plain, fused = fresh(), fresh()
    assert chain(fused, (True, True, False, True)).drive(frames=20) == chain(
        plain, (False, False, False, False)
    ).drive(frames=20)


@pytest.mark.parametrize("where", ["source", "pipe"])
def test_skip_in_a_fused_stage_drops_the_item_and_goes_on(
    ctx: rxstream.Context, where: str
) -> None:
    """on_error="skip" in a fused stage: the failing item is dropped (error), the rest go on."""

    def fails_on_5(x: int) -> int:
        if x == 5:
            raise RuntimeError("five")
        return x

    pipeline = (
        ctx.source(range(20), name="src")
        | ctx.pipe(lambda x: x, name="a", fuse=where == "source")
        | ctx.pipe(fails_on_5, name="f", fuse=True, on_error="skip")
        | ctx.pipe(lambda x: x, name="g", fuse=True)
        | ctx.stream("out")
    )
    assert [i.payload for i in run(pipeline, ctx)] == [x for x in range(20) if x != 5]
    stats = pipeline.statistics()
    assert (stats["f"].items_in, stats["f"].items_out, dict(stats["f"].dropped)) == (
        20,
        19,
        {"error": 1},
    )
    assert (stats["g"].items_in, stats["g"].items_out) == (19, 19)


@pytest.mark.parametrize("where", ["source", "pipe"])
def test_raise_in_a_fused_stage_ends_the_run_naming_it(ctx: rxstream.Context, where: str) -> None:
    """on_error="raise" in a fused stage ends the run with a PipelineError naming that stage."""

    def fails_on_5(x: int) -> int:
        if x == 5:
            raise RuntimeError("five")
        return x

    pipeline = (
        ctx.source(range(1000), name="src")
        | ctx.pipe(lambda x: x, name="a", fuse=where == "source")
        | ctx.pipe(fails_on_5, name="f", fuse=True)
        | ctx.stream("out")
    )
    pipeline.start()
    with pytest.raises(PipelineError, match=r"^stage 'f' failed") as raised:
        pipeline.wait(timeout=60)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert pipeline.statistics()["f"].dropped == {"error": 1}


def test_stop_mid_stream_keeps_the_books(ctx: rxstream.Context) -> None:
    """Stopping a run whose fused stages are busy leaves every item delivered or dropped."""
    running = threading.Event()

    def endless() -> Iterator[int]:
        n = 0
        while True:
            yield n
            n += 1

    def mark(x: int) -> int:
        if x == 200:
            running.set()
        return x

    pipeline = (
        ctx.source(endless(), name="src")
        | ctx.pipe(mark, name="a", fuse=True)
        | ctx.pipe(inc, name="b")
        | ctx.pipe(inc, name="c", fuse=True)
        | ctx.stream("out")
    )
    pipeline.start()
    assert running.wait(timeout=60)
    pipeline.stop()
    stats = pipeline.statistics()
    assert stats["a"].items_in >= 201
    assert stats["c"].items_in == stats["c"].items_out  # fused: no inbox to drop from
    # the books (tests/conftest.py) check every stage once the threads have ended


def test_a_steer_in_a_fused_chain_drops_the_stale_item_at_the_next_fused_stage(
    ctx: rxstream.Context,
) -> None:
    """A function steering mid-chain: its item is stale at the next fused stage, dropped there."""
    pipeline: rxstream.Pipeline

    def steer_on_1(x: int) -> int:
        if x == 1:
            pipeline.update(prompt="new")
        return x

    ctx.doc("control", defaults={"prompt": "old"})
    pipeline = (
        ctx.source(range(50), name="src")
        | ctx.pipe(lambda x: x, name="a")
        | ctx.pipe(steer_on_1, name="s", fuse=True)
        | ctx.pipe(lambda x: x, name="t", fuse=True)
        | ctx.stream("out")
    )
    items = run(pipeline, ctx)
    payloads = [i.payload for i in items]
    assert 1 not in payloads
    assert payloads == sorted(payloads)
    stats = pipeline.statistics()
    assert stats["s"].items_out >= 2  # 1 left s before its steer made it stale
    assert stats["t"].dropped["stale"] >= 1  # 1, and any other old one in flight
    # every old item after 1 was in flight at the steer: the first one out after it is new
    assert next(i for i in items if i.payload > 1).metadata.cutover
    dropped = sum(s.dropped.get("stale", 0) for s in stats.values())
    assert len(payloads) + dropped == 50


def test_a_flush_resets_a_fused_stage_on_the_first_newer_item(ctx: rxstream.Context) -> None:
    """A fused stage with reset() is reset by the first item of a newer flush generation."""
    pipeline: rxstream.Pipeline
    resets: list[int] = []
    seen: list[int] = []

    class Counter:
        def __call__(self, x: int) -> int:
            seen.append(x)
            return x

        def reset(self) -> None:
            resets.append(seen[-1])

    def flush_on_3(x: int) -> int:
        if x == 3:
            pipeline.flush()
        return x

    pipeline = (
        ctx.source(range(10), name="src")
        | ctx.pipe(flush_on_3, name="a")
        | ctx.pipe(Counter(), name="c", fuse=True)
        | ctx.stream("out")
    )
    assert [i.payload for i in run(pipeline, ctx)] == list(range(10))
    assert len(resets) == 1
    assert resets[0] >= 3  # on the first item pulled after the flush


def test_a_fused_items_pipe_gets_the_item_on_its_upstreams_thread(ctx: rxstream.Context) -> None:
    """items=True fuses too: the function gets the item itself, on its upstream's thread."""
    threads: set[str] = set()

    def pts_of(item: PipelineItem) -> Any:
        threads.add(threading.current_thread().name)
        return item.metadata.pts

    pipeline = (
        ctx.source(range(10), name="src")
        | ctx.pipe(inc, name="a")
        | ctx.pipe(pts_of, name="m", items=True, fuse=True)
        | ctx.pipe(inc, name="n", fuse=True)
        | ctx.stream("out")
    )
    items = run(pipeline, ctx)
    assert [i.payload for i in items] == [i.metadata.pts + 1 for i in items]
    assert threads == {"rxstream:a"}
    assert pipeline.statistics()["n"].fused_into == "a"


def test_a_chain_fused_after_a_ring_runs_on_the_reading_stages_thread(
    ctx: rxstream.Context,
) -> None:
    """Fused after a stage whose input crosses ranks: on that stage's thread, hops intact."""
    threads: set[str] = set()

    def record(x: int) -> int:
        threads.add(threading.current_thread().name)
        return x + 1

    pipeline = (
        ctx.source(range(40), name="src")
        | ctx.pipe(double, name="a")
        | ctx.pipe(inc, name="b", rank=1)
        | ctx.pipe(record, name="c", fuse=True)
        | ctx.stream("out")
    )
    items = run(pipeline, ctx)
    assert [i.payload for i in items] == [2 * x + 2 for x in range(40)]
    assert hops(items[0]) == [
        "src.in", "src.out", "a.in", "a.out", "a>b.in", "a>b.out", "b.in", "b.out",
        "c.in", "c.out",
    ]  # fmt: skip
    assert threads == {"rxstream:b"}
    assert pipeline.statistics()["c"].fused_into == "b"
    pipeline.stop()


async def slow_double(x: int) -> int:
    return 2 * x


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": 8}, r"stage 'inc': capacity cannot be given with fuse=True .*capacity=8"),
        (
            {"policy": "latest"},
            r"stage 'inc': policy cannot be given with fuse=True .*policy='latest'",
        ),
        ({"chunks": lambda: FixedSize(3)}, r"stage 'inc': chunks cannot be given with fuse=True"),
    ],
)
def test_an_inbox_or_chunks_with_fuse_is_refused(
    ctx: rxstream.Context, kwargs: dict[str, Any], message: str
) -> None:
    """capacity, policy and chunks have no meaning without an inbox: refused, naming each."""
    with pytest.raises(StageBuildError, match=message):
        ctx.pipe(inc, fuse=True, **kwargs)


def test_an_async_def_with_fuse_is_refused(ctx: rxstream.Context) -> None:
    """An async def cannot run on its upstream's thread: refused, naming the stage and fn."""
    with pytest.raises(StageBuildError, match=r"stage 'slow_double': an async def .*fn=<function"):
        ctx.pipe(slow_double, fuse=True)


def test_fuse_that_is_not_a_bool_is_refused(ctx: rxstream.Context) -> None:
    """fuse takes True or False, nothing truthy: the error names the field and the value."""
    with pytest.raises(ArgumentTypeError, match=r"fuse must be a bool, got 'yes' for stage 'inc'"):
        ctx.pipe(inc, fuse="yes")  # type: ignore[arg-type]


def test_a_fused_fan_in_is_refused(ctx: rxstream.Context) -> None:
    """A fused pipe with two inputs has no one upstream thread: refused when the plan compiles."""
    pipeline = [ctx.source(range(3), name="a"), ctx.source(range(3), name="b")] | ctx.pipe(
        lambda x, y: x + y, name="sum", fuse=True
    )
    with pytest.raises(StageBuildError, match=r"stage 'sum' \(fuse=True\): .*got 2 inputs"):
        pipeline.start()


def test_a_fused_stage_on_another_rank_is_refused(ctx: rxstream.Context) -> None:
    """An upstream on another rank is across a boundary, not a thread: refused, naming both."""
    pipeline = ctx.source(range(3), name="src") | ctx.pipe(inc, name="p", rank=1, fuse=True)
    with pytest.raises(
        StageBuildError, match=r"stage 'p' \(fuse=True\): .*got rank=1 and upstream 'src' on rank 0"
    ):
        pipeline.start()


def test_a_fused_stage_whose_upstream_fans_out_is_refused(ctx: rxstream.Context) -> None:
    """An upstream feeding another stage too would run both in no order: refused."""
    src = ctx.source(range(3), name="src")
    a = src | ctx.pipe(inc, name="a", fuse=True)
    b = src | ctx.pipe(inc, name="b")
    with pytest.raises(
        StageBuildError, match=r"stage 'a' \(fuse=True\): .*upstream 'src' with 2 consumers"
    ):
        ctx.graph(a, b).start()


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.booleans(), min_size=1, max_size=5), st.integers(0, 40))
def test_any_fusion_gives_the_unfused_outputs_and_counts(flags: list[bool], n: int) -> None:
    """Law: fusing any subset of a pipe chain changes no output, order or per-stage count."""
    plain_ctx, fused_ctx = fresh(), fresh()
    plain = chain(plain_ctx, tuple(False for _ in flags), n)
    fused = chain(fused_ctx, tuple(flags), n)
    assert [i.payload for i in run(fused, fused_ctx)] == [i.payload for i in run(plain, plain_ctx)]
    assert counts(fused) == counts(plain)
    fused.stop()
    plain.stop()


def steered_chain(
    fuse: bool, second: Callable[[int], int]
) -> tuple[rxstream.Pipeline, rxstream.Context]:
    """``src | a | f | g | out``, ``a`` steering at 0 (stale at ``f``), the source making 1
    (the cutover) after the steer; ``second`` is ``f``'s function (skip on error)."""
    ctx = fresh()
    ctx.doc("control", defaults={"prompt": "old"})
    steered = threading.Event()
    pipeline: rxstream.Pipeline

    def src() -> Iterator[int]:
        for i in range(10):
            if i == 1:
                assert steered.wait(timeout=30)
            yield i

    def a(x: int) -> int:
        if x == 0:
            pipeline.update(prompt="new")
            steered.set()
        return x

    pipeline = (
        ctx.source(src(), name="src")
        | ctx.pipe(a, name="a")
        | ctx.pipe(second, name="f", fuse=fuse, on_error="skip")
        | ctx.pipe(lambda x: x, name="g", fuse=fuse)
        | ctx.stream("out")
    )
    return pipeline, ctx


def cutovers(pipeline: rxstream.Pipeline) -> dict[str, tuple[int, int, int, int]]:
    return {
        name: (s.items_in, s.items_out, s.dropped_total, s.cutovers)
        for name, s in pipeline.statistics().items()
    }


def test_a_cutover_is_counted_only_by_the_fused_stages_it_reaches() -> None:
    """A fused stage that skips the cutover item: the stage after it never counts the cutover."""

    def fails_on_1(x: int) -> int:
        if x == 1:  # the first item of the new generation
            raise RuntimeError("one")
        return x

    results = {}
    for fuse in (False, True):
        pipeline, ctx = steered_chain(fuse, fails_on_1)
        results[fuse] = ([i.payload for i in run(pipeline, ctx)], cutovers(pipeline))
        pipeline.stop()
    assert results[True] == results[False]
    payloads, stats = results[True]
    assert payloads == list(range(2, 10))  # 0 stale at f, 1 skipped by f
    assert (stats["f"][3], stats["g"][3]) == (1, 0)


def test_a_flush_mid_chain_counts_the_cutover_once_per_fused_stage() -> None:
    """A fused stage flushing while it runs the cutover item: the next counts the cutover once."""
    pipeline: rxstream.Pipeline

    def flush_on_1(x: int) -> int:
        if x == 1:  # the cutover item: the generations change between f and g
            pipeline.flush()
        return x

    results = {}
    for fuse in (False, True):
        pipeline, ctx = steered_chain(fuse, flush_on_1)
        items = run(pipeline, ctx)
        results[fuse] = ([i.payload for i in items if i.metadata.cutover], cutovers(pipeline))
        pipeline.stop()
    assert results[True] == results[False]
    cut, stats = results[True]
    assert cut == [1]
    assert (stats["f"][3], stats["g"][3], stats["out"][3]) == (1, 1, 1)


def test_a_fused_stage_the_newer_flush_never_reaches_is_not_reset() -> None:
    """A flush whose one newer item a fused stage skips: the fused stage after it never resets."""
    resets: list[int] = []
    pipeline: rxstream.Pipeline
    flushed = threading.Event()

    class Counter:
        def __call__(self, x: int) -> int:
            return x

        def reset(self) -> None:
            resets.append(1)

    def src() -> Iterator[int]:
        for i in range(5):
            if i == 4:
                assert flushed.wait(timeout=30)
            yield i

    def a(x: int) -> int:
        if x == 3:
            pipeline.flush()
            flushed.set()
        return x

    def fails_on_4(x: int) -> int:
        if x == 4:  # the one item of the new flush generation
            raise RuntimeError("four")
        return x

    ctx = fresh()
    pipeline = (
        ctx.source(src(), name="src")
        | ctx.pipe(a, name="a")
        | ctx.pipe(fails_on_4, name="f", fuse=True, on_error="skip")
        | ctx.pipe(Counter(), name="g", fuse=True)
        | ctx.stream("out")
    )
    assert [i.payload for i in run(pipeline, ctx)] == [0, 1, 2, 3]
    assert resets == []  # as unfused: g never got an item of the newer flush generation
    pipeline.stop()


class Interrupt(BaseException):
    """Not an Exception: on_error does not apply; the run ends naming the stage."""


@pytest.mark.parametrize("where", ["source", "pipe"])
def test_a_base_exception_in_a_fused_stage_ends_the_run_naming_it(
    ctx: rxstream.Context, where: str
) -> None:
    """A BaseException in a fused stage: a PipelineError naming it, as on its own thread."""

    def interrupts_on_3(x: int) -> int:
        if x == 3:
            raise Interrupt("three")
        return x

    head: rxstream.Pipeline | rxstream.Stage = ctx.source(range(10), name="src")
    if where == "pipe":
        head = head | ctx.pipe(lambda x: x, name="a")
    pipeline = head | ctx.pipe(interrupts_on_3, name="f", fuse=True) | ctx.stream("out")
    pipeline.start()
    with pytest.raises(PipelineError, match=r"^stage 'f' failed: Interrupt: three") as raised:
        pipeline.wait(timeout=60)
    assert isinstance(raised.value.__cause__, Interrupt)


@pytest.mark.parametrize("where", ["source", "pipe"])
def test_a_fused_stage_feeding_a_boundary_charges_the_ring_wait_to_its_threads_owner(
    ctx: rxstream.Context, where: str
) -> None:
    """The writer's wait on a full ring is the stall of the stage whose thread ran it."""

    def slow(x: int) -> int:
        time.sleep(0.002)  # slower than the source: the ring fills and its writer waits
        return x

    head: rxstream.Pipeline | rxstream.Stage = ctx.source(range(60), name="src")
    if where == "pipe":
        head = head | ctx.pipe(inc, name="a")
    pipeline = (
        head
        | ctx.pipe(inc, name="b", fuse=True)
        | ctx.pipe(slow, name="c", rank=1)
        | ctx.stream("out")
    )
    assert len(run(pipeline, ctx)) == 60
    stats = pipeline.statistics()
    owner = "src" if where == "source" else "a"
    assert stats["b"].fused_into == owner
    assert stats["b"].stalled_s == 0.0  # no thread of its own to stall
    assert stats[owner].stalled_s > 0.0
    pipeline.stop()


def test_the_plan_refusals_hold_under_drive(ctx: rxstream.Context) -> None:
    """drive() checks the plan as start() does: a fused stage with two consumers upstream fails."""
    src = ctx.source(range(5), name="src")
    a = src | ctx.pipe(inc, name="a")
    b = a | ctx.pipe(inc, name="b", fuse=True)
    with pytest.raises(
        StageBuildError, match=r"stage 'b' \(fuse=True\): .*upstream 'a' with 2 consumers"
    ):
        ctx.graph(a, b).drive(frames=3)
