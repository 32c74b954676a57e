"""A hung or slow stage is named, live and in the summary; stalls and idle repeats counted apart.

The watchdog tests block a stage on a ``threading.Event`` the test holds, with a small bound
(``ctx.busy_limit_s``), and wait on the statistics the watchdog writes; the CLI tests run
``python -m rxstream run`` on two ranks (``tests/apps/hang_app.py``) and read its output.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
import torch

import rxstream
from rxstream._exceptions import RingClosed
from rxstream._kernel._stats import StageCounters, StageStatistics, summarize
from rxstream.cli._run import _StatusLine
from rxstream.ipc._cuda import FakeCudaApi
from rxstream.ranks._cudaxing import CudaCrossing
from rxstream.runtime._thread import charge_stalls_to
from rxstream.runtime._watchdog import BUSY_ENV
from rxstream.transport import MemoryTransport

APPS = Path(__file__).parent / "apps"
ROOT = Path(__file__).parent.parent
WAIT_S = 20.0


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (a state the engine exposes), failing after ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _numbers() -> Iterator[int]:
    yield from itertools.count()


def _held_at(release: threading.Event, at: object) -> Callable[[Any], Any]:
    """A stage function that blocks on ``release`` at the item ``at``."""

    def decode(x: Any) -> Any:
        if x == at:
            release.wait()
        return x

    return decode


def test_a_stage_busy_past_its_bound_is_warned_once_naming_it_and_its_item(
    ctx: rxstream.Context,
) -> None:
    """A stage busy on one item past ctx.busy_limit_s is warned about once (the stage, the
    item's pts and input_seq, how long), shows in its live statistics, and stays counted."""
    release = threading.Event()
    ctx.busy_limit_s = 0.05
    pipeline = (
        ctx.source(range(6), name="frames")
        | ctx.pipe(_held_at(release, 3), name="decode")
        | ctx.stream("out")
    )
    with structlog.testing.capture_logs() as logs:
        pipeline.start()
        try:
            _until(lambda: pipeline.statistics()["decode"].overdue_now, "decode overdue")
            live = pipeline.statistics()["decode"]
            assert live.busy_on == "pts=3, input_seq=0"
            assert live.busy_s > 0
            release.set()
            assert pipeline.wait(WAIT_S)
        finally:
            release.set()
            pipeline.stop()
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert len(warned) == 1
    assert re.match(
        r"^stage 'decode' has been busy on one item \(pts=3, input_seq=0\) for \d+ ms "
        r"\(the bound is 50 ms, RXSTREAM_BUSY_S or ctx\.busy_limit_s\)$",
        warned[0]["event"],
    )
    done = pipeline.statistics()["decode"]
    assert (done.overdue, done.overdue_now, done.longest_on) == (1, False, "pts=3, input_seq=0")
    assert done.longest_limit_s == 0.05
    assert done.longest_s > 0.05
    assert pipeline.statistics()["frames"].overdue == 0


def test_the_watchdog_keeps_no_item_alive(ctx: rxstream.Context) -> None:
    """The watchdog remembers the item a stage was busy on by its id: once the stage let go
    of it (a frame, a ring slot's lease), nothing of the watchdog's holds it, run or stopped."""
    release = threading.Event()
    ctx.busy_limit_s = 0.05
    made: list[weakref.ref[np.ndarray]] = []

    def frames() -> Iterator[np.ndarray]:
        frame = np.zeros((64, 64, 3), dtype=np.uint8)
        made.append(weakref.ref(frame))
        yield frame

    def decode(frame: np.ndarray) -> int:
        release.wait()
        return 0  # the frame is not carried on

    pipeline = ctx.source(frames, name="frames") | ctx.pipe(decode, name="decode")
    pipeline = pipeline | ctx.stream("out")
    pipeline.start()
    try:
        _until(lambda: pipeline.statistics()["decode"].overdue_now, "decode overdue")
        release.set()
        assert pipeline.wait(WAIT_S)
    finally:
        release.set()
        pipeline.stop()
    gc.collect()
    assert made
    assert made[0]() is None


def test_a_hung_stage_fused_onto_a_thread_is_named_with_its_owner(ctx: rxstream.Context) -> None:
    """A fuse=True stage runs on its upstream's thread: the warning names that thread's stage
    and the fused ones, one of which the item may be held by."""
    release = threading.Event()
    ctx.busy_limit_s = 0.05
    pipeline = (
        ctx.source(range(3), name="frames")
        | ctx.pipe(lambda x: x, name="prepare")
        | ctx.pipe(_held_at(release, 1), name="decode", fuse=True)
        | ctx.stream("out")
    )
    with structlog.testing.capture_logs() as logs:
        pipeline.start()
        try:
            _until(lambda: pipeline.statistics()["prepare"].overdue_now, "prepare overdue")
        finally:
            release.set()
            pipeline.stop()
    (warned,) = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert re.match(
        r"^stage 'prepare' \(or 'decode', fused onto its thread\) has been busy on one item "
        r"\(pts=1, input_seq=0\) for \d+ ms \(the bound is 50 ms, RXSTREAM_BUSY_S or "
        r"ctx\.busy_limit_s\)$",
        warned,
    )


def test_a_stage_stalled_on_a_full_inbox_is_not_counted_busy(ctx: rxstream.Context) -> None:
    """The stages upstream of a hung one, blocked handing items on, are stalled, not busy:
    the watchdog names only the hung stage."""
    release = threading.Event()
    ctx.busy_limit_s = 0.05
    pipeline = (
        ctx.source(_numbers, name="frames")
        | ctx.pipe(lambda x: x, name="prepare")
        | ctx.pipe(_held_at(release, 0), name="decode")
        | ctx.stream("out")
    )
    pipeline.start()
    try:

        def backed_up() -> bool:
            stats = pipeline.statistics()
            return stats["decode"].busy_s > 0.5 and stats["prepare"].inbox_depth == 2

        _until(backed_up, "the hung stage's upstream backed up")
        stats = pipeline.statistics()
        assert stats["decode"].overdue == 1
        assert (stats["prepare"].overdue, stats["frames"].overdue) == (0, 0)
        assert (stats["prepare"].busy_s, stats["frames"].busy_s) == (0.0, 0.0)
    finally:
        release.set()
        pipeline.stop()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ring", "cuda"])
def test_a_put_on_a_full_ring_is_the_upstreams_stall_not_its_work(kind: str) -> None:
    """A source blocked on the full ring (or CUDA slot pool) to a hung stage on another rank
    is stalled, not busy, and its wait counts as stalled_s (not work_s), also when the stop
    ends the wait."""
    api = FakeCudaApi() if kind == "cuda" else None
    ctx = rxstream.Context(transport=MemoryTransport(keep=4), cuda_api=api)

    def frame() -> Any:
        array = np.zeros(4)
        return array if api is None else api.to_device(torch.from_numpy(array))

    release = threading.Event()
    ctx.busy_limit_s = 0.05
    pipeline = (
        ctx.source(frame, name="frames", rank=0)
        | ctx.pipe(lambda a: float(a.sum()), name="decode", rank=1)
        | ctx.pipe(_held_at(release, 0.0), name="hold", rank=1)
        | ctx.stream("out", rank=1)
    )
    pipeline.start()
    try:
        _until(lambda: pipeline.statistics()["hold"].busy_s > 0.5, "the stage held")
        live = pipeline.statistics()
        assert (live["frames"].overdue, live["decode"].overdue) == (0, 0)
    finally:
        pipeline.stop()  # the source's put is woken by the close: its wait is a stall
        release.set()
    source = pipeline.statistics()["frames"]
    assert source.stalled_s > source.work_s


def test_a_wait_for_a_cuda_slot_is_the_writers_stall_not_its_work() -> None:
    """A writer waiting for a CUDA pool slot to come back (every slot in flight) is marked
    stalled for the watchdog, and its wait is charged as stalled_s."""
    counters = StageCounters("frames", "source")
    crossing = CudaCrossing(FakeCudaApi(), multiprocessing.Pipe(duplex=False), local=False)
    outcome: list[object] = []

    def writer() -> None:
        charge_stalls_to(counters)
        counters.current = "the item"
        with contextlib.suppress(RingClosed):  # the close ends it (the pool then sees it)
            crossing._wait_release()
        outcome.append(counters.current)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        _until(lambda: counters.current is None, "the writer marked stalled")
    finally:
        crossing.close()
        thread.join(WAIT_S)
    assert outcome == ["the item"]  # the mark ends with the wait
    assert counters.stalled_s > 0


def test_busy_limit_s_refuses_what_is_not_a_positive_number(ctx: rxstream.Context) -> None:
    """ctx.busy_limit_s takes seconds > 0 or None, and says what it got otherwise."""
    with pytest.raises(
        TypeError,
        match=r"^ctx\.busy_limit_s must be a number of seconds or "
        r"None, got '1' \(str\)$",
    ):
        ctx.busy_limit_s = "1"  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"^ctx\.busy_limit_s must be > 0 seconds, got 0$"):
        ctx.busy_limit_s = 0
    ctx.busy_limit_s = 2
    assert ctx.busy_limit_s == 2.0


def test_the_busy_bound_from_the_environment_is_checked_at_start(
    ctx: rxstream.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RXSTREAM_BUSY_S that is not seconds > 0 stops start() with a message naming it."""
    monkeypatch.setenv(BUSY_ENV, "soon")
    pipeline = ctx.source(range(3)) | ctx.stream("out")
    with pytest.raises(
        ValueError, match=r"^RXSTREAM_BUSY_S must be a number of seconds > 0, got 'soon'$"
    ):
        pipeline.start()
    pipeline.stop()


def _stage(name: str, kind: str = "pipe", **fields: object) -> StageStatistics:
    return StageStatistics(name=name, kind=kind, items_in=4, items_out=4, **fields)  # type: ignore[arg-type]


def test_the_summary_names_the_stage_that_set_the_rate() -> None:
    """The end-of-run summary names the busiest stage, its rank, items a second and share busy."""
    statistics = {
        0: {"frames": _stage("frames", "source", work_s=0.01, stalled_s=0.99)},
        1: {
            "decode": _stage("decode", work_s=0.99, wait_s=0.01),
            "video": _stage("video", "stream", work_s=0.001, wait_s=0.999),
        },
    }
    assert summarize(statistics) == ["rate set by 'decode' (rank 1): 4.0 items/s, busy 99%"]


def test_the_summary_says_when_a_source_set_the_rate() -> None:
    """A source whose pulls take its time (a clock, a camera) is named as the source."""
    statistics = {0: {"clock": _stage("clock", "source", work_s=1.0)}}
    assert summarize(statistics) == [
        "rate set by the source 'clock': 4.0 items/s, its pulls 100% of its time"
    ]


def test_the_summary_says_when_no_stage_set_the_rate() -> None:
    """With every stage mostly waiting (a pace, the input set the rate), none is blamed."""
    statistics = {0: {"decode": _stage("decode", work_s=0.1, wait_s=0.9)}}
    assert summarize(statistics) == [
        "no stage set the rate: the busiest, 'decode', was busy 10% (4.0 items/s)"
    ]


def test_the_summary_names_a_stage_busy_on_one_item_past_its_bound() -> None:
    """A stage the watchdog found busy past its bound is named with its item and how long."""
    hung = _stage(
        "decode",
        work_s=0.5,
        busy_s=5.2,
        wait_s=0.1,
        overdue=1,
        overdue_now=True,
        longest_s=5.2,
        longest_on="pts=12, input_seq=40",
        longest_limit_s=1.0,
    )
    assert summarize({0: {"decode": hung}})[0] == (
        "stage 'decode' was busy on one item (pts=12, input_seq=40) for 5.2 s, past its bound "
        "of 1.0 s; still on it when the run stopped"
    )


def test_the_status_line_shows_every_ranks_part_in_a_narrow_terminal() -> None:
    """Cut to 80 columns, the status line keeps each rank's part, a busy stage first."""
    long = {f"stage_number_{i}": _stage(f"stage_number_{i}", inbox_capacity=2) for i in range(4)}
    hung = _stage(
        "decode", inbox_capacity=2, overdue_now=True, busy_s=5.2, busy_on="pts=12, input_seq=40"
    )
    line = _StatusLine(sys.stderr).line({0: long, 1: {**long, "decode": hung}}, 80)
    assert len(line) <= 80
    assert line.startswith("[0] stage_number_0 ")
    assert " | [1] decode BUSY 5.2 s pts=12 | stage_" in line


def test_a_short_ranks_part_leaves_its_room_to_the_others() -> None:
    """A rank whose part is short takes only what it needs; the others share the rest."""
    long = {f"stage_number_{i}": _stage(f"stage_number_{i}", inbox_capacity=2) for i in range(4)}
    line = _StatusLine(sys.stderr).line({0: {"a": _stage("a")}, 1: long}, 80)
    assert len(line) == 80
    assert re.match(r"^\[0\] a \S+ fps \| \[1\] stage_number_0 ", line)


def test_the_status_line_is_whole_when_it_fits() -> None:
    """A line that fits the terminal is shown whole, each rank named in full."""
    line = _StatusLine(sys.stderr).line({0: {"a": _stage("a")}, 1: {"b": _stage("b")}}, 80)
    assert re.match(r"^\[rank 0\] a \S+ fps \| \[rank 1\] b \S+ fps$", line)


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rxstream", "run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        check=False,
    )


@pytest.mark.slow
def test_a_hung_stage_on_rank_1_is_named_live_and_in_the_summary() -> None:
    """Two ranks, rank 1's stage hung: a warning line names it at once, the summary names it
    and the rate it set, its upstream's ring wait is stalled time, and the idle repeats pace
    made of the frozen frame are counted apart from the new frames."""
    done = _run_cli(
        str(APPS / "hang_app.py"),
        "--ranks",
        "2",
        "--frames",
        "40",
        "--set",
        "mode=hang",
        env={BUSY_ENV: "0.3"},
    )
    assert done.returncode == 1, done.stderr
    assert re.match(
        r"^rxstream run: stage 'decode' \(rank 1\) hung: still busy on one item \(pts=4, "
        r"input_seq=0\) when the run stopped, for \d\.\d s, past its bound of 300 ms$",
        done.stderr.splitlines()[-1],
    )
    warned = [line for line in done.stderr.splitlines() if "has been busy on one item" in line]
    assert len(warned) == 1, done.stderr
    assert re.match(
        r"^\S+ \[warning\s*\] stage 'decode' \(rank 1\) has been busy on one item "
        r"\(pts=4, input_seq=0\) for \d+ ms \(the bound is 300 ms, RXSTREAM_BUSY_S or "
        r"ctx\.busy_limit_s\)$",
        warned[0],
    )
    out = done.stdout.splitlines()
    assert out[0] == (
        "40 items egressed on 2 rank(s); 36 of them idle repeats (pace's last frame again, "
        "no new one in time), 4 new"
    )
    assert re.match(
        r"^stage 'decode' \(rank 1\) was busy on one item \(pts=4, input_seq=0\) for \d\.\d s, "
        r"past its bound of 300 ms; still on it when the run stopped$",
        out[-2],
    )
    assert re.match(r"^rate set by 'decode' \(rank 1\): \d+\.\d items/s, busy \d+%$", out[-1])
    source = next(line.split() for line in out if line.startswith("frames "))
    work, stalled = float(source[7]), float(source[8])
    assert stalled > work


@pytest.mark.slow
def test_a_hung_stage_is_said_live_on_stderr_with_a_timing_log_too(tmp_path: Path) -> None:
    """With ``--log`` (rank 1 has the sink, so it logs to the file) the busy warning is still
    said on stderr as it happens, and written to the log as well."""
    log = tmp_path / "timing.jsonl"
    done = _run_cli(
        *(str(APPS / "hang_app.py"), "--ranks", "2", "--frames", "40", "--set", "mode=hang"),
        *("--log", str(log)),
        env={BUSY_ENV: "0.3"},
    )
    assert done.returncode == 1, done.stderr  # the run stopped with the stage still hung
    warned = [line for line in done.stderr.splitlines() if "has been busy on one item" in line]
    assert len(warned) == 1, done.stderr
    assert "stage 'decode' (rank 1) has been busy on one item (pts=4, input_seq=0)" in warned[0]
    logged = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert any("busy on one item" in event for event in logged)


@pytest.mark.slow
def test_launch_result_counts_idle_repeats_apart() -> None:
    """LaunchResult.repeats says how many of the egressed frames were pace's idle repeats."""
    result = rxstream.launch(
        str(APPS / "hang_app.py"), 2, frames=30, config={"mode": "hang", "busy": 0.3}
    )
    assert (result.egressed, result.egressed - result.repeats) == (30, 4)
    assert result.statistics[1]["video"].repeats == result.repeats
