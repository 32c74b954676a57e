"""GPU-true stage time and NVTX ranges, on the mocked CUDA API (its GPU clock and counters)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import rxstream
from rxstream.ipc._cudafake import FakeCudaApi
from rxstream.timing import (
    HopTiming,
    RunMetrics,
    TimingRecord,
    format_summary,
    load,
    plot,
    summarize,
)
from rxstream.timing._gpu import NVTX_ENV, POOL, GpuClock
from rxstream.timing._otel import span_times
from rxstream.timing._record import fold
from rxstream.transport import MemoryTransport

KERNEL_MS = 7.5
"""The fake GPU time of one call of the CUDA stage below."""


def hops_of(record: TimingRecord) -> dict[str, HopTiming]:
    return {hop.name: hop for hop in record.hops}


def gpu_pipeline(
    api: FakeCudaApi, records: list[TimingRecord], *, fail_on: int | None = None
) -> rxstream.Pipeline:
    """mouse | denoise (cuda, one fake kernel of KERNEL_MS a call) | post (cpu) | video."""
    ctx = rxstream.Context(transport=MemoryTransport(keep=None), cuda_api=api)

    def denoise(x: int) -> int:
        if x == fail_on:
            raise ValueError(f"bad sample {x}")
        api.kernel(KERNEL_MS)  # queued on the stream: the host does not wait for it
        return x

    def post(x: int) -> int:
        return x + 1

    return (
        ctx.input("mouse")
        | ctx.pipe(denoise, device="cuda", on_error="skip")
        | ctx.pipe(post, device="cpu")
        | ctx.stream("video", on_timing=records.append)
    )


def test_a_cuda_stage_reports_its_kernel_time_as_gpu_ms_without_a_synchronize() -> None:
    """A CUDA stage's hop gets the fake kernels' GPU time as gpu_ms, compute_ms stays its host
    stamps' (the launch), and nothing synchronizes."""
    api = FakeCudaApi()
    records: list[TimingRecord] = []
    pipeline = gpu_pipeline(api, records)
    for sample in (1, 2, 3):
        pipeline.feed("mouse", sample)
    items = pipeline.drive(frames=3, items=True)

    assert [r.input_seq for r in records] == [1, 2, 3]
    for record, item in zip(records, items, strict=True):
        denoise = hops_of(record)["denoise"]
        assert denoise.gpu
        assert denoise.gpu_ms == KERNEL_MS
        stamps = dict(item.metadata.timeline)
        assert denoise.compute_ms == (stamps["denoise.out"] - stamps["denoise.in"]) * 1e3
        assert record.fields()["denoise.gpu_ms"] == KERNEL_MS
    assert api.calls["synchronize"] == 0
    assert api.calls["kernel"] == 3


def test_a_cpu_stage_has_no_gpu_ms_and_its_line_is_as_before() -> None:
    """A CPU stage's hop has no gpu_ms (None, not timed), and a record of a run without CUDA
    stages writes no gpu_ms key: old lines and new ones read the same."""
    api = FakeCudaApi()
    records: list[TimingRecord] = []
    pipeline = gpu_pipeline(api, records)
    pipeline.feed("mouse", 1)
    pipeline.drive(frames=1)
    (record,) = records
    post = hops_of(record)["post"]
    assert (post.gpu, post.gpu_ms) == (False, None)
    assert [key for key in record.fields() if "gpu" in key] == ["denoise.gpu_ms"]

    ctx = rxstream.Context(transport=MemoryTransport(keep=None), cuda_api=FakeCudaApi())
    plain: list[TimingRecord] = []
    cpu_only = ctx.input("mouse") | ctx.pipe(abs) | ctx.stream("video", on_timing=plain.append)
    cpu_only.feed("mouse", 1)
    cpu_only.drive(frames=1)
    (line,) = (r.fields() for r in plain)
    assert not [key for key in line if "gpu" in key]
    back = TimingRecord.from_fields(line).hops
    assert [(h.name, h.gpu, h.gpu_ms) for h in back] == [
        (h.name, False, None) for h in plain[0].hops
    ]


def test_gpu_ms_reads_back_from_a_line_null_included() -> None:
    """A line's <hop>.gpu_ms reads back as the hop's gpu_ms (null: timed but unresolved)."""
    hops = (
        HopTiming("denoise", 0.5, 0.1, 0.0, 7.25, True),
        HopTiming("vae", 0.2, 0.1, 0.0, None, True),
        HopTiming("post", 0.1, 0.3),
    )
    record = TimingRecord("video", 1, 0, False, 0, 0, "input.recv", 1.3, None, hops)
    line = record.fields()
    assert (line["denoise.gpu_ms"], line["vae.gpu_ms"]) == (7.25, None)
    assert "post.gpu_ms" not in line
    assert TimingRecord.from_fields(line).hops == hops


def test_work_not_done_at_the_fold_is_unresolved_and_never_waited_on() -> None:
    """Events whose work is not done when the record is folded give gpu_ms None, counted as
    unresolved, with no synchronize and no wait."""
    api = FakeCudaApi()
    api.stalled = True  # the GPU is behind: every event recorded stays pending
    records: list[TimingRecord] = []
    pipeline = gpu_pipeline(api, records)
    pipeline.feed("mouse", 1)
    pipeline.feed("mouse", 2)
    pipeline.drive(frames=2)

    assert [hops_of(r)["denoise"].gpu_ms for r in records] == [None, None]
    assert [r.fields()["denoise.gpu_ms"] for r in records] == [None, None]
    clock = pipeline._run.gpu_clock  # type: ignore[union-attr]
    assert clock is not None
    assert (clock.unresolved, clock.resolved) == (2, 0)
    assert api.calls["record_current"] == 4  # both calls were timed: two events each
    assert api.calls["synchronize"] == 0
    assert api.calls["elapsed_ms"] == 0  # asked query() only


def test_events_come_from_a_pool_and_a_reused_pair_is_unresolved() -> None:
    """A stage's events are made once (a pool of POOL pairs), not per call; a call whose pair
    a later call took again resolves to None (counted), the latest to its GPU time."""
    api = FakeCudaApi()
    clock = GpuClock(api)
    timer = clock.timer("denoise", "cuda:0")
    assert timer is not None
    times: list[tuple[float, float]] = []

    def kernel() -> None:
        api.kernel(2.0)

    call = timer.wrap(kernel)
    for _ in range(POOL + 1):
        began = rxstream.item.now()
        call()
        times.append((began, rxstream.item.now()))
    assert api.calls["timing_event"] == 2 * POOL
    assert clock.gpu_ms("denoise", *times[0]) is None  # its pair was recorded again
    assert clock.gpu_ms("denoise", *times[-1]) == 2.0
    assert (clock.unresolved, clock.resolved) == (1, 1)


@pytest.mark.slow
def test_a_threaded_cuda_stage_reports_gpu_ms() -> None:
    """In a threaded run (a stage per thread, not fused), a CUDA stage's hop gets its fake
    kernels' GPU time, resolved on the sink's thread; nothing synchronizes."""
    api = FakeCudaApi()
    records: list[TimingRecord] = []
    got = threading.Event()

    def on_timing(record: TimingRecord) -> None:
        records.append(record)
        if len(records) == 2:
            got.set()

    ctx = rxstream.Context(transport=MemoryTransport(keep=None), cuda_api=api)

    def denoise(x: int) -> int:
        api.kernel(KERNEL_MS)
        return x

    pipeline = (
        ctx.input("mouse")
        | ctx.pipe(denoise, device="cuda:0")
        | ctx.stream("video", on_timing=on_timing)
    )
    pipeline.start()
    try:
        pipeline.feed("mouse", 1)
        pipeline.feed("mouse", 2)
        assert got.wait(timeout=30)
    finally:
        pipeline.stop()
    assert [hops_of(r)["denoise"].gpu_ms for r in records] == [KERNEL_MS, KERNEL_MS]
    assert api.calls["synchronize"] == 0


def test_nvtx_ranges_are_pushed_and_popped_in_pairs_even_when_a_stage_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RXSTREAM_NVTX=1: every stage call is one NVTX range named '<stage> input_seq=<n>',
    popped after the call, also when the stage raised."""
    monkeypatch.setenv(NVTX_ENV, "1")
    api = FakeCudaApi()
    records: list[TimingRecord] = []
    pipeline = gpu_pipeline(api, records, fail_on=2)
    for sample in (1, 2, 3):
        pipeline.feed("mouse", sample)
    pipeline.drive(frames=3)

    assert api.nvtx == [
        ("push", "denoise input_seq=1"),
        ("pop", "denoise input_seq=1"),
        ("push", "post input_seq=1"),
        ("pop", "post input_seq=1"),
        ("push", "denoise input_seq=2"),
        ("pop", "denoise input_seq=2"),  # it raised: popped all the same
        ("push", "denoise input_seq=3"),
        ("pop", "denoise input_seq=3"),
        ("push", "post input_seq=3"),
        ("pop", "post input_seq=3"),
    ]
    assert [r.input_seq for r in records] == [1, 3]


def test_nvtx_is_off_by_default_and_a_cpu_stage_call_is_not_wrapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without RXSTREAM_NVTX no range is pushed, and a CPU stage's shell has no timer (its
    function is called as it is)."""
    monkeypatch.delenv(NVTX_ENV, raising=False)
    api = FakeCudaApi()
    records: list[TimingRecord] = []
    pipeline = gpu_pipeline(api, records)
    pipeline.feed("mouse", 1)
    pipeline.drive(frames=1)
    assert api.calls["nvtx_push"] == 0
    shells = {shell.name: shell for shell in pipeline._run.shells.values()}  # type: ignore[union-attr]
    assert shells["post"].gpu is None
    assert shells["denoise"].gpu is not None


def test_the_summary_json_and_plot_show_gpu_ms_of_a_cuda_hop(tmp_path: Path) -> None:
    """`rxstream timing`'s table and JSON give a CUDA hop's gpu_ms percentiles beside its
    compute and count its unresolved records; a CPU hop shows '-'; the plot draws it."""

    def record(seq: int, gpu_ms: float | None) -> TimingRecord:
        hops = (HopTiming("denoise", 0.5, 0.1, 0.0, gpu_ms, True), HopTiming("post", 0.1, 0.3))
        return TimingRecord("video", seq, 0, False, 0, 0, "input.recv", 1.0, None, hops)

    records = [record(1, 4.0), record(2, 6.0), record(3, None)]
    summary = summarize(records)
    denoise, post = summary.hops
    assert (denoise.gpu_ms[50], denoise.gpu_unresolved, post.gpu) == (5.0, 1, False)
    text = format_summary(summary)
    header, first, second = text.splitlines()[1:4]
    assert header.index("gpu p50") > header.index("compute p50")
    assert first.split()[0] == "denoise"
    assert first.split()[-3] == "5.00"
    assert second.split()[-3:] == ["-", "-", "-"]
    assert "gpu_ms unresolved (work not done when folded): denoise 1 of 3" in text
    hops = summary.to_json()["hops"]
    assert hops[0]["gpu_ms"]["p50"] == 5.0
    assert hops[0]["gpu_unresolved"] == 1
    assert "gpu_ms" not in hops[1]
    plot(summary, records, tmp_path / "timing.png")
    assert (tmp_path / "timing.png").stat().st_size > 0


def gpu_record() -> TimingRecord:
    """A record of a resolved CUDA hop, an unresolved one and a CPU hop."""
    hops = (
        HopTiming("denoise", 0.5, 0.25, 0.0, 7.5, True),
        HopTiming("vae", 0.25, 0.25, 0.0, None, True),
        HopTiming("video", 0.25, 1.0),
    )
    return TimingRecord("video", 3, 0, False, 0, 0, "input.recv", 2.5, None, hops, run="r1")


def test_a_hop_span_carries_gpu_ms_where_it_resolved() -> None:
    """A CUDA hop's OTel span has rxstream.gpu_ms (its record's value); an unresolved one and
    a CPU hop's have none."""
    _, *children = span_times(gpu_record(), 1_800_000_000_000_000_000)
    attributes = {name: attrs for name, _, _, attrs in children}
    assert attributes["denoise"]["rxstream.gpu_ms"] == 7.5
    assert "rxstream.gpu_ms" not in attributes["vae"]
    assert "rxstream.gpu_ms" not in attributes["video"]


def test_prometheus_has_a_gpu_histogram_of_the_resolved_cuda_hops() -> None:
    """rxstream_hop_gpu_seconds counts each resolved CUDA hop (in seconds), no other hop."""
    metrics = RunMetrics()
    metrics.record(gpu_record())
    metrics.record(gpu_record())
    found = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.text().decode())
        for s in family.samples
    }
    denoise = frozenset({("stream", "video"), ("stage", "denoise")})
    assert found[("rxstream_hop_gpu_seconds_count", denoise)] == 2
    assert found[("rxstream_hop_gpu_seconds_sum", denoise)] == pytest.approx(2 * 7.5e-3)
    stages = {
        dict(labels)["stage"] for name, labels in found if name.startswith("rxstream_hop_gpu")
    }
    assert stages == {"denoise"}


@pytest.mark.parametrize("stalled", [False, True])
def test_a_cuda_stage_s_gpu_ms_travels_to_another_rank_s_fold_as_a_stamp(stalled: bool) -> None:
    """An item leaving its rank's process takes a <stage>.gpu stamp resolved then (NaN when
    its work was not done); the other rank's fold, without that stage's events, reads it as
    the hop's gpu_ms (None for NaN), and its wait and compute are as without the stamp."""
    api = FakeCudaApi()
    api.stalled = stalled
    clock = GpuClock(api)
    timer = clock.timer("denoise", "cuda")
    assert timer is not None
    call = timer.wrap(lambda: api.kernel(KERNEL_MS))
    began = rxstream.item.now()
    call()
    ended = rxstream.item.now()
    timeline = (("input.recv", began - 0.002), ("denoise.in", began), ("denoise.out", ended))
    stamps = clock.stamps(timeline)
    assert stamps[0] == "denoise.gpu"
    assert clock.stamps((*timeline, ("denoise.gpu", 1.0))) == ()  # stamped once
    pairs = tuple(zip(stamps[::2], stamps[1::2], strict=True))
    after = (*timeline, *pairs, ("video.in", ended + 0.001), ("video.out", ended + 0.002))
    carried = fold("video", rxstream.PipelineMetadata(input_seq=1, timeline=after), 0.0)
    plain = fold("video", rxstream.PipelineMetadata(input_seq=1, timeline=timeline), 0.0)
    denoise = hops_of(carried)["denoise"]
    assert denoise.gpu
    assert denoise.gpu_ms == (None if stalled else KERNEL_MS)
    assert denoise.compute_ms == hops_of(plain)["denoise"].compute_ms
    assert hops_of(carried)["video"].wait_ms == pytest.approx(1.0)
    assert api.calls["synchronize"] == 0


@pytest.mark.slow
def test_a_rank_0_cuda_stage_s_gpu_ms_is_in_rank_1_s_records(tmp_path: Path) -> None:
    """Two rank processes: a CUDA stage on rank 0, the sink on rank 1; the records rank 1's
    sink folds have the stage's gpu_ms (its fake kernel's), carried in the item's stamps."""
    log = tmp_path / "timing.jsonl"
    app = str(Path(__file__).resolve().parent / "apps" / "gpu_timing_app.py")
    rxstream.launch(app, ranks=2, frames=20, timeout=60, log=log)
    records = [r for r in load(log).records if not r.self_test]
    assert records
    for record in records:
        denoise = hops_of(record)["denoise"]
        assert denoise.gpu
        assert denoise.gpu_ms == KERNEL_MS
        assert not hops_of(record)["post"].gpu


@pytest.mark.parametrize(("env", "option", "ranges"), [("", True, True), ("1", False, False)])
def test_context_nvtx_turns_ranges_on_or_off_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: str, option: bool, ranges: bool
) -> None:
    """Context(nvtx=True) makes NVTX ranges without RXSTREAM_NVTX; nvtx=False keeps them off
    under RXSTREAM_NVTX=1."""
    monkeypatch.setenv(NVTX_ENV, env)
    api = FakeCudaApi()
    ctx = rxstream.Context(transport=MemoryTransport(keep=None), cuda_api=api, nvtx=option)
    pipeline = ctx.input("mouse") | ctx.pipe(abs, name="norm") | ctx.stream("video")
    pipeline.feed("mouse", -1)
    assert pipeline.drive(frames=1) == [1]
    assert api.nvtx == (
        [("push", "norm input_seq=1"), ("pop", "norm input_seq=1")] if ranges else []
    )
