"""Ranks: in-process boundaries through the ring, and SPMD launch across processes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest

import rxstream
from rxstream import LaunchResult, PipelineError
from rxstream.ipc import ShmRing
from rxstream.ranks._boundary import Boundary
from rxstream.transport import MemoryTransport

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "tests" / "apps" / "ranks_app.py")


def shm_segments() -> set[str]:
    """This process's shared-memory segments that exist now (rings are named ``rxs_<pid>_…``
    by the process that makes them: rank 0, here; /dev/shm is shared with everything else)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"rxs_{os.getpid()}_")}


def rank_processes() -> list[str]:
    """Live rank processes this test process spawned (their command lines)."""
    out = subprocess.run(["ps", "-eo", "ppid=,args="], capture_output=True, text=True, check=True)
    me = str(os.getpid())
    return [
        line
        for line in out.stdout.splitlines()
        if line.split(maxsplit=1)[0] == me and "spawn_main" in line
    ]


@pytest.fixture
def clean_host() -> Iterator[None]:
    """Fail a test that leaves a shared-memory segment or a rank process behind."""
    before = shm_segments()
    yield
    deadline = time.monotonic() + 3
    while (shm_segments() - before or rank_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shm_segments() - before == set()
    assert rank_processes() == []


def test_in_process_ranks_cross_a_ring_with_metadata_intact(
    ctx: rxstream.Context, clean_host: None
) -> None:
    """Stages on two ranks in one process hand items over the ring, in order, stamped once."""
    pipeline = (
        ctx.source([np.full((3, 3), i, dtype=np.int32) for i in range(40)], name="src")
        | ctx.pipe(lambda x: x * 2, name="a")
        | ctx.pipe(lambda x: x + 1, name="b", rank=1)
        | ctx.stream("out")
    )
    assert pipeline.plan.world == 2
    assert [pipeline.plan.edge_name(u, d) for u, d in pipeline.plan.boundaries] == ["a>b"]
    pipeline.start()
    assert pipeline.wait(timeout=30)
    transport = ctx.transport
    assert isinstance(transport, MemoryTransport)
    items = transport.items("out")
    assert [int(i.payload[0, 0]) for i in items] == [2 * i + 1 for i in range(40)]
    assert [i.metadata.pts for i in items] == list(range(40))
    hops = [hop for hop, _ in items[0].metadata.timeline]
    assert hops == ["src.in", "src.out", "a.in", "a.out", "a>b.in", "a>b.out", "b.in", "b.out"]


def test_drive_ignores_ranks(ctx: rxstream.Context) -> None:
    """drive() runs every rank's stages in one thread: same outputs, no ring."""
    pipeline = ctx.source(range(5)) | ctx.pipe(lambda x: x * 3, rank=1)
    assert pipeline.drive(frames=5) == [0, 3, 6, 9, 12]


def test_launch_runs_two_rank_processes(clean_host: None) -> None:
    """launch() spawns rank 1, runs each rank's stages, stops at the frame count."""
    result = rxstream.launch(APP, ranks=2, frames=20, timeout=60)
    assert result.ranks == 2
    assert result.egressed >= 20
    assert set(result.statistics) == {0, 1}
    assert list(result.statistics[0]) == ["frames", "prepare"]
    assert list(result.statistics[1]) == ["work", "record", "video"]
    assert result.statistics[1]["video"].items_out == result.egressed


@pytest.fixture
def made_rings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the rings this process creates during the test."""
    made: list[str] = []
    create = ShmRing.create

    def creating(*, slots: int, slot_bytes: int) -> ShmRing:
        ring = create(slots=slots, slot_bytes=slot_bytes)
        made.append(ring.name)
        return ring

    monkeypatch.setattr(ShmRing, "create", creating)
    return made


def in_shm(names: list[str]) -> list[str]:
    """Those of ``names`` that are in /dev/shm now."""
    return [name for name in names if os.path.exists(f"/dev/shm/{name}")]


@pytest.mark.slow
def test_rings_lose_their_names_once_every_rank_attached(
    made_rings: list[str], clean_host: None
) -> None:
    """While a launch runs, its ring (rank 0 -> rank 1) has no /dev/shm entry any more."""
    seen: list[list[str]] = []
    rxstream.launch(APP, ranks=2, timeout=1.5, on_status=lambda _: seen.append(in_shm(made_rings)))
    assert len(made_rings) == 1  # the boundary's ring, made by this process
    assert made_rings[0].startswith(f"rxs_{os.getpid()}_")  # a test can tell its own
    assert seen  # looked at while the ranks ran
    assert all(names == [] for names in seen)


def test_in_process_rings_have_no_name_while_they_run(
    ctx: rxstream.Context, made_rings: list[str]
) -> None:
    """A run with every rank in this process keeps no /dev/shm entry for its ring."""
    pipeline = (
        ctx.source(itertools.count, name="src") | ctx.pipe(lambda x: x, rank=1) | ctx.stream("out")
    )
    pipeline.start()
    try:
        transport = ctx.transport
        assert isinstance(transport, MemoryTransport)
        deadline = time.monotonic() + 30
        while not transport.counts.get("out") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert transport.counts.get("out")  # items crossed the ring
        assert len(made_rings) == 1
        assert in_shm(made_rings) == []
    finally:
        pipeline.stop()


@pytest.mark.slow
def test_stop_ends_a_launch_with_every_rank_s_statistics(clean_host: None) -> None:
    """Setting stop (as a signal handler does) ends the run; each rank reports, none fails."""
    stop = threading.Event()
    result = rxstream.launch(APP, ranks=2, timeout=60, on_status=lambda _: stop.set(), stop=stop)
    assert set(result.statistics) == {0, 1}
    assert result.statistics[1]["video"].items_out == result.egressed > 0


def test_stop_before_the_ranks_are_ready_runs_nothing(clean_host: None) -> None:
    """A launch whose stop is already set returns at once, with no statistics and no error."""
    stop = threading.Event()
    stop.set()
    result = rxstream.launch(APP, ranks=2, timeout=60, stop=stop)
    assert (result.ranks, dict(result.statistics), result.egressed) == (2, {}, 0)


def test_a_finite_launch_delivers_everything_before_it_ends(clean_host: None) -> None:
    """When the source ends, every rank finishes its items before the launch returns."""
    result = rxstream.launch(APP, ranks=2, config={"mode": "finite"}, timeout=60)
    assert result.egressed == 30
    assert result.statistics[1]["video"].items_out == 30
    assert all(s.dropped_total == 0 for r in result.statistics.values() for s in r.values())


def test_frames_larger_than_a_default_slot_cross_with_the_apps_ring_spec(
    clean_host: None,
) -> None:
    """ctx.ring_spec set in build(ctx) sizes every boundary's slots: 9.4 MB frames cross."""
    result = rxstream.launch(APP, ranks=2, config={"mode": "big"}, timeout=60)
    assert result.egressed == 6  # rank 1 checked every byte of every frame


def test_a_frame_too_large_for_the_slots_names_the_setting(clean_host: None) -> None:
    """Without it the run fails naming the boundary, both sizes and what to set."""
    with pytest.raises(
        PipelineError,
        match=(
            r"stage 'prepare' failed on item pts=0 input_seq=0: PayloadTooLarge: a framed item of "
            r"9,437,\d+ bytes does not fit a slot of boundary 'prepare>work' \(8,388,608 bytes\); "
            r"give boundaries larger slots where the pipeline is built: "
            r"ctx.ring_spec = rxstream.RingSpec\(slot_bytes=10 << 20\)"
        ),
    ):
        rxstream.launch(APP, ranks=2, config={"mode": "big_default"}, timeout=60)


def test_ring_spec_rules_name_the_field_and_value() -> None:
    """RingSpec and ctx.ring_spec refuse what a ring cannot be, naming field, rule and value."""
    assert rxstream.RingSpec() == rxstream.RingSpec(slots=4, slot_bytes=8 << 20)
    with pytest.raises(ValueError, match=r"^slots must be between 1 and 1024, got 0$"):
        rxstream.RingSpec(slots=0)
    with pytest.raises(ValueError, match=r"^slot_bytes must be >= 256, got 100$"):
        rxstream.RingSpec(slot_bytes=100)
    with pytest.raises(TypeError, match=r"^slot_bytes must be an int, got '8M' \(str\)$"):
        rxstream.RingSpec(slot_bytes="8M")  # type: ignore[arg-type]
    ctx = rxstream.Context()
    with pytest.raises(
        TypeError, match=r"^ctx.ring_spec must be a rxstream.RingSpec, got 33554432"
    ):
        ctx.ring_spec = 32 << 20  # type: ignore[assignment]
    ctx.ring_spec = rxstream.RingSpec(slots=2, slot_bytes=1 << 20)
    pipeline = ctx.source([np.zeros(1 << 19, np.uint8)] * 5) | ctx.pipe(lambda x: x, rank=1)
    pipeline.start()
    assert pipeline.wait(timeout=30)
    assert pipeline._run is not None
    rings = [cast(ShmRing, r.ring) for r in pipeline._run.boundaries.values()]
    assert [(ring._slots, ring._slot_bytes) for ring in rings] == [(2, 1 << 20)]


@pytest.mark.slow
def test_a_rank_without_stages_ends_at_once_and_leaves_the_rings_alone(clean_host: None) -> None:
    """Launched on 3 ranks, a 2-rank app's rank 2 reports done at once, and the run ends by
    itself when the source's 30 frames are delivered (no timeout: it must end on its own).

    Rank 2 opens no ring: a rank closes the rings it opened when it ends, which would close
    ranks 0 and 1's boundary for them.
    """
    results: list[LaunchResult] = []
    launcher = threading.Thread(
        target=lambda: results.append(rxstream.launch(APP, ranks=3, config={"mode": "finite"})),
        daemon=True,
    )
    launcher.start()
    launcher.join(60)  # a guard against a run that never ends, not a measure
    assert not launcher.is_alive(), "the launch did not end by itself"
    (result,) = results
    assert (result.ranks, result.egressed) == (3, 30)
    assert result.statistics[2] == {}
    assert result.statistics[1]["video"].items_out == 30


def test_launch_refuses_too_few_ranks() -> None:
    """An app that places stages on rank 1 cannot run on one rank."""
    with pytest.raises(rxstream.PipelineStateError, match=r"on 2 ranks, but only 1 were"):
        rxstream.launch(APP, ranks=1, frames=5)


def test_a_rank_that_dies_ends_the_run_naming_it(tmp_path: Path, clean_host: None) -> None:
    """A rank process that exits mid-run fails the launch naming the rank within 1 s."""
    died = tmp_path / "died"
    with pytest.raises(PipelineError, match=r"^stage 'rank 1' failed: RuntimeError: rank 1 died"):
        rxstream.launch(APP, ranks=2, config={"mode": "die", "died": str(died)}, timeout=60)
    noticed = time.monotonic()
    assert noticed - float(died.read_text()) < 1.0  # the bound the design sets


def test_a_rank_that_raises_ends_the_run_naming_stage_and_rank(clean_host: None) -> None:
    """A stage failing on rank 1 surfaces on the controller with the stage's own error."""
    with pytest.raises(PipelineError, match=r"^stage 'rank 1' failed: .*stage 'work' failed"):
        rxstream.launch(APP, ranks=2, config={"mode": "raise"}, timeout=60)


def test_an_unpicklable_payload_names_the_stage_and_type(clean_host: None) -> None:
    """A payload that cannot cross a boundary fails the run naming the stage and the type."""
    with pytest.raises(PipelineError, match=r"stage 'prepare' failed .*'generator'"):
        rxstream.launch(APP, ranks=2, config={"mode": "unpicklable"}, timeout=60)


def test_doc_and_generations_reach_the_other_rank(tmp_path: Path, clean_host: None) -> None:
    """A steer on rank 0 reaches rank 1: no old generation after the new one, new prompt read."""
    out = tmp_path / "frames.jsonl"
    rxstream.launch(APP, ranks=2, frames=40, config={"mode": "steer", "out": str(out)}, timeout=60)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    generations = [row["generation"] for row in rows]
    assert generations == sorted(generations)
    assert 1 in generations
    first_new = generations.index(1)
    assert {row["prompt"] for row in rows[first_new:]} == {"b"}
    assert "prepare>work.in" in rows[0]["hops"]


@pytest.mark.slow
def test_cli_run_prints_per_rank_statistics(clean_host: None) -> None:
    """`rxstream run APP --ranks 2 --frames N` runs and prints each rank's statistics."""
    done = subprocess.run(
        [sys.executable, "-m", "rxstream", "run", APP, "--ranks", "2", "--frames", "10"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "rank 0" in done.stdout
    assert "rank 1" in done.stdout
    assert "items egressed on 2 rank(s)" in done.stdout


def test_cuda_tensors_cross_through_the_bridge_and_are_released(clean_host: None) -> None:
    """CUDA tensors cross as slot refs (mock CUDA): values intact, ordered, slots released."""
    torch = pytest.importorskip("torch")
    from rxstream.ipc._cuda import FakeCudaApi

    api = FakeCudaApi()
    ctx = rxstream.Context(transport=MemoryTransport(keep=1), cuda_api=api)

    def frames() -> Iterator[object]:
        for index in range(12):
            yield api.to_device(torch.full((4,), float(index)))

    sums: list[float] = []
    pipeline = (
        ctx.source(frames, name="src")
        | ctx.pipe(lambda t: t, name="a")
        | ctx.pipe(lambda t: float(t.sum()), name="b", rank=1)
        | ctx.tap(sums.append)
        | ctx.stream("out")
    )
    pipeline.start()
    try:
        deadline = time.monotonic() + 20
        while len(sums) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        (edge,) = pipeline._run.boundaries.values()  # type: ignore[union-attr]
        boundary = cast(Boundary, edge)
        assert boundary.cuda is not None
        import gc

        gc.collect()
        assert boundary.cuda.held == 0  # every opened tensor died and was given back
    finally:
        pipeline.stop()
    assert sums == [4.0 * i for i in range(12)]
    calls = [call for call, _ in api.log]
    # the boundary's slot pool: 8 slots shared and opened once, each frame copied into a slot
    assert calls.count("share") == calls.count("open") == calls.count("allocate") == 8
    assert calls.count("copy") == calls.count("read") == 12
    # the consumer's stream waited on the producer's event before each read
    assert all(calls.index("wait") < calls.index("read") for _ in range(1))


@pytest.mark.slow
def test_rank_0_starts_its_sources_once_every_rank_is_ready(
    tmp_path: Path, clean_host: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank slow to build holds rank 0's sources back until it can take their items."""
    monkeypatch.setenv("RXSTREAM_TEST_REPORT", str(tmp_path))
    app = str(Path(__file__).parent / "apps" / "slow_rank_app.py")
    result = rxstream.launch(app, ranks=2, timeout=60)
    assert result.egressed == 10
    built = float((tmp_path / "rank1_built").read_text())
    pulled = float((tmp_path / "first_pull").read_text())
    assert pulled >= built


@pytest.mark.parametrize("timing", [True, False])
def test_small_plain_payloads_cross_a_ring_with_their_metadata(
    timing: bool, clean_host: None
) -> None:
    """Numbers, strings, bytes, None and pickled objects cross as they were, metadata intact."""
    ctx = rxstream.Context(timing=timing)
    payloads: list[object] = [0, -7, 3.5, "text", "é" * 100, b"\x00\xff", None, b"", 2**80]
    payloads += [(1, "a"), {"k": [1, 2]}, b"x" * 70_000]  # not marshalled: framed by the ring
    pipeline = (
        ctx.input("client")
        | ctx.pipe(lambda x: x, name="a")
        | ctx.pipe(lambda x: x, name="b", rank=1)
        | ctx.stream("out")
    )
    pipeline.start()
    for at_ms, sample in enumerate(payloads, start=1000):
        pipeline.feed("client", sample, at_ms=at_ms)
    transport = ctx.transport
    assert isinstance(transport, MemoryTransport)
    for _ in range(500):
        if len(transport.items("out")) == len(payloads):
            break
        time.sleep(0.01)
    pipeline.stop()
    items = transport.items("out")
    assert [item.payload for item in items] == payloads
    assert [item.metadata.input_seq for item in items] == list(range(1, len(payloads) + 1))
    assert [item.metadata.input_at_ms for item in items] == list(range(1000, 1000 + len(payloads)))
    hops = [hop for hop, _ in items[0].metadata.timeline]
    expected = ["input.recv", "client.in", "client.out", "a.in", "a.out", "a>b.in", "a>b.out"]
    assert hops == ([*expected, "b.in", "b.out"] if timing else [])


def test_ranks_other_than_the_controller_replicate_and_catch_up() -> None:
    """A launched rank > 0 runs as a replica (its readers catch up); rank 0 steers."""
    from rxstream.ranks._rank import rank_run

    ctx = rxstream.Context()
    pipeline = (
        ctx.source([1, 2], name="src") | ctx.pipe(lambda x: x, rank=1) | ctx.stream("out", rank=1)
    )
    runs = [rank_run(pipeline, rank, {}, {}) for rank in (0, 1)]
    try:
        assert [run.replica for run in runs] == [False, True]
    finally:
        for run in runs:
            assert run.stop(5) == []
