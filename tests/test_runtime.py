"""The threaded runtime: order, backpressure, drop policies and their accounting, statistics."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator

import rxstream
from rxstream.runtime._run import DoneEvent
from rxstream.transport import MemoryTransport


def identity(x: int) -> int:
    return x


def slow(seconds: float) -> Callable[[int], int]:
    def work(x: int) -> int:
        time.sleep(seconds)
        return x

    return work


def test_four_stages_deliver_every_item_in_order_under_block(ctx: rxstream.Context) -> None:
    """A 4-stage threaded pipeline delivers all items, in order, dropping none."""
    n = 2000
    pipeline = (
        ctx.source(range(n))
        | ctx.pipe(identity, name="a")
        | ctx.pipe(identity, name="b")
        | ctx.pipe(identity, name="c")
        | ctx.stream("out")
    )
    pipeline.start()
    assert pipeline.wait(timeout=30)
    assert isinstance(ctx.transport, MemoryTransport)
    assert ctx.transport.payloads("out") == list(range(n))
    stats = pipeline.statistics()
    assert all(s.dropped_total == 0 for s in stats.values())
    assert [stats[k].items_out for k in ("source", "a", "b", "c", "out")] == [n] * 5


def test_every_stage_runs_on_its_own_thread(ctx: rxstream.Context) -> None:
    """Each stage's function runs on one thread of its own, none on the caller's."""
    seen: dict[str, set[str]] = {"a": set(), "b": set()}

    def record(name: str) -> Callable[[int], int]:
        def fn(x: int) -> int:
            seen[name].add(threading.current_thread().name)
            return x

        return fn

    pipeline = (
        ctx.source(range(50))
        | ctx.pipe(record("a"), name="a")
        | ctx.pipe(record("b"), name="b")
        | ctx.stream("out")
    )
    pipeline.start()
    assert pipeline.wait(timeout=30)
    assert seen == {"a": {"rxstream:a"}, "b": {"rxstream:b"}}


def test_block_paces_a_generator_source_by_its_consumers(ctx: rxstream.Context) -> None:
    """Under ``block`` the source is never more than the inboxes' worth ahead of the sink."""
    pulled = itertools.count(1)
    pulls = [0]
    lead: list[int] = []

    def frames() -> Iterator[int]:
        for i in range(60):
            pulls[0] = next(pulled)
            yield i

    def sink(x: int) -> int:
        lead.append(pulls[0] - (x + 1))
        time.sleep(0.002)
        return x

    pipeline = ctx.source(frames) | ctx.pipe(identity, name="a") | ctx.pipe(sink, name="slow")
    pipeline.start()
    assert pipeline.wait(timeout=30)
    # a: inbox 2 + 1 working + 1 blocked handing on; slow: inbox 2; source: 1 blocked in put.
    assert max(lead) <= 2 + 1 + 1 + 2 + 1
    assert pulls[0] == 60


def test_latest_keeps_fresh_items_and_accounts_for_every_drop(ctx: rxstream.Context) -> None:
    """Under ``latest`` a slow stage sees fresh items; produced == delivered + dropped."""
    n = 300
    pipeline = (
        ctx.source(range(n))
        | ctx.pipe(slow(0.002), name="slow", policy="latest", capacity=2)
        | ctx.stream("out")
    )
    pipeline.start()
    assert pipeline.wait(timeout=30)
    assert isinstance(ctx.transport, MemoryTransport)
    delivered = ctx.transport.payloads("out")
    stats = pipeline.statistics()
    dropped = stats["slow"].dropped.get("latest", 0)
    assert dropped > 0
    assert stats["source"].items_out == n == len(delivered) + dropped
    assert delivered == sorted(delivered)
    assert delivered[-1] == n - 1  # the newest item always survives `latest`


def test_drop_new_keeps_the_first_items_and_accounts_for_every_drop(
    ctx: rxstream.Context,
) -> None:
    """Under ``drop_new`` arrivals at a full inbox are dropped and counted."""
    n = 300
    pipeline = (
        ctx.source(range(n))
        | ctx.pipe(slow(0.002), name="slow", policy="drop_new", capacity=2)
        | ctx.stream("out")
    )
    pipeline.start()
    assert pipeline.wait(timeout=30)
    assert isinstance(ctx.transport, MemoryTransport)
    delivered = ctx.transport.payloads("out")
    dropped = pipeline.statistics()["slow"].dropped.get("drop_new", 0)
    assert dropped > 0
    assert n == len(delivered) + dropped
    assert delivered[:2] == [0, 1]


def test_statistics_split_waiting_from_working(ctx: rxstream.Context) -> None:
    """A stage that sleeps in its function shows work time; one starved of input shows wait."""
    pipeline = (
        ctx.source(range(20))
        | ctx.pipe(slow(0.005), name="busy")
        | ctx.pipe(identity, name="starved")
        | ctx.stream("out")
    )
    pipeline.start()
    assert pipeline.wait(timeout=30)
    stats = pipeline.statistics()
    assert stats["busy"].work_s >= 20 * 0.005
    assert stats["starved"].wait_s > stats["starved"].work_s
    assert stats["source"].blocked_s == 0.0
    assert stats["busy"].blocked_s > 0.0  # the source waited on busy's full inbox
    assert stats["out"].inbox_capacity == 2


def test_every_stage_stamps_in_and_out(ctx: rxstream.Context) -> None:
    """The timeline holds ``<stage>.in``/``.out`` for every hop, in order, times ascending."""
    pipeline = ctx.source([7]) | ctx.pipe(identity, name="a") | ctx.stream("out")
    pipeline.start()
    assert pipeline.wait(timeout=30)
    assert isinstance(ctx.transport, MemoryTransport)
    (item,) = ctx.transport.items("out")
    hops = [hop for hop, _ in item.metadata.timeline]
    assert hops == ["source.in", "source.out", "a.in", "a.out"]
    times = [t for _, t in item.metadata.timeline]
    assert times == sorted(times)


def test_done_calls_each_callback_once_whoever_sets_it() -> None:
    """A run's done, set by anyone (a rank's stop sets it from outside), calls on_done's once."""
    done = DoneEvent()
    calls: list[str] = []
    done.on_done(lambda: calls.append("before"))
    setter = threading.Thread(target=done.set)
    setter.start()
    setter.join()
    done.set()
    done.on_done(lambda: calls.append("after"))
    assert calls == ["before", "after"]
    assert done.wait(0)


def test_a_finished_run_calls_a_late_on_done_at_once(ctx: rxstream.Context) -> None:
    """A run's done is a DoneEvent: a callback given after the run ended is called at once."""
    pipeline = ctx.source(range(3), name="src") | ctx.stream("out")
    pipeline.start()
    assert pipeline.wait(timeout=30)
    run = pipeline._run
    assert run is not None
    assert isinstance(run.done, DoneEvent)
    called = threading.Event()
    run.on_done(called.set)
    assert called.is_set()
