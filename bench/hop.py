"""Thread-hop cost of rxstream, side by side with its baselines, in one run.

Every figure is a ratio to a baseline measured in the same process, interleaved repetition by
repetition (see docs/performance.md, "How to measure"): absolute times on the shared 2-core
machines drift 2-3x from one hour to the next, ratios much less.

The chain, the same on every side: a source thread and four stage threads (``src``, ``p1`` ..
``p4``), each stamping ``<name>.in`` / ``<name>.out`` with ``time.monotonic()`` into a
``timeline`` tuple that travels with the payload, exactly as rxstream stamps its
``PipelineMetadata.timeline``.

- hand-written: ``(payload, timeline)`` tuples through ``queue.Queue(maxsize=capacity)``.
- rxstream: ``ctx.source(gen, name="src") | ctx.pipe(noop, name="p1", capacity=c) | ... p4``.
  The end is the fourth pipe itself (no ``ctx.stream``): a sink would add a fifth stage thread
  and one more hop that the hand-written chain does not have. On both sides the last stage's
  function is what signals the main thread (latency: puts the payload on a result queue;
  throughput: counts down and sets an Event), between that stage's two stamps.
- rxstream, the opt-in fused shape: the same chain with ``p2``..``p4`` built with
  ``fuse=True`` (docs/concepts.md, "Fusing light stages"): they run on ``p1``'s thread, which
  keeps its inbox after the source; two threads instead of five. Its rows are labelled as
  such: the hand-written chain they are compared with still has a thread per stage.
- reactivex: ``from_iterable`` on the main thread, then four ``observe_on(EventLoopScheduler())``
  hops, each followed by an ``ops.map`` that does the same stamping (unbounded queues).
- the floors, no engine (bench/_floors.py; throughput and CPU per item, information): the
  same five threads, each calling ``noop`` (``p4``: the countdown), each hand-off two C
  ``queue.SimpleQueue``s (the items, and ``capacity`` free-slot tokens, a token given back as
  the consumer takes the item): the cheapest bounded thread-a-stage chain Python can make.
  ``floor, C queues`` carries no stamps; ``floor, C queues + stamps`` exactly the hand-written
  chain's. Under the table, one line a capacity says, from the run's figures, whether the
  floor itself reaches issue 18's ≥ 1.5x (a floor that misses it says the target is at or
  past what the hand-offs alone allow here, not that no chain could read higher in another
  slot of a loaded run). ``floor, C queues + rxstream's items`` carries the engine's items on
  the same threads, each stage's per-item work inline (the base metadata read, the routine
  admission, the counters, two stamps, the call, the new item; bench/_floors.py): the floor
  of any engine that carries these items on a thread a stage, whatever its layers; one more
  line a capacity says whether it reaches the target. Two more take the representation
  apart: ``… made inline`` (no function of ``rxstream.item`` called, the slots written with
  their setters, as the frozen class allows) and ``… in plain slots, not frozen`` (a
  hypothetical item that could be written like any object: what immutability costs).

Measures:
1. latency, one item in flight: the main thread puts one payload on the source's feed queue
   and waits for it on the result queue. 6 thread hops (main→src→p1→p2→p3→p4→main);
   reported per hop (end-to-end / 6), median and p99 of each repetition.
2. throughput with a backlog: ``--items`` payloads pulled as fast as the chain takes them,
   from the moment a gate opens until the last stage has seen the last one; at inbox/queue
   capacity 2 (rxstream's default) and 256.
   Also the process's CPU time per item over the same span (every thread's): a loaded
   machine inflates it much less than the wall-clock figures.
3. the same throughput through reactivex ``observe_on`` (unbounded).
4. ``pipeline.drive(frames=N)`` (4 pipes, no threads) vs a plain reactivex
   ``from_iterable(range(N)).pipe(ops.map(noop) x4)``: ns per item per stage.

Placement (``--placement``, issue 18): by default (``os``) the threads run where the OS puts
them, and on 2 vCPUs that is a draw, run by run (docs/history/performance-log.md, the fused
shape at capacity 2): a 2-thread chain split across the vCPUs pays a cross-CPU wake-up a
hand-off. ``one`` runs
measures 1-3 with every thread of the process on one CPU (``os.sched_setaffinity`` on every
thread before each measure, threads started meanwhile inherit it, each mask restored after),
all rows labelled ``[one CPU]``, no verdicts (info). ``both`` runs the two sets interleaved,
the one-CPU set in every other repetition (about half the repetitions: the run stays within
~1.6x the default's time), each row labelled with its placement, the verdicts the ``[OS]``
rows'. Measure 4 (one thread, no hand-off) runs unpinned either way. Where fewer than 2 CPUs
are allowed, or not on Linux, ``one`` and ``both`` say why and run ``os``.

Run ``python bench/hop.py`` (about a minute) or ``python bench/hop.py --quick``
(a few seconds, a smoke run whose ratios are indicative only).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import reactivex
from reactivex import operators as ops
from reactivex.scheduler import EventLoopScheduler

# `python bench/hop.py` from a checkout where the package is not installed: the repo root
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _floors import (
    FloorChain,
    FloorItemsChain,
    FloorItemsInlineChain,
    FloorPlainItemsChain,
    FloorStampedChain,
    floor_line,
    items_line,
)
from _report import (
    ONE_CPU,
    OS,
    PLACEMENT_LABELS,
    STOP,
    Threads,
    ignore,
    noop,
    on_cpus,
    p99,
    performance_row,
    placements,
    pulled,
    revision,
    spread,
    verdict,
)

import rxstream

STAGES = ("p1", "p2", "p3", "p4")
LATENCY_HOPS = len(STAGES) + 2  # main→src, src→p1, p1→p2, p2→p3, p3→p4, p4→main
JOIN_S = 10.0

Timeline = tuple[tuple[str, float], ...]
Message = tuple[Any, Timeline]

_monotonic = time.monotonic
_perf = time.perf_counter


# --- the hand-written chain -----------------------------------------------------------------


def _hand_source(
    name: str, pull: Callable[[], Any], outbox: queue.Queue[Any]
) -> Callable[[], None]:
    """A source thread body: take the next value, stamp ``.in``/``.out``, put it on."""
    in_hop, out_hop = f"{name}.in", f"{name}.out"
    put = outbox.put

    def body() -> None:
        values = pulled(pull)
        while True:
            started = _monotonic()
            value = next(values, STOP)
            if value is STOP:
                put(STOP)
                return
            put((value, ((in_hop, started), (out_hop, _monotonic()))))

    return body


def _hand_stage(
    name: str,
    fn: Callable[[Any], Any],
    inbox: queue.Queue[Any],
    outbox: queue.Queue[Any] | None,
) -> Callable[[], None]:
    """A stage thread body: take, stamp ``.in``, call ``fn``, stamp ``.out``, put on."""
    in_hop, out_hop = f"{name}.in", f"{name}.out"
    get = inbox.get
    put: Callable[[Any], None] = outbox.put if outbox is not None else ignore

    def body() -> None:
        while True:
            message = get()
            if message is STOP:
                put(STOP)
                return
            started = _monotonic()
            payload, timeline = message
            out = fn(payload)
            # the same concatenation as rxstream's per-hop stamp
            put((out, timeline + ((in_hop, started), (out_hop, _monotonic()))))  # noqa: RUF005

    return body


class HandChain(Threads):
    """``src`` and ``p1``..``p4`` as plain threads over ``queue.Queue(maxsize=capacity)``."""

    what = "hand-written chain"
    join_s = JOIN_S

    def __init__(self, pull: Callable[[], Any], last: Callable[[Any], Any], capacity: int):
        queues: list[queue.Queue[Any]] = [queue.Queue(capacity) for _ in STAGES]
        bodies = [_hand_source("src", pull, queues[0])]
        for index, name in enumerate(STAGES):
            fn = last if index == len(STAGES) - 1 else noop
            outbox = queues[index + 1] if index + 1 < len(queues) else None
            bodies.append(_hand_stage(name, fn, queues[index], outbox))
        self._threads = [threading.Thread(target=body, daemon=True) for body in bodies]


# --- the rxstream chain ---------------------------------------------------------------------


def rxs_pipeline(
    source: object, last: Callable[[Any], Any], capacity: int, *, fuse: bool = False
) -> rxstream.Pipeline:
    """``ctx.source(source, name="src") | ctx.pipe(noop, name="p1", capacity=c) | ... p4``.

    ``p4`` calls ``last`` instead of ``noop``. ``fuse``: ``p2``..``p4`` are built with
    ``fuse=True`` and run on ``p1``'s thread (``p1`` keeps its inbox after the source).
    """
    ctx = rxstream.Context()
    fns = [noop] * (len(STAGES) - 1) + [last]
    first, *rest = [
        ctx.pipe(fn, name=name, fuse=True)
        if fuse and index
        else ctx.pipe(fn, name=name, capacity=capacity)
        for index, (name, fn) in enumerate(zip(STAGES, fns, strict=True))
    ]
    pipeline = ctx.source(source, name="src") | first
    for stage in rest:
        pipeline = pipeline | stage
    return pipeline


class RxsChain:
    """The rxstream chain over ``pull``, run threaded (``start()``/``wait()``)."""

    fuse = False

    def __init__(self, pull: Callable[[], Any], last: Callable[[Any], Any], capacity: int):
        self.pipeline = rxs_pipeline(lambda: pulled(pull), last, capacity, fuse=self.fuse)

    def start(self) -> None:
        self.pipeline.start()

    def wait(self) -> None:
        if not self.pipeline.wait(JOIN_S):
            self.pipeline.stop()
            raise RuntimeError("rxstream chain did not finish")


class FusedChain(RxsChain):
    """The opt-in fused shape: ``p2``..``p4`` with ``fuse=True``, on ``p1``'s thread (two
    threads: ``src`` and ``p1``; the hand-written chain it is compared with keeps five)."""

    fuse = True


Chain = Callable[[Callable[[], Any], Callable[[Any], Any], int], HandChain | RxsChain | FloorChain]


# --- 1. latency, one item in flight ---------------------------------------------------------


def latency(chain: Chain, trips: int, warmup: int = 20) -> list[float]:
    """Seconds per hop of each of ``trips`` round trips (after ``warmup`` unmeasured ones)."""
    feed: queue.Queue[Any] = queue.Queue()
    result: queue.Queue[Any] = queue.Queue()

    def last(payload: Any) -> Any:
        result.put(payload)
        return payload

    run = chain(feed.get, last, 2)
    run.start()
    put, get = feed.put, result.get
    samples = []
    try:
        for index in range(warmup + trips):
            started = _perf()
            put(index)
            got = get(timeout=JOIN_S)
            elapsed = _perf() - started
            if got != index:
                raise RuntimeError(f"round trip {index} came back as {got}")
            if index >= warmup:
                samples.append(elapsed / LATENCY_HOPS)
    finally:
        put(STOP)
        run.wait()
    return samples


# --- 2./3. throughput with a backlog --------------------------------------------------------


def _countdown(items: int, finished: threading.Event) -> Callable[[Any], Any]:
    left = [items]

    def last(payload: Any) -> Any:
        left[0] -= 1
        if not left[0]:
            finished.set()
        return payload

    return last


def throughput(chain: Chain, items: int, capacity: int, *, cpu: list[float] | None = None) -> float:
    """Items per second through the chain, from an open gate to the last item at ``p4``.

    ``cpu``: gets the process's CPU seconds per item over the same span appended (every
    thread's; the figure a loaded machine disturbs least: time spent runnable but not
    running is not in it).
    """
    gate = threading.Event()
    finished = threading.Event()
    values: Iterator[Any] = iter(range(items))

    def pull() -> Any:
        if not gate.is_set():
            gate.wait()
        return next(values, STOP)

    run = chain(pull, _countdown(items, finished), capacity)
    run.start()
    time.sleep(0.02)  # every thread is up and waiting
    started = _perf()
    cpu_started = time.process_time()
    gate.set()
    if not finished.wait(JOIN_S * 6):
        raise RuntimeError("throughput run did not finish")
    elapsed = _perf() - started
    if cpu is not None:
        cpu.append((time.process_time() - cpu_started) / items)
    run.wait()
    return items / elapsed


def _rx_stamp(name: str, fn: Callable[[Any], Any]) -> Callable[[Message], Message]:
    in_hop, out_hop = f"{name}.in", f"{name}.out"

    def stage(message: Message) -> Message:
        started = _monotonic()
        payload, timeline = message
        out = fn(payload)
        return out, timeline + ((in_hop, started), (out_hop, _monotonic()))  # noqa: RUF005

    return stage


def _rx_source_stamp(payload: Any) -> Message:
    started = _monotonic()
    return payload, (("src.in", started), ("src.out", _monotonic()))


def rx_observe_on_throughput(items: int) -> float:
    """Items per second through 4 ``observe_on(EventLoopScheduler())`` hops, same stamping."""
    finished = threading.Event()
    last = _countdown(items, finished)
    schedulers = [EventLoopScheduler() for _ in STAGES]
    steps: list[Any] = [ops.map(_rx_source_stamp)]
    for index, (name, scheduler) in enumerate(zip(STAGES, schedulers, strict=True)):
        fn = last if index == len(STAGES) - 1 else noop
        steps += [ops.observe_on(scheduler), ops.map(_rx_stamp(name, fn))]
    source: reactivex.Observable[Any] = reactivex.from_iterable(range(items))
    stream: reactivex.Observable[Any] = source.pipe(*steps)
    started = _perf()
    subscription = stream.subscribe(ignore)
    if not finished.wait(JOIN_S * 6):
        raise RuntimeError("observe_on run did not finish")
    elapsed = _perf() - started
    subscription.dispose()
    for scheduler in schedulers:
        scheduler.dispose()
    return items / elapsed


# --- 4. drive() vs plain reactivex ------------------------------------------------------------


def drive_s(items: int, stages: int) -> float:
    """Seconds of ``pipeline.drive(frames=items)`` over a source and ``stages`` no-op pipes."""
    ctx = rxstream.Context()
    pipeline: Any = ctx.source(range(items), name="src")
    for index in range(stages):
        pipeline = pipeline | ctx.pipe(noop, name=f"p{index + 1}")
    started = _perf()
    out = pipeline.drive(frames=items)
    elapsed = _perf() - started
    if len(out) != items:
        raise RuntimeError(f"drive returned {len(out)} items, wanted {items}")
    return elapsed


def rx_map_s(items: int, stages: int) -> float:
    """Seconds of ``from_iterable(range(items)).pipe(ops.map(noop) x stages)``."""
    sink: list[Any] = []
    started = _perf()
    reactivex.from_iterable(range(items)).pipe(*[ops.map(noop) for _ in range(stages)]).subscribe(
        sink.append
    )
    elapsed = _perf() - started
    if len(sink) != items:
        raise RuntimeError(f"reactivex returned {len(sink)} items, wanted {items}")
    return elapsed


# --- the table ----------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table: rxstream's figures, the baseline's, paired by repetition.

    ``info``: the target is shown, its check said, but it is not a verdict (the one-CPU rows:
    the issue's verdicts are the ``os`` rows')."""

    measure: str
    unit: str
    value: list[float]
    baseline_name: str
    baseline: list[float]
    target: str
    check: Callable[[float], bool] | None
    info: bool = False


def table(rows: Sequence[Row]) -> str:
    """The markdown table: medians [min-max]; the ratio of each repetition's pair."""
    lines = [
        "| measure | rxstream median [min-max] | baseline | baseline median [min-max] "
        "| ratio median [min-max] | target | result |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        ratios, result = verdict(row.value, row.baseline, row.check)
        target = row.target
        if row.info and row.check is not None:
            target = f"({row.target}: the OS rows' target)"
            result = f"info ({'at the target' if result == 'PASS' else 'below the target'})"
        lines.append(
            f"| {row.measure} ({row.unit}) | {spread(row.value)} "
            f"| {row.baseline_name} | {spread(row.baseline)} "
            f"| {spread(ratios, 2, 'x')} | {target} | {result} |"
        )
    return "\n".join(lines)


def performance_rows(rows: Sequence[Row], command: str) -> str:
    """The rows with a target, as docs/performance.md's current table has them."""
    lines = []
    for row in rows:
        if row.check is None or row.info:
            continue
        ratios, result = verdict(row.value, row.baseline, row.check)
        lines.append(
            performance_row(
                f"{row.measure}, against {row.baseline_name}",
                f"`{command}`",
                row.target,
                f"{spread(ratios, 2, 'x')}: {result}",
            )
        )
    return "\n".join(lines)


FLOOR = "floor, C queues (no engine)"
FLOOR_STAMPED = "floor, C queues + stamps (no engine)"
FLOOR_ITEMS = "floor, C queues + rxstream's items (no engine)"
FLOOR_INLINE = "floor, C queues + rxstream's items made inline (no engine)"
FLOOR_PLAIN = "floor, C queues + items in plain slots, not frozen (no engine, hypothetical)"
THREADED_TARGET = 1.5
"""Issue 18's backlog throughput target, a thread a stage, over the hand-written chain."""
BIG = 256


def _in_process(
    add: Callable[[str, float], None], trips: int, items: int, *, observe_on: bool = True
) -> None:
    """One repetition of the rows whose threads ``--placement`` places: hop latency and
    throughput at capacities 2 and 256 of every chain and floor, and ``observe_on``'s."""
    chains: tuple[tuple[str, Chain], ...] = (
        ("rxs", RxsChain),
        ("hand", HandChain),
        ("fused", FusedChain),
    )
    # the floors (no engine): throughput only, interleaved with the chains
    floors: tuple[tuple[str, Chain], ...] = (
        ("floor", FloorChain),
        ("floor st", FloorStampedChain),
        ("floor items", FloorItemsChain),
        ("floor inline", FloorItemsInlineChain),
        ("floor plain", FloorPlainItemsChain),
    )
    for key, chain in chains:
        gc.collect()
        samples = latency(chain, trips)
        add(f"{key} p50", statistics.median(samples) * 1e6)
        add(f"{key} p99", p99(samples) * 1e6)
    for capacity in (2, BIG):
        for key, chain in chains + floors:
            gc.collect()
            cpu: list[float] = []
            add(f"{key} {capacity}", throughput(chain, items, capacity, cpu=cpu) / 1e3)
            add(f"{key} {capacity} cpu", cpu[0] * 1e6)
    if observe_on:
        gc.collect()
        add("observe_on", rx_observe_on_throughput(items) / 1e3)


def measure(
    reps: int,
    trips: int,
    items: int,
    drive_items: int,
    sets: Sequence[str] = (OS,),
    cpu: int | None = None,
) -> tuple[list[Row], list[str]]:
    """Every variant once per repetition, interleaved, then the table's rows and the floors'
    lines (:func:`floor_line`).

    ``sets``: the placements of the in-process rows (``os``; ``one``, every thread of the
    process on ``cpu``; both: the ``one`` set in every other repetition, first in every other
    of those). The ``drive`` rows (one thread, no hand-off) run once a repetition, unpinned.
    """
    got: dict[str, list[float]] = {}

    def adder(placement: str) -> Callable[[str, float], None]:
        def add(key: str, value: float) -> None:
            got.setdefault(f"{placement} {key}", []).append(value)

        return add

    both = len(sets) > 1
    for rep in range(reps):
        due = [placement for placement in sets if placement == OS or not both or rep % 2 == 0]
        for placement in due if (rep // 2) % 2 == 0 else due[::-1]:
            with on_cpus(None if placement == OS else {cpu} if cpu is not None else None):
                _in_process(adder(placement), trips, items)
        add = adder("drive")
        for name, run in (("drive", drive_s), ("rx map", rx_map_s)):
            gc.collect()
            four = run(drive_items, 4)
            gc.collect()
            eight = run(drive_items, 8)
            add(name, four / (drive_items * 4) * 1e9)
            add(f"{name} marginal", (eight - four) / (drive_items * 4) * 1e9)

    per_set: list[list[Row]] = []
    notes: list[str] = []
    for placement in sets:
        label = f"[{PLACEMENT_LABELS[placement]}] " if list(sets) != [OS] else ""
        placed = {key.split(" ", 1)[1]: value for key, value in got.items()
                  if key.startswith(f"{placement} ")}  # fmt: skip
        set_rows, set_notes = _rows(placed, items, label, info=placement != OS)
        per_set.append(set_rows)
        notes += [f"- {label.strip()}{note[1:]}" if label else note for note in set_notes]
    # a measure's rows together, a placement a row
    rows = [row for same in zip(*per_set, strict=True) for row in same]
    drive = {key.split(" ", 1)[1]: value for key, value in got.items() if key.startswith("drive ")}
    rows.append(
        Row(f"drive(frames={drive_items}), 4 pipes, all cost / 4", "ns/item/stage",
            drive["drive"], "reactivex from_iterable + ops.map x4", drive["rx map"], "—", None)
    )  # fmt: skip
    rows.append(
        Row(f"drive(frames={drive_items}), each stage (8 pipes - 4 pipes) / 4", "ns/item/stage",
            drive["drive marginal"], "reactivex ops.map, (8 maps - 4 maps) / 4",
            drive["rx map marginal"], "≤ 3x", lambda r: r <= 3.0)
    )  # fmt: skip
    return rows, notes


def _rows(
    got: dict[str, list[float]], items: int, label: str, *, info: bool
) -> tuple[list[Row], list[str]]:
    """One placement's rows (each measure prefixed with ``label``; ``info``: its targets shown,
    no verdicts) and its floors' lines."""
    big = BIG
    hand = "hand-written queue.Queue chain"
    backlog = f"{label}throughput, {items // 1000 or items}{'k' if items >= 1000 else ''} backlog"
    rows = [
        Row(f"{label}hop latency, 1 in flight, median", "µs/hop", got["rxs p50"], hand,
            got["hand p50"], "≤ 1.25x", lambda r: r <= 1.25, info),
        Row(f"{label}hop latency, 1 in flight, p99", "µs/hop", got["rxs p99"], hand,
            got["hand p99"], "—", None),
    ]  # fmt: skip
    for capacity in (2, big):  # issue 18: batched hand-offs, ≥ 1.5x the hand-written chain
        rows.append(
            Row(f"{backlog}, capacity {capacity}", "k items/s", got[f"rxs {capacity}"],
                f"hand-written, queue.Queue(maxsize={capacity})", got[f"hand {capacity}"],
                "≥ 1.5x", lambda r: r >= 1.5, info)
        )  # fmt: skip
    # the floors, no engine (issue 18): the cheapest bounded thread-a-stage chain, against the
    # same hand-written chain; information, the target column says rxstream's
    floor_backlog = backlog.removeprefix(label)
    for capacity in (2, big):
        for key, name in (
            ("floor", FLOOR),
            ("floor st", FLOOR_STAMPED),
            ("floor items", FLOOR_ITEMS),
            ("floor inline", FLOOR_INLINE),
            ("floor plain", FLOOR_PLAIN),
        ):
            rows.append(
                Row(f"{label}{name}: {floor_backlog}, capacity {capacity}", "k items/s",
                    got[f"{key} {capacity}"], f"hand-written, queue.Queue(maxsize={capacity})",
                    got[f"hand {capacity}"], "(rxstream's: ≥ 1.5x)", None)
            )  # fmt: skip
            rows.append(
                Row(f"{label}{name}: CPU per item, all threads, {floor_backlog}, "
                    f"capacity {capacity}", "µs/item", got[f"{key} {capacity} cpu"],
                    f"hand-written, queue.Queue(maxsize={capacity})",
                    got[f"hand {capacity} cpu"], "—", None)
            )  # fmt: skip
    for capacity in (2, big):  # the same runs' CPU: what a loaded machine disturbs least
        rows.append(
            Row(f"{label}CPU per item, all threads, {floor_backlog}, capacity {capacity}",
                "µs/item", got[f"rxs {capacity} cpu"],
                f"hand-written, queue.Queue(maxsize={capacity})", got[f"hand {capacity} cpu"],
                "—", None)
        )  # fmt: skip
    for capacity, target in ((2, None), (big, 3.0)):  # observe_on is unbounded: the backlog row
        rows.append(
            Row(f"{backlog}, capacity {capacity}", "k items/s", got[f"rxs {capacity}"],
                "reactivex observe_on(EventLoopScheduler()) x4, unbounded", got["observe_on"],
                "≥ 3x" if target else "—", (lambda r: r >= 3.0) if target else None, info)
        )  # fmt: skip
    # the opt-in fused shape (issue 18): p2..p4 fuse=True onto p1's thread, against the same
    # hand-written chain (a thread per stage) of the same repetitions
    fused = f"{label}opt-in fused shape (p2..p4 fuse=True on p1's thread)"
    rows.append(
        Row(f"{fused}: hop latency, 1 in flight, median", "µs/hop", got["fused p50"], hand,
            got["hand p50"], "≤ 1.25x", lambda r: r <= 1.25, info)
    )  # fmt: skip
    for capacity in (2, big):
        rows.append(
            Row(f"{fused}: {floor_backlog}, capacity {capacity}", "k items/s",
                got[f"fused {capacity}"], f"hand-written, queue.Queue(maxsize={capacity})",
                got[f"hand {capacity}"], "≥ 1.5x", lambda r: r >= 1.5, info)
        )  # fmt: skip
        rows.append(
            Row(f"{fused}: CPU per item, all threads, {floor_backlog}, capacity {capacity}",
                "µs/item", got[f"fused {capacity} cpu"],
                f"hand-written, queue.Queue(maxsize={capacity})", got[f"hand {capacity} cpu"],
                "—", None)
        )  # fmt: skip
    notes = [
        floor_line(capacity, [("the floor (5 threads, C queues)", got[f"floor {capacity}"],
                               got[f"floor st {capacity}"])],
                   got[f"hand {capacity}"], "the hand-written chain", THREADED_TARGET)
        for capacity in (2, big)
    ] + [
        items_line(capacity, [("the items floor (5 threads)", got[f"floor items {capacity}"])],
                   got[f"hand {capacity}"], "the hand-written chain", THREADED_TARGET)
        for capacity in (2, big)
    ]  # fmt: skip
    return rows, notes


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Thread-hop cost of rxstream vs its baselines")
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every variant")
    parser.add_argument("--items", type=int, default=None, help="backlog size (throughput)")
    parser.add_argument(
        "--placement",
        choices=("os", "one", "both"),
        default="os",
        help="where the in-process rows' threads run: os, where the OS puts them (default); "
        "one, every thread of the process on one CPU; both, the two sets interleaved, the "
        "one-CPU set in every other repetition (its rows info, the OS rows the verdicts). The "
        "drive rows (one thread) run unpinned",
    )
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 11)
    items = args.items or (2_000 if args.quick else 20_000)
    trips = 100 if args.quick else 1_000
    drive_items = 1_000 if args.quick else 5_000
    sets, cpu, why = placements(args.placement)

    began = _perf()
    rows, notes = measure(reps, trips, items, drive_items, sets, cpu)
    took = _perf() - began
    command = " ".join(["python bench/hop.py", *(sys.argv[1:] if argv is None else argv)])
    print(
        f"# {command}: {reps} repetitions, interleaved; latency {trips} round trips each, "
        f"throughput {items} items, drive {drive_items} items; took {took:.0f} s"
    )
    if len(sets) > 1:
        print(
            f"# placement both: the [OS] rows in every repetition, the [one CPU] rows (every "
            f"thread of the process on CPU {cpu}, the mask restored after each measure) in "
            f"{(reps + 1) // 2} of them, every other one, before the OS set in every other of "
            f"those; verdicts: the OS rows'"
        )
    elif sets == [ONE_CPU]:
        print(f"# placement one: every thread of the process on CPU {cpu}; no verdicts (info)")
    if why:
        print(f"# {why}")
    print(
        f"# Python {platform.python_version()}, reactivex {version('reactivex')}, "
        f"rxstream {rxstream.__version__} at {revision()}, {os.cpu_count()} CPUs"
    )
    print()
    print(table(rows))
    print()
    print("\n".join(notes))
    print()
    print("# docs/performance.md's rows (the targets):")
    print(performance_rows(rows, command))


if __name__ == "__main__":
    main()
