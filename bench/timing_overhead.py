"""What rxstream's per-hop timing costs: the same pipelines with timing on and off, in one run.

Every figure is a ratio of two sides measured in the same process, interleaved repetition by
repetition, the side that goes first alternating (see docs/performance.md, "How to
measure"): absolute times on the shared 2-core machines drift 2-3x from one hour to the next,
ratios much less.

- **on**: ``rxstream.Context()``. Every stage stamps ``<stage>.in``/``<stage>.out`` into the
  item's timeline, and the ``ctx.stream`` sink checks each item for a record to fold.
- **off**: ``rxstream.Context(timing=False)``. No stamps, no records.

The pipelines, the same on both sides:

1. latency, one item in flight, threaded:
   ``ctx.source(gen, name="src") | ctx.pipe(noop, name="p1") | ... p4 | ctx.stream("out")``.
   The main thread puts one payload on the queue the source pulls from and waits for it on a
   result queue, which the sink's transport (``send``) fills: 7 thread hops (main→src, src→p1,
   p1→p2, p2→p3, p3→p4, p4→out, out→main); reported per hop (end-to-end / 7), median and p99
   of each repetition. A plain source (``input_seq`` 0, no steer) makes no timing record, so
   this row is the cost of the stamps and the sink's check alone.
2. throughput with a backlog, threaded: the same pipeline, every inbox of capacity 256,
   ``--items`` payloads pulled as fast as it takes them, from the moment a gate opens until
   the sink's transport has seen the last one. Then the same with Python's cyclic garbage
   collector off during the run (``gc.disable()``, both sides): the stamps are small tuples
   the collector tracks, and with a backlog in flight its extra passes are part of their
   cost; this row shows how much.
3. ``pipeline.drive(frames=N)`` of ``ctx.source(range(N)) | 4 pipes | ctx.stream("out")``:
   ns per item per stage (all cost / 6 stages), and the marginal cost of a pipe
   ((8 pipes - 4 pipes) / 4; drive fuses consecutive pipes into one call per item). Each
   repetition takes the best of 3 drives of the same pipeline.
4. one timing record: ``ctx.input("mouse", capacity=N) | 4 pipes | ctx.stream("out")`` fed N
   samples, then ``drive(frames=N)``. Every item is a new ``input_seq``, so with timing on the
   sink folds and logs one record per item, as a JSON line to a file
   (``rxstream.timing.configure_logging(path)``, set up for both sides); off, it logs none.
   The difference per item is the cost of one record (fold, structlog, the write), plus the
   item's own stamps (row 3: a small part of it).

5. exports (a second table; ``--exports``: only it): ``ctx.input("mouse", capacity=N) | 4
   pipes | ctx.stream("out")``, threaded, every inbox of capacity 256, fed N samples before
   it starts, timed from ``start()`` until the sink's transport has the last item. Every
   item is a new input, so the sink folds a record per item, logged to a file on both sides
   as ``rxstream run --log`` does. **on**: each record also becomes a trace (``TraceExport``
   over a span exporter that counts the spans and sends them nowhere, batched off the sink's
   thread) and is counted in a ``RunMetrics`` (hop and end-to-end histograms); **off**:
   neither is made, and a run without exports never imports either package
   (``tests/test_otel.py``). Two rows: each pipe holding each frame 2 ms with the GIL
   released (``time.sleep``: a model's stage waiting on its GPU or native kernel), a record
   per frame (a live session makes one per frame at most), target on/off ≥ 0.95x; and no-op
   pipes, a record every ~0.1 ms (the worst case: what a record's exports cost, information).

The target: timing adds under 10% to the per-hop cost of a threaded pipeline. Two rows carry
it: the median hop latency (on/off ≤ 1.10x) and the throughput with the collector on (on/off
≥ 0.91x, i.e. at most 10% more time per item). The others are information.

Run ``python bench/timing_overhead.py`` (about a minute) or ``python bench/timing_overhead.py
--quick`` (a few seconds, a smoke run whose ratios are indicative only).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

import structlog

# `python bench/timing_overhead.py` from a checkout where the package is not installed
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _report import STOP, ignore, noop, p99, pulled, revision, spread, verdict

import rxstream
from rxstream.item import PipelineItem
from rxstream.timing import configure_logging
from rxstream.transport import Transport

STAGES = ("p1", "p2", "p3", "p4")
LATENCY_HOPS = len(STAGES) + 3  # main→src, src→p1, p1→p2, p2→p3, p3→p4, p4→out, out→main
BIG = 256
JOIN_S = 10.0

_perf = time.perf_counter
SIDES = (("on", True), ("off", False))


class Egress(Transport):
    """A transport that hands every payload the sink sends to ``on_payload``."""

    def __init__(self, on_payload: Callable[[Any], None]) -> None:
        self._on_payload = on_payload

    @property
    def connected(self) -> bool:
        return True

    def send(self, stream: str, item: PipelineItem) -> None:
        self._on_payload(item.payload)


def chain(
    ctx: rxstream.Context,
    head: rxstream.Stage,
    pipes: int,
    capacity: int = 2,
    work: Callable[[Any], Any] = noop,
) -> rxstream.Pipeline:
    """``head | ctx.pipe(work, name="p1", capacity=c) | ... | ctx.stream("out", capacity=c)``."""
    pipeline = head | ctx.pipe(work, name="p1", capacity=capacity)
    for index in range(1, pipes):
        pipeline = pipeline | ctx.pipe(work, name=f"p{index + 1}", capacity=capacity)
    return pipeline | ctx.stream("out", capacity=capacity)


def threaded(
    timing: bool, pull: Callable[[], Any], on_payload: Callable[[Any], None], capacity: int
) -> rxstream.Pipeline:
    """The threaded pipeline of measures 1 and 2: ``src`` pulls ``pull()``, the sink signals."""
    ctx = rxstream.Context(transport=Egress(on_payload), timing=timing)
    return chain(ctx, ctx.source(lambda: pulled(pull), name="src"), len(STAGES), capacity)


def _finish(pipeline: rxstream.Pipeline) -> None:
    if not pipeline.wait(JOIN_S):
        pipeline.stop()
        raise RuntimeError("the pipeline did not finish")


# --- 1. latency, one item in flight ---------------------------------------------------------


def latency(timing: bool, trips: int, warmup: int = 20) -> list[float]:
    """Seconds per hop of each of ``trips`` round trips (after ``warmup`` unmeasured ones)."""
    feed: queue.Queue[Any] = queue.Queue()
    result: queue.Queue[Any] = queue.Queue()
    pipeline = threaded(timing, feed.get, result.put, 2)
    pipeline.start()
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
        _finish(pipeline)
    return samples


# --- 2. throughput with a backlog -------------------------------------------------------------


def throughput(timing: bool, items: int, capacity: int, collect: bool = True) -> float:
    """Items per second, from an open gate until the sink's transport has the last one.

    ``collect=False`` turns Python's cyclic garbage collector off for the run (every thread).
    """
    gate = threading.Event()
    finished = threading.Event()
    values: Iterator[Any] = iter(range(items))
    left = [items]

    def pull() -> Any:
        if not gate.is_set():
            gate.wait()
        return next(values, STOP)

    def count(_payload: Any) -> None:
        left[0] -= 1
        if not left[0]:
            finished.set()

    pipeline = threaded(timing, pull, count, capacity)
    pipeline.start()
    time.sleep(0.02)  # every thread is up and waiting
    if not collect:
        gc.disable()
    try:
        started = _perf()
        gate.set()
        if not finished.wait(JOIN_S * 6):
            pipeline.stop()
            raise RuntimeError("throughput run did not finish")
        elapsed = _perf() - started
    finally:
        gc.enable()
    _finish(pipeline)
    return items / elapsed


# --- 3. drive() -------------------------------------------------------------------------------


def drive_s(timing: bool, items: int, pipes: int, best_of: int = 3) -> float:
    """Seconds of ``drive(frames=items)`` over ``source | pipes x noop | stream``.

    The best of ``best_of`` drives of the same pipeline: a drive is short (tens of ms), and the
    least disturbed of a few is the one that measures the code.
    """
    ctx = rxstream.Context(transport=Egress(ignore), timing=timing)
    pipeline = chain(ctx, ctx.source(range(items), name="src"), pipes)
    pipeline.plan  # noqa: B018 - compiled here, not inside the timed drive
    best = float("inf")
    for _ in range(best_of):
        gc.collect()
        started = _perf()
        out = pipeline.drive(frames=items)
        best = min(best, _perf() - started)
        pipeline.reset()  # drives continue one session: each measured drive starts over
        if len(out) != items:
            raise RuntimeError(f"drive returned {len(out)} items, wanted {items}")
    return best


# --- 4. one timing record ---------------------------------------------------------------------


def records_s(timing: bool, items: int) -> float:
    """Seconds of ``drive(frames=items)`` over ``input | 4 pipes | stream``, fed ``items``."""
    ctx = rxstream.Context(transport=Egress(ignore), timing=timing)
    pipeline = chain(ctx, ctx.input("mouse", capacity=items), len(STAGES))
    for sample in range(items):
        pipeline.feed("mouse", sample)
    pipeline.plan  # noqa: B018
    started = _perf()
    out = pipeline.drive(frames=items)
    elapsed = _perf() - started
    if len(out) != items:
        raise RuntimeError(f"drive returned {len(out)} items, wanted {items}")
    return elapsed


# --- 5. the exports: traces and metrics of every record --------------------------------------


def _counting_exporter() -> Any:
    """A span exporter that counts the spans and sends them nowhere (what an exporter costs
    past the SDK's batching is the collector's, not rxstream's)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Counting(SpanExporter):
        spans = 0

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            self.spans += len(spans)
            return SpanExportResult.SUCCESS

    return Counting()


FRAME_S = 0.002
"""How long each pipe of the frames row holds a frame, the GIL released (``time.sleep``, as a
model's GPU or native kernel releases it): 4 such pipes, about 500 frames/s at most."""


def frame_work(sample: Any) -> Any:
    """A frame's work in a model's stage: ``FRAME_S`` with the GIL released."""
    time.sleep(FRAME_S)
    return sample


def exports_tput(exports: bool, items: int, frames: bool = False) -> float:
    """Items per second of ``input | 4 pipes | stream``, threaded, a record per item, with the
    OpenTelemetry and Prometheus exports of every record on or off; ``frames``: each pipe does
    :func:`frame_work` (else nothing)."""
    finished = threading.Event()
    left = [items]

    def count(_payload: Any) -> None:
        left[0] -= 1
        if not left[0]:
            finished.set()

    ctx = rxstream.Context(transport=Egress(count))
    pipeline = chain(
        ctx, ctx.input("mouse", capacity=items), len(STAGES), BIG, frame_work if frames else noop
    )
    for sample in range(items):
        pipeline.feed("mouse", sample)
    pipeline.plan  # noqa: B018
    with contextlib.ExitStack() as exported:
        traces: Any = None
        if exports:
            from rxstream.timing import RunMetrics, TraceExport
            from rxstream.timing._emit import listen

            traces = TraceExport(_counting_exporter())
            exported.enter_context(listen(traces))
            exported.enter_context(listen(RunMetrics()))
        started, cpu = _perf(), time.process_time()
        pipeline.start()
        if not finished.wait(JOIN_S * 6):
            pipeline.stop()
            raise RuntimeError("exports run did not finish")
        elapsed, cpu = _perf() - started, time.process_time() - cpu
        pipeline.stop()
        if traces is not None:
            traces.close()
            if traces.traces != items:
                raise RuntimeError(f"{traces.traces} traces made, wanted {items}")
    CPU_US.append(cpu / items * 1e6)
    return items / elapsed


CPU_US: list[float] = []
"""The CPU of the whole process (every thread's) per item of each :func:`exports_tput` run, in
µs: what a loaded machine disturbs least."""


def logged(path: Path, run: Callable[[], float]) -> float:
    """``run()`` with rxstream's logs going to ``path`` as JSON lines; structlog restored after."""
    configure_logging(path)
    try:
        return run()
    finally:
        configure_logging()  # closes the file the first call opened
        structlog.reset_defaults()


def timing_lines(path: Path) -> int:
    """The ``[timing:out]`` events in the JSON-lines log at ``path``."""
    with path.open(encoding="utf-8") as lines:
        return sum(1 for line in lines if json.loads(line).get("event") == "[timing:out]")


# --- the table ----------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table: timing on and off, paired by repetition."""

    measure: str
    unit: str
    on: list[float]
    off: list[float]
    added: list[float]
    added_unit: str
    target: str
    check: Callable[[float], bool] | None


def table(rows: Sequence[Row]) -> str:
    """The markdown table: medians [min-max]; the ratio and difference of each pair."""
    lines = [
        "| measure | timing on median [min-max] | timing off median [min-max] "
        "| on/off median [min-max] | added by timing, median [min-max] | target | result |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        ratios, result = verdict(row.on, row.off, row.check)
        lines.append(
            f"| {row.measure} ({row.unit}) | {spread(row.on)} | {spread(row.off)} "
            f"| {spread(ratios, 3, 'x')} | {spread(row.added)} {row.added_unit} "
            f"| {row.target} | {result} |"
        )
    return "\n".join(lines)


def measure(reps: int, trips: int, items: int, drive_items: int, log: Path) -> list[Row]:
    """Every variant on both sides once per repetition, interleaved, then the table's rows."""
    got: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        got.setdefault(key, []).append(value)

    for rep in range(reps):
        sides = SIDES if rep % 2 == 0 else SIDES[::-1]  # who goes first alternates
        for side, timing in sides:
            gc.collect()
            samples = latency(timing, trips)
            add(f"{side} p50", statistics.median(samples) * 1e6)
            add(f"{side} p99", p99(samples) * 1e6)
        for side, timing in sides:
            gc.collect()
            add(f"{side} tput", throughput(timing, items, BIG) / 1e3)
        for side, timing in sides:
            gc.collect()
            add(f"{side} tput nogc", throughput(timing, items, BIG, collect=False) / 1e3)
        for side, timing in sides:
            four = drive_s(timing, drive_items, 4)
            eight = drive_s(timing, drive_items, 8)
            add(f"{side} drive", four / (drive_items * 6) * 1e9)
            add(f"{side} marginal", (eight - four) / (drive_items * 4) * 1e9)
        for side, timing in sides:
            gc.collect()
            seconds = logged(log, partial(records_s, timing, drive_items))
            add(f"{side} record", seconds / drive_items * 1e6)

    logged_lines = timing_lines(log)
    if logged_lines != reps * drive_items:
        raise RuntimeError(f"the log has {logged_lines} records, wanted {reps * drive_items}")

    def diff(key: str) -> list[float]:
        return [a - b for a, b in zip(got[f"on {key}"], got[f"off {key}"], strict=True)]

    def per_item_us(key: str) -> list[float]:
        """The µs per item timing adds, from the two sides' k items/s."""
        pairs = zip(got[f"on {key}"], got[f"off {key}"], strict=True)
        return [1e3 / a - 1e3 / b for a, b in pairs]

    backlog = f"{items // 1000}k" if items >= 1000 else str(items)
    return [
        Row("hop latency, 1 in flight, median", "µs/hop", got["on p50"], got["off p50"],
            diff("p50"), "µs/hop", "≤ 1.10x", lambda r: r <= 1.10),
        Row("hop latency, 1 in flight, p99", "µs/hop", got["on p99"], got["off p99"],
            diff("p99"), "µs/hop", "—", None),
        Row(f"throughput, {backlog} backlog, capacity {BIG}", "k items/s", got["on tput"],
            got["off tput"], per_item_us("tput"), "µs/item", "≥ 0.91x",
            lambda r: r >= 1 / 1.10),
        Row("the same, garbage collector off during the run", "k items/s",
            got["on tput nogc"], got["off tput nogc"], per_item_us("tput nogc"), "µs/item", "—",
            None),
        Row(f"drive(frames={drive_items}), src + 4 pipes + sink, all cost / 6", "ns/item/stage",
            got["on drive"], got["off drive"], diff("drive"), "ns/item/stage", "—", None),
        Row(f"drive(frames={drive_items}), each pipe (8 pipes - 4 pipes) / 4", "ns/item/stage",
            got["on marginal"], got["off marginal"], diff("marginal"), "ns/item/stage", "—",
            None),
        Row(f"drive(frames={drive_items}), input + 4 pipes + sink, a record per item, "
            "logged to a file", "µs/item", got["on record"], got["off record"],
            diff("record"), "µs/record", "—", None),
    ]  # fmt: skip


def measure_exports(reps: int, frames: int, items: int, log: Path) -> list[Row]:
    """Row 5, exports on and off once per repetition, interleaved: frames, then no-op pipes."""
    got: dict[str, list[float]] = {}
    for rep in range(reps):
        sides = SIDES if rep % 2 == 0 else SIDES[::-1]
        for side, on in sides:
            gc.collect()
            run = partial(exports_tput, on, frames, frames=True)
            got.setdefault(f"{side} frames", []).append(logged(log, run) / 1e3)
            got.setdefault(f"{side} frames cpu", []).append(CPU_US[-1])
        for side, on in sides:
            gc.collect()
            run = partial(exports_tput, on, items)
            got.setdefault(f"{side} items", []).append(logged(log, run) / 1e3)
            got.setdefault(f"{side} items cpu", []).append(CPU_US[-1])
    logged_lines = timing_lines(log)
    if logged_lines != reps * 2 * (frames + items):
        raise RuntimeError(
            f"the log has {logged_lines} records, wanted {reps * 2 * (frames + items)}"
        )

    def per_item_us(key: str) -> list[float]:
        pairs = zip(got[f"on {key}"], got[f"off {key}"], strict=True)
        return [1e3 / a - 1e3 / b for a, b in pairs]

    def diff(key: str) -> list[float]:
        return [a - b for a, b in zip(got[f"on {key}"], got[f"off {key}"], strict=True)]

    return [
        Row(f"throughput, input + 4 pipes each holding a frame {FRAME_S * 1e3:g} ms, GIL "
            f"released + sink, threaded, {frames} frames, each a new input: a record per frame "
            "logged, its trace (no-op exporter) and metrics", "frames/s",
            [v * 1e3 for v in got["on frames"]], [v * 1e3 for v in got["off frames"]],
            per_item_us("frames"), "µs/record", "≥ 0.95x", lambda r: r >= 0.95),
        Row("the same, CPU of the process per frame (every thread's)", "µs/frame",
            got["on frames cpu"], got["off frames cpu"], diff("frames cpu"), "µs/record", "—",
            None),
        Row(f"the same, no-op pipes, {items} items (a record every ~0.1 ms: the worst case)",
            "k items/s", got["on items"], got["off items"], per_item_us("items"), "µs/record",
            "—", None),
        Row("the same, CPU of the process per item (every thread's)", "µs/item",
            got["on items cpu"], got["off items cpu"], diff("items cpu"), "µs/record", "—",
            None),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="What rxstream's per-hop timing costs")
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every variant")
    parser.add_argument("--items", type=int, default=None, help="backlog size (throughput)")
    parser.add_argument(
        "--exports", action="store_true", help="only the exports table (traces and metrics)"
    )
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 15)
    items = args.items or (2_000 if args.quick else 20_000)
    trips = 100 if args.quick else 2_000
    drive_items = 500 if args.quick else 5_000

    began = _perf()
    with tempfile.TemporaryDirectory(prefix="rxstream-timing-") as scratch:
        log = Path(scratch) / "timing.jsonl"
        rows = [] if args.exports else measure(reps, trips, items, drive_items, log)
        frames = 40 if args.quick else 600
        exports = measure_exports(reps, frames, drive_items, Path(scratch) / "exports.jsonl")
    took = _perf() - began
    command = " ".join(
        ["python bench/timing_overhead.py", *(sys.argv[1:] if argv is None else argv)]
    )
    measured = (
        ""
        if args.exports
        else f"latency {trips} round trips each, throughput {items} items, drive and records "
        f"{drive_items} items; "
    )
    print(
        f"# {command}: {reps} repetitions, interleaved (on/off order alternating); {measured}"
        f"exports {frames} frames and {drive_items} items; took {took:.0f} s"
    )
    print(
        f"# Python {platform.python_version()}, reactivex {version('reactivex')}, "
        f"structlog {version('structlog')}, rxstream {rxstream.__version__} at {revision()}, "
        f"{os.cpu_count()} CPUs"
    )
    if rows:
        print()
        print(table(rows))
    print()
    print(table(exports).replace("timing on", "exports on").replace("timing off", "exports off")
          .replace("added by timing", "added by the exports"))  # fmt: skip


if __name__ == "__main__":
    main()
