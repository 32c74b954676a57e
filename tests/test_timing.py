"""Per-hop timing: one record per input or cutover, wait vs compute, logging, hooks, ctx.input."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import cast

import hypothesis.strategies as st
import pytest
import structlog
from hypothesis import given

import rxstream
from rxstream import PipelineError, PipelineItem
from rxstream.testing import capture_timing
from rxstream.timing import HopTiming, TimingRecord, configure_logging, load
from rxstream.timing import _emit as timing_emit
from rxstream.topology import ClientStreamLimitExceeded, ClientStreamLimits
from rxstream.transport import MemoryTransport

SLEEP = 0.05
"""Seconds the sleeping stage of the wait-vs-compute tests sleeps per item."""


def hop_sum(record: TimingRecord) -> float:
    """The record's hops, wait, hold and compute, summed (ms)."""
    return sum(hop.wait_ms + hop.hold_ms + hop.compute_ms for hop in record.hops)


def hops_of(record: TimingRecord) -> dict[str, HopTiming]:
    """The record's hops by name."""
    return {hop.name: hop for hop in record.hops}


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``check`` until it holds; raise (never hang) if it does not, even on a stage thread."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def stamp(item: PipelineItem, hop: str) -> float:
    """The time of ``hop`` in ``item``'s timeline (exactly one such stamp)."""
    found = [t for name, t in item.metadata.timeline if name == hop]
    assert len(found) == 1, (hop, item.metadata.timeline)
    return found[0]


# --- 1. one record per input_seq, threaded, 120 Hz into 24 fps ------------------------------


def test_input_at_120hz_into_24fps_gives_one_record_per_window(ctx: rxstream.Context) -> None:
    """120 Hz mouse windowed into 24 fps: one record per new input_seq, none for idle frames."""

    def pipe(batch: list[int]) -> list[int]:
        return batch

    pipeline = (
        ctx.input("mouse")
        | ctx.window(ms=1000 / 24)
        | ctx.pipe(pipe, name="pipe")
        | ctx.pace(fps=24)
        | ctx.stream("video")
    )
    transport = cast(MemoryTransport, ctx.transport)
    fed = 0
    with capture_timing() as records:
        pipeline.start()
        try:
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                fed += 1
                assert pipeline.feed("mouse", fed) == fed  # the sample is its input_seq
                time.sleep(1 / 120)
            last = fed
            wait_until(
                lambda: any(
                    i.metadata.idle and i.metadata.input_seq == last
                    for i in transport.items("video")
                ),
                "the last window to egress and repeat idle",
            )
        finally:
            pipeline.stop()
        records = list(records)

    items = transport.items("video")
    frames = [i for i in items if not i.metadata.idle]
    idle = [i for i in items if i.metadata.idle]
    assert idle, "pace repeated no idle frame"
    assert records, "no timing record"
    mouse = pipeline.statistics()["mouse"]
    assert mouse.items_in + mouse.dropped.get("latest", 0) == fed

    seqs = [r.input_seq for r in records]
    # one record per non-idle frame, in egress order, for that frame's newest sample
    assert seqs == [f.metadata.input_seq for f in frames]
    assert [r.pts for r in records] == [f.metadata.pts for f in frames]
    assert [max(f.payload) for f in frames] == seqs
    assert all(a < b for a, b in itertools.pairwise(seqs)), seqs
    assert seqs[-1] == fed
    counts = collections.Counter(seqs)
    assert all(count == 1 for count in counts.values())
    # an idle frame repeats a frame already reported: its identity has exactly one record
    assert all(counts[i.metadata.input_seq] == 1 for i in idle)
    assert len(records) == len({f.metadata.input_seq for f in frames})

    for record in records:
        assert record.stream == "video"
        assert record.origin == "input.recv"
        assert record.cutover is False
        assert [hop.name for hop in record.hops] == ["mouse", "window", "pipe", "pace", "video"]
        assert math.isclose(hop_sum(record), record.total_ms, rel_tol=1e-6)
        assert all(hop.wait_ms >= 0 and hop.compute_ms >= 0 for hop in record.hops)
        # the pace held every frame until its tick; only the window and the pace hold
        assert hops_of(record)["pace"].hold_ms > 0
        assert all(hop.hold_ms >= 0 for hop in record.hops)
        assert {hop.name for hop in record.hops if hop.hold_ms} <= {"window", "pace"}


# --- 2. wait vs compute ---------------------------------------------------------------------


def test_pace_and_window_hold_is_its_own_category(ctx: rxstream.Context) -> None:
    """.in -> .hold is hold_ms, .hold -> .out compute_ms; a stage that does not hold has 0."""
    pipeline = (
        ctx.input("mouse")
        | ctx.window(count=1)
        | ctx.pipe(lambda x: x, name="render")
        | ctx.pace(fps=10)
        | ctx.stream("video")
    )
    pipeline.feed("mouse", 1)
    with capture_timing() as records:
        (item,) = pipeline.drive(frames=1, items=True)
    (record,) = records
    stamps = [hop for hop, _ in item.metadata.timeline]
    assert stamps[3:] == [
        "window.in",
        "window.hold",
        "window.out",
        "render.in",
        "render.out",
        "pace.in",
        "pace.hold",
        "pace.out",
        "video.in",
        "video.out",
    ]
    t = dict(item.metadata.timeline)
    hops = hops_of(record)
    for name in ("window", "pace"):
        assert hops[name].hold_ms == (t[f"{name}.hold"] - t[f"{name}.in"]) * 1e3
        assert hops[name].compute_ms == (t[f"{name}.out"] - t[f"{name}.hold"]) * 1e3
    assert hops["render"].hold_ms == 0.0
    assert hops["render"].compute_ms == (t["render.out"] - t["render.in"]) * 1e3
    assert math.isclose(hop_sum(record), record.total_ms, rel_tol=1e-9)
    fields = record.fields()
    assert "pace.hold_ms" in fields
    assert "window.hold_ms" in fields
    assert not {"mouse.hold_ms", "render.hold_ms", "video.hold_ms"} & fields.keys()
    assert list(fields).index("pace.hold_ms") == list(fields).index("pace.wait_ms") + 1


def test_a_sleep_counts_as_compute_of_its_stage_not_wait_downstream(ctx: rxstream.Context) -> None:
    """A stage that sleeps has compute >= the sleep; the next stage's wait is .out to .in."""

    def slow(x: int) -> int:
        time.sleep(SLEEP)
        return x

    def fast(x: int) -> int:
        return x

    records: list[TimingRecord] = []
    pipeline = (
        ctx.input("mouse")
        | ctx.pipe(slow)
        | ctx.pipe(fast)
        | ctx.stream("video", on_timing=records.append)
    )
    pipeline.feed("mouse", 1)
    pipeline.feed("mouse", 2)
    items = pipeline.drive(frames=2, items=True)

    assert [r.input_seq for r in records] == [1, 2]
    for record, item in zip(records, items, strict=True):
        hops = hops_of(record)
        assert list(hops) == ["mouse", "slow", "fast", "video"]
        assert hops["slow"].compute_ms >= SLEEP * 1000
        assert hops["slow"].compute_ms == (stamp(item, "slow.out") - stamp(item, "slow.in")) * 1e3
        assert hops["fast"].wait_ms == (stamp(item, "fast.in") - stamp(item, "slow.out")) * 1e3
        assert hops["slow"].wait_ms == (stamp(item, "slow.in") - stamp(item, "mouse.out")) * 1e3
        assert hops["mouse"].wait_ms == (stamp(item, "mouse.in") - stamp(item, "input.recv")) * 1e3
        # the sleep is the slow stage's compute, not the downstream's queue-wait
        assert hops["fast"].wait_ms < hops["slow"].compute_ms
        assert hops["slow"].wait_ms < hops["slow"].compute_ms
        assert math.isclose(hop_sum(record), record.total_ms, rel_tol=1e-6)
        assert record.total_ms >= SLEEP * 1000


def test_an_item_queued_behind_a_busy_stage_waits_at_least_the_sleep(
    ctx: rxstream.Context,
) -> None:
    """Threaded: the second sample, queued while the first sleeps, has that stage's wait >= it."""

    def slow(x: int) -> int:
        if x == 1:  # hold the first sample until the second sits in this stage's inbox
            wait_until(lambda: pipeline.statistics()["slow"].inbox_depth >= 1, "a queued item")
        time.sleep(SLEEP)
        return x

    records: list[TimingRecord] = []
    pipeline = ctx.input("mouse") | ctx.pipe(slow) | ctx.stream("video", on_timing=records.append)
    pipeline.start()
    try:
        pipeline.feed("mouse", 1)
        pipeline.feed("mouse", 2)
        wait_until(lambda: len(records) == 2, "two records")
    finally:
        pipeline.stop()

    first, second = (hops_of(r) for r in records)
    assert [r.input_seq for r in records] == [1, 2]
    assert first["slow"].compute_ms >= SLEEP * 1000
    assert second["slow"].compute_ms >= SLEEP * 1000
    # the second item was stamped mouse.out before it was queued, and the stage took it only
    # after sleeping over the first: the sleep is its queue-wait, not its compute
    assert second["slow"].wait_ms >= SLEEP * 1000
    for record in records:
        assert math.isclose(hop_sum(record), record.total_ms, rel_tol=1e-6)


# --- 3. steered pipelines: one record per cutover ---------------------------------------------


def steered_frames(ctx: rxstream.Context) -> Callable[[], Iterator[int]]:
    """A generator source that steers between its third and fourth frame."""

    def frames() -> Iterator[int]:
        yield 0
        yield 1
        yield 2
        ctx.control.steer(prompt="b")
        yield 3
        yield 4

    return frames


def double(x: int) -> int:
    return 2 * x


def test_a_steer_gives_exactly_one_record_for_its_cutover(ctx: rxstream.Context) -> None:
    """A steer on a pipeline without input: one record, origin 'steer', input_seq 0, cutover."""
    ctx.doc("control", defaults={"prompt": "a"})
    records: list[TimingRecord] = []
    pipeline = (
        ctx.source(steered_frames(ctx), name="frames")
        | ctx.pipe(double)
        | ctx.stream("video", on_timing=records.append)
    )
    items = pipeline.drive(frames=5, items=True)

    assert [i.payload for i in items] == [0, 2, 4, 6, 8]
    assert [i.metadata.cutover for i in items] == [False, False, False, True, False]
    assert len(records) == 1
    (record,) = records
    assert record.stream == "video"
    assert record.origin == "steer"
    assert record.input_seq == 0
    assert record.input_at_ms == 0
    assert record.cutover is True
    assert record.prompt_generation == 1
    assert record.pts == 3
    assert record.from_client_ms is None
    assert [hop.name for hop in record.hops] == ["frames", "double", "video"]
    assert record.total_ms >= 0
    assert math.isclose(hop_sum(record), record.total_ms, rel_tol=1e-6)


def test_a_steer_from_a_stage_gives_one_ordered_cutover_record(ctx: rxstream.Context) -> None:
    """A steer from a downstream stage between pulls: one cutover record, no negative hop."""
    ctx.doc("control", defaults={"prompt": "a"})
    records: list[TimingRecord] = []
    pipeline: rxstream.Pipeline

    def steer_after_1(x: int) -> None:
        if x == 1:
            pipeline.update(prompt="b")

    pipeline = (
        ctx.source(range(5), name="frames")
        | ctx.tap(steer_after_1)
        | ctx.stream("video", on_timing=records.append)
    )
    items = pipeline.drive(frames=5, items=True)

    assert [i.payload for i in items] == [0, 2, 3, 4]  # 1 went stale at the sink's door
    assert pipeline.statistics()["video"].dropped == {"stale": 1}
    assert len(records) == 1
    (record,) = records
    assert (record.origin, record.input_seq, record.cutover, record.pts) == ("steer", 0, True, 2)
    assert [hop.name for hop in record.hops] == ["frames", "steer_after_1", "video"]
    assert all(hop.wait_ms >= 0 and hop.compute_ms >= 0 for hop in record.hops)
    assert math.isclose(hop_sum(record), record.total_ms, rel_tol=1e-6)


def test_a_steer_inside_a_source_pull_keeps_the_timeline_in_order(
    ctx: rxstream.Context,
) -> None:
    """A steer during a source's pull: the cutover timeline is in time order, no wait is < 0."""
    ctx.doc("control", defaults={"prompt": "a"})
    records: list[TimingRecord] = []
    pipeline = (
        ctx.source(steered_frames(ctx), name="frames")
        | ctx.pipe(double)
        | ctx.stream("video", on_timing=records.append)
    )
    items = pipeline.drive(frames=5, items=True)
    cutover = items[3]
    times = [t for _, t in cutover.metadata.timeline]
    assert times == sorted(times), cutover.metadata.timeline
    assert all(hop.wait_ms >= 0 for hop in records[0].hops), records[0].hops


# --- 4. the structlog line ------------------------------------------------------------------


@pytest.fixture
def timing_log(tmp_path: Path) -> Iterator[Path]:
    """JSON-lines logging to a file for the test; the file closed and structlog restored after."""
    saved = structlog.get_config()
    path = tmp_path / "t.jsonl"
    configure_logging(path=path)
    try:
        yield path
    finally:
        opened = timing_emit._opened
        if opened is not None:
            opened.close()
            timing_emit._opened = None
        structlog.reset_defaults()
        structlog.configure(**saved)


def logged_pipeline(ctx: rxstream.Context, records: list[TimingRecord]) -> rxstream.Pipeline:
    """mouse | work | video, fed three samples (driven by the caller)."""

    def work(x: int) -> int:
        return x + 1

    pipeline = ctx.input("mouse") | ctx.pipe(work) | ctx.stream("video", on_timing=records.append)
    for sample in (10, 20, 30):
        pipeline.feed("mouse", sample, at_ms=1_700_000_000_000 + sample)
    return pipeline


def test_each_record_is_one_structlog_event_with_the_flat_fields(
    ctx: rxstream.Context, timing_log: Path
) -> None:
    """Each record is one JSON line, event '[timing:video]', carrying exactly record.fields()."""
    records: list[TimingRecord] = []
    assert logged_pipeline(ctx, records).drive(frames=3) == [11, 21, 31]
    assert len(records) == 3

    lines = [json.loads(line) for line in timing_log.read_text(encoding="utf-8").splitlines()]
    timing = [entry for entry in lines if str(entry.get("event", "")).startswith("[timing:")]
    assert len(timing) == len(records)
    for entry, record in zip(timing, records, strict=True):
        assert entry["event"] == "[timing:video]"
        assert entry["level"] == "info"
        stamp_at = datetime.fromisoformat(entry["timestamp"])
        assert stamp_at.utcoffset() == timedelta(0)
        flat = {k: v for k, v in entry.items() if k not in ("event", "level", "timestamp")}
        assert flat == record.fields()
        assert flat["hops"] == "mouse,work,video"
        assert flat["input_at_ms"] == record.input_at_ms
    assert [e["input_seq"] for e in timing] == [1, 2, 3]
    assert [e["input_at_ms"] for e in timing] == [1_700_000_000_010 + k * 10 for k in range(3)]
    # the log reads back into the same records, to the logged precision
    assert load(timing_log).records == tuple(TimingRecord.from_fields(r.fields()) for r in records)


def test_jq_selects_the_timing_lines(ctx: rxstream.Context, timing_log: Path) -> None:
    """jq reads the log: one timing line per input_seq, flat hop fields addressable by name."""
    if shutil.which("jq") is None:
        pytest.skip("jq not installed")
    records: list[TimingRecord] = []
    logged_pipeline(ctx, records).drive(frames=3)
    seqs = subprocess.run(
        ["jq", "-c", 'select(.event=="[timing:video]") | .input_seq', str(timing_log)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert seqs.stdout == "1\n2\n3\n"
    computes = subprocess.run(
        ["jq", "-c", 'select(.event=="[timing:video]") | .["work.compute_ms"]', str(timing_log)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert [json.loads(v) for v in computes.stdout.splitlines()] == [
        round(r.hops[1].compute_ms, 3) for r in records
    ]


def test_configure_logging_again_closes_the_previous_file(timing_log: Path, tmp_path: Path) -> None:
    """A second configure_logging closes the first one's file and writes to the new one."""
    first = timing_emit._opened
    assert first is not None
    assert not first.closed
    other = tmp_path / "other.jsonl"
    configure_logging(path=other)
    assert first.closed
    assert timing_emit._opened is not None
    assert Path(timing_emit._opened.name) == other


# --- 5. hooks and capture_timing --------------------------------------------------------------


def test_on_timing_and_capture_get_the_same_frozen_record(ctx: rxstream.Context) -> None:
    """The on_timing hook and capture_timing receive the very same frozen TimingRecord."""
    hooked: list[TimingRecord] = []
    pipeline = ctx.input("mouse") | ctx.stream("video", on_timing=hooked.append)
    pipeline.feed("mouse", "a", at_ms=5)
    with capture_timing() as captured:
        pipeline.drive(frames=1)
    assert len(hooked) == 1
    assert len(captured) == 1
    assert captured[0] is hooked[0]
    record = hooked[0]
    assert isinstance(record, TimingRecord)
    assert (record.stream, record.input_seq, record.input_at_ms) == ("video", 1, 5)
    assert isinstance(record.hops, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.total_ms = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.hops[0].wait_ms = 0.0  # type: ignore[misc]


def test_capture_timing_collects_from_any_pipeline_and_thread() -> None:
    """capture_timing sees records of a driven and a threaded pipeline, and none after it."""
    driven_ctx = rxstream.Context(transport=MemoryTransport())
    threaded_ctx = rxstream.Context(transport=MemoryTransport())
    driven = driven_ctx.input("keys") | driven_ctx.stream("text")
    threaded = threaded_ctx.input("mouse") | threaded_ctx.stream("video")
    with capture_timing() as captured:
        driven.feed("keys", "k")
        driven.drive(frames=1)
        threaded.start()
        try:
            threaded.feed("mouse", (1, 2))
            wait_until(lambda: len(captured) == 2, "the threaded record")
        finally:
            threaded.stop()
    assert sorted((r.stream, r.input_seq) for r in captured) == [("text", 1), ("video", 1)]
    driven.feed("keys", "l")
    driven.drive(frames=1)
    assert len(captured) == 2


def test_a_raising_hook_fails_the_run_naming_the_sink(ctx: rxstream.Context) -> None:
    """An on_timing hook that raises ends the run with a PipelineError naming the sink."""

    def hook(record: TimingRecord) -> None:
        raise RuntimeError("hook broke")

    pipeline = ctx.input("mouse") | ctx.pipe(double) | ctx.stream("video", on_timing=hook)
    pipeline.feed("mouse", 1)
    with pytest.raises(
        PipelineError,
        match=r"^stage 'video' failed on item pts=0 input_seq=1: RuntimeError: hook broke$",
    ) as caught:
        pipeline.drive(frames=1)
    assert caught.value.stage == "video"
    assert caught.value.input_seq == 1
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_a_raising_hook_fails_a_threaded_run_naming_the_sink(ctx: rxstream.Context) -> None:
    """Threaded, a raising on_timing hook surfaces from wait() as a PipelineError on the sink."""

    def hook(record: TimingRecord) -> None:
        raise RuntimeError("hook broke")

    pipeline = ctx.input("mouse") | ctx.stream("video", on_timing=hook)
    pipeline.start()
    try:
        pipeline.feed("mouse", 1)
        with pytest.raises(PipelineError, match=r"^stage 'video' failed") as caught:
            assert pipeline.wait(timeout=10)
    finally:
        pipeline.stop()
    assert caught.value.stage == "video"


# --- 6. timing off ----------------------------------------------------------------------------


def test_timing_off_makes_no_records_and_no_stamps() -> None:
    """Context(timing=False): no records, no hook calls, no .in/.out stamps; items still flow."""
    ctx = rxstream.Context(transport=MemoryTransport(), timing=False)
    ctx.doc("control", defaults={"prompt": "a"})
    hooked: list[TimingRecord] = []

    def pipe(batch: list[int]) -> int:
        return sum(batch)

    fed = (
        ctx.input("mouse")
        | ctx.window(count=2)
        | ctx.pipe(pipe)
        | ctx.pace(fps=24)
        | ctx.stream("video", on_timing=hooked.append)
    )
    steered = (
        ctx.source(steered_frames(ctx), name="frames")
        | ctx.pipe(double)
        | ctx.stream("preview", on_timing=hooked.append)
    )
    for sample in (1, 2, 3, 4):
        fed.feed("mouse", sample)
    with capture_timing() as captured:
        video = fed.drive(frames=4, items=True)
        preview = steered.drive(frames=5, items=True)
    assert [i.payload for i in video if not i.metadata.idle] == [3, 7]
    assert [i.metadata.input_seq for i in video if not i.metadata.idle] == [2, 4]
    assert [i.payload for i in preview] == [0, 2, 4, 6, 8]
    assert [i.metadata.cutover for i in preview] == [False, False, False, True, False]
    assert captured == []
    assert hooked == []
    for item in video + preview:
        assert not any(hop.endswith((".in", ".out")) for hop, _ in item.metadata.timeline)


# --- 7. ctx.input -----------------------------------------------------------------------------


def test_input_seq_counts_from_1_per_stream(ctx: rxstream.Context) -> None:
    """Each input stream numbers its samples from 1, independently of the others."""
    pipeline = [ctx.input("mouse"), ctx.input("keys")] | ctx.merge() | ctx.stream("video")
    assert [pipeline.feed("mouse", f"m{k}") for k in range(3)] == [1, 2, 3]
    assert [pipeline.feed("keys", f"k{k}") for k in range(2)] == [1, 2]
    out = pipeline.drive(frames=3, items=True)
    seqs = sorted((i.payload, i.metadata.input_seq) for i in out)
    assert seqs == [("k0", 1), ("k1", 2), ("m0", 1), ("m1", 2), ("m2", 3)]


def test_input_at_ms_is_the_clients_else_wall_clock_and_recv_is_first(
    ctx: rxstream.Context,
) -> None:
    """at_ms is kept as given, else the receive wall-clock ms; 'input.recv' is the first stamp."""
    pipeline = ctx.input("mouse") | ctx.stream("video")
    pipeline.feed("mouse", "given", at_ms=1234)
    before = int(time.time() * 1000)
    pipeline.feed("mouse", "own")
    after = int(time.time() * 1000)
    given_item, own_item = pipeline.drive(frames=2, items=True)
    assert given_item.metadata.input_at_ms == 1234
    assert before <= own_item.metadata.input_at_ms <= after
    for item in (given_item, own_item):
        hops = [hop for hop, _ in item.metadata.timeline]
        assert hops == ["input.recv", "mouse.in", "mouse.out", "video.in", "video.out"]
        times = [t for _, t in item.metadata.timeline]
        assert times == sorted(times)


def test_feed_of_an_unknown_name_names_the_inputs(ctx: rxstream.Context) -> None:
    """pipeline.feed of a name that is no input raises LookupError listing the inputs."""
    pipeline = [ctx.input("mouse"), ctx.input("keys")] | ctx.merge() | ctx.stream("video")
    expected = r"^no input stream 'pen' in this pipeline; its inputs are: keys, mouse$"
    with pytest.raises(LookupError, match=expected):
        pipeline.feed("pen", 1)
    with pytest.raises(LookupError, match=r"^no input stream 'video' in this pipeline; its in"):
        pipeline.feed("video", 1)


def test_max_items_refuses_the_next_sample_and_nothing_else(ctx: rxstream.Context) -> None:
    """ClientStreamLimits(max_items=3) refuses the 4th sample; other streams and the run go on."""
    pipeline = (
        [
            ctx.input("mouse", ClientStreamLimits(max_items=3)),
            ctx.input("keys"),
        ]
        | ctx.merge()
        | ctx.stream("video")
    )
    assert [pipeline.feed("mouse", k) for k in range(3)] == [1, 2, 3]
    message = (
        r"^client stream 'mouse' is limited to 3 items per session; "
        r"this sample would bring it to 4 items$"
    )
    with pytest.raises(ClientStreamLimitExceeded, match=message) as caught:
        pipeline.feed("mouse", 3)
    assert (caught.value.stream, caught.value.bound, caught.value.unit) == ("mouse", 3, "items")
    assert caught.value.amount == 4
    with pytest.raises(ClientStreamLimitExceeded):
        pipeline.feed("mouse", 4)
    assert pipeline.feed("keys", "k") == 1
    out = pipeline.drive(frames=5, items=True)
    assert sorted((str(i.payload), i.metadata.input_seq) for i in out) == [
        ("0", 1),
        ("1", 2),
        ("2", 3),
        ("k", 1),
    ]


def audio_seconds(chunk: bytes) -> float:
    """Seconds of 16 kHz, one byte a sample audio in ``chunk``."""
    return len(chunk) / 16000


def seconds_limit(bound: int) -> ClientStreamLimits:
    """A limit of ``bound`` seconds of audio, each chunk measured by its length."""
    return ClientStreamLimits(max_items=bound, item_size=audio_seconds, unit="seconds")


def test_an_audio_stream_is_cut_off_exactly_at_its_bound_in_seconds(
    ctx: rxstream.Context,
) -> None:
    """A 1 s audio limit takes four 0.25 s chunks (exactly 1 s) and refuses the fifth."""
    pipeline = ctx.input("audio", seconds_limit(1)) | ctx.stream("out")
    chunk = bytes(4000)
    assert [pipeline.feed("audio", chunk) for _ in range(4)] == [1, 2, 3, 4]
    message = (
        r"^client stream 'audio' is limited to 1 seconds per session; "
        r"this sample would bring it to 1\.25 seconds$"
    )
    with pytest.raises(ClientStreamLimitExceeded, match=message):
        pipeline.feed("audio", chunk)
    with pytest.raises(ClientStreamLimitExceeded):
        pipeline.feed("audio", bytes(1))  # even the smallest chunk is past the bound
    assert len(pipeline.drive(frames=10)) == 4


def test_an_audio_stream_in_tenths_of_a_second_is_cut_off_exactly_at_its_bound(
    ctx: rxstream.Context,
) -> None:
    """A 3 s audio limit takes thirty 0.1 s chunks (exactly 3 s) and refuses the 31st."""
    pipeline = ctx.input("audio", seconds_limit(3)) | ctx.stream("out")
    chunk = bytes(1600)
    for expected_seq in range(1, 31):
        assert pipeline.feed("audio", chunk) == expected_seq
    with pytest.raises(ClientStreamLimitExceeded, match=r"would bring it to 3\.1 seconds$"):
        pipeline.feed("audio", chunk)


def test_feed_overflow_keeps_the_newest_samples(ctx: rxstream.Context) -> None:
    """With capacity=2, five samples fed before a drive leave the newest two to run."""
    pipeline = ctx.input("mouse", capacity=2) | ctx.stream("video")
    assert [pipeline.feed("mouse", k) for k in range(5)] == [1, 2, 3, 4, 5]
    out = pipeline.drive(frames=10, items=True)
    assert [(i.payload, i.metadata.input_seq) for i in out] == [(3, 4), (4, 5)]


def test_feed_overflow_drops_are_counted_as_latest(ctx: rxstream.Context) -> None:
    """With capacity=2, five samples fed before a drive count three drops, reason 'latest'."""
    pipeline = ctx.input("mouse", capacity=2) | ctx.stream("video")
    for k in range(5):
        pipeline.feed("mouse", k)
    pipeline.drive(frames=10)
    assert pipeline.statistics()["mouse"].dropped == {"latest": 3}


def test_feed_overflow_during_a_run_is_counted_as_latest(ctx: rxstream.Context) -> None:
    """Samples dropped from a full feed queue while a run is on are counted, reason 'latest'."""
    release = threading.Event()

    def gate(x: int) -> int:
        if not release.wait(10):
            raise TimeoutError("the test never released the stage")
        return x

    pipeline = ctx.input("mouse", capacity=2) | ctx.pipe(gate, capacity=1) | ctx.stream("video")
    pipeline.start()
    try:
        pipeline.feed("mouse", 0)
        wait_until(lambda: pipeline.statistics()["gate"].items_in == 1, "gate to hold 0")
        pipeline.feed("mouse", 1)
        wait_until(lambda: pipeline.statistics()["gate"].inbox_depth == 1, "1 in gate's inbox")
        pipeline.feed("mouse", 2)
        # the input thread pulled 2 and is stuck handing it to gate's full inbox
        wait_until(lambda: pipeline.statistics()["mouse"].items_in == 3, "the input to pull 2")
        for k in range(3, 8):  # five samples into a queue of two: the oldest three go
            pipeline.feed("mouse", k)
        release.set()
        wait_until(lambda: pipeline.statistics()["video"].items_out == 5, "five items out")
    finally:
        release.set()
        pipeline.stop()
    transport = cast(MemoryTransport, ctx.transport)
    assert transport.payloads("video") == [0, 1, 2, 6, 7]
    assert [i.metadata.input_seq for i in transport.items("video")] == [1, 2, 3, 7, 8]
    assert pipeline.statistics()["mouse"].dropped == {"latest": 3}


# --- 9. fields() / from_fields round trip ---------------------------------------------------

hop_names = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters=".,"),
    min_size=1,
    max_size=12,
)
millis = st.integers(min_value=-(10**9), max_value=10**9).map(lambda n: n / 1000)
hops = st.lists(hop_names, unique=True, max_size=8).flatmap(
    lambda names: st.tuples(
        *(st.builds(HopTiming, st.just(name), millis, millis, millis) for name in names)
    )
)
timing_records = st.builds(
    TimingRecord,
    stream=st.text(),
    input_seq=st.integers(min_value=0, max_value=2**53),
    input_at_ms=st.integers(min_value=0, max_value=2**53),
    cutover=st.booleans(),
    prompt_generation=st.integers(min_value=0, max_value=2**31),
    pts=st.integers(min_value=0, max_value=2**53),
    origin=st.text(),
    total_ms=millis,
    from_client_ms=st.none() | millis,
    hops=hops,
    run=st.text(alphabet="0123456789abcdef", max_size=12),
)


@given(timing_records)
def test_fields_and_from_fields_round_trip(record: TimingRecord) -> None:
    """from_fields(fields()) gives the record back, also through a JSON line."""
    flat = record.fields()
    assert TimingRecord.from_fields(flat) == record
    assert TimingRecord.from_fields(json.loads(json.dumps(flat))) == record
    assert flat["hops"] == ",".join(hop.name for hop in record.hops)
    held = sum(1 for hop in record.hops if hop.hold_ms)
    assert len(flat) == 11 + 2 * len(record.hops) + held  # <hop>.hold_ms only for a hold


def test_two_input_streams_into_one_sink_each_get_their_records(ctx: rxstream.Context) -> None:
    """input_seq counts per stream: the sink reports each stream's inputs, not only the highest."""
    pipeline = [ctx.input("pointer"), ctx.input("keys")] | ctx.merge() | ctx.stream("out")
    with capture_timing() as records:
        pipeline.feed("pointer", (0.1, 0.1), at_ms=1)
        pipeline.feed("pointer", (0.2, 0.2), at_ms=2)
        pipeline.feed("pointer", (0.3, 0.3), at_ms=3)
        pipeline.feed("keys", "a", at_ms=4)
        pipeline.feed("keys", "b", at_ms=5)
        pipeline.drive(frames=5)
    got = sorted((r.hops[0].name, r.input_seq) for r in records)
    assert got == [("keys", 1), ("keys", 2), ("pointer", 1), ("pointer", 2), ("pointer", 3)]
