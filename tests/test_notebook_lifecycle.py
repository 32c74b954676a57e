"""A notebook user's lifecycle: wait() after stop/drive, a failed state, abandoned pipelines,
two pipelines on one stream, interrupts, readable reprs."""

from __future__ import annotations

import gc
import itertools
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

import pytest
import structlog.testing

import rxstream
from rxstream import PipelineError, PipelineStateError
from rxstream.notebook import StatsView, background, stop_all
from rxstream.runtime._handoff import TOKENS_MAX
from rxstream.testing import live_threads


def endless() -> Iterator[int]:
    yield from itertools.count()


def fail_at(n: int) -> Callable[[], Iterator[int]]:
    def bad() -> Iterator[int]:
        for x in itertools.count():
            if x == n:
                raise ValueError(f"bad frame {x}")
            yield x

    return bad


def failed(pipeline: rxstream.Pipeline) -> rxstream.Pipeline:
    """``pipeline`` with its threaded run failed (its threads ended)."""
    pipeline.start()
    done = threading.Event()
    pipeline._over.on_done(done.set)
    assert done.wait(10)
    return pipeline


def in_wait(frame: FrameType | None) -> bool:
    """Whether ``frame`` is a lock wait inside ``Pipeline.wait``."""
    if frame is None or "threading" not in frame.f_code.co_filename:
        return False
    while frame is not None:
        if frame.f_code is rxstream.Pipeline.wait.__code__:
            return True
        frame = frame.f_back
    return False


def test_wait_after_stop_returns_at_once(ctx: rxstream.Context) -> None:
    """wait() after stop() returns True (the run is over) instead of blocking forever."""
    pipeline = ctx.source(endless) | ctx.stream("out")
    pipeline.start()
    pipeline.stop()
    assert pipeline.wait(timeout=10) is True
    assert pipeline.state == "stopped"


def test_wait_returns_when_another_thread_stops_the_run(ctx: rxstream.Context) -> None:
    """A wait() under way returns once stop() is called from elsewhere."""
    pipeline = ctx.source(endless) | ctx.stream("out")
    pipeline.start()
    stopper = threading.Timer(0.0, pipeline.stop)
    stopper.start()
    assert pipeline.wait(timeout=10) is True
    stopper.join()


def test_wait_after_drive_is_a_state_error(ctx: rxstream.Context) -> None:
    """wait() after drive() (nothing ran on threads) says so instead of hanging."""
    pipeline = ctx.source(endless) | ctx.stream("out")
    assert pipeline.drive(frames=2) == [0, 1]
    with pytest.raises(PipelineStateError, match=r"^wait\(\) after drive\(\)"):
        pipeline.wait(timeout=10)


def test_a_failed_run_is_not_running(ctx: rxstream.Context) -> None:
    """After a source fails, running is False and the state is 'failed', with its error."""
    pipeline = failed(ctx.source(fail_at(5)) | ctx.stream("out"))
    assert pipeline.running is False
    assert pipeline.state == "failed"
    assert isinstance(pipeline.error, PipelineError)
    pipeline.stop()
    assert pipeline.state == "stopped"


def test_start_and_drive_after_a_failure_name_it(ctx: rxstream.Context) -> None:
    """start()/drive() on a failed run name the failure and what to do, not 'running'."""
    pipeline = failed(ctx.source(fail_at(5), name="bad") | ctx.stream("out"))
    for call in (pipeline.start, lambda: pipeline.drive(frames=1)):
        with pytest.raises(
            PipelineStateError,
            match=r"after the run failed: stage 'bad' failed .*bad frame 5; stop\(\) it "
            r"\(or wait\(\), which raises the error\) first",
        ):
            call()
    with pytest.raises(PipelineError, match="bad frame 5"):
        pipeline.wait(timeout=10)
    assert pipeline.drive(frames=2) == [0, 1]  # once waited (stopped), it runs again


def test_a_completed_run_restarts_without_a_stop(ctx: rxstream.Context) -> None:
    """A run whose source ended is 'completed'; start() ends it and starts afresh."""
    pipeline = ctx.source([1, 2, 3]) | ctx.stream("out")
    pipeline.start()
    done = threading.Event()
    pipeline._over.on_done(done.set)
    assert done.wait(10)
    assert pipeline.state == "completed"
    assert not pipeline.running
    pipeline.start()
    assert pipeline.wait(timeout=10)
    assert pipeline.statistics()["out"].items_out == 3


def test_an_abandoned_pipeline_stops_rebuilding(ctx: rxstream.Context) -> None:
    """A doc write rebuilds the bound stage of live pipelines only, not of collected ones."""
    doc = ctx.doc("model", defaults={"k": 1})
    builds: list[int] = []

    def make(snapshot: rxstream.doc.Snapshot) -> Callable[[int], int]:
        builds.append(snapshot["k"])
        return lambda x: x * snapshot["k"]

    pipeline = None
    for _ in range(3):  # a cell run three times: each run leaves the last pipeline behind
        pipeline = ctx.source(endless) | doc.bind(make, [doc.desired.k]) | ctx.stream("out")
        pipeline.drive(frames=2)
    assert builds == [1, 1, 1]
    gc.collect()
    doc.set(k=5)
    assert builds == [1, 1, 1, 5]  # once: for the one pipeline still reachable
    assert pipeline is not None
    assert pipeline.drive(frames=1) == [10]


def test_two_pipelines_may_not_feed_one_stream(ctx: rxstream.Context) -> None:
    """Starting a pipeline whose stream another running one feeds is refused, named."""
    first = ctx.source(endless, name="a") | ctx.stream("render")
    second = ctx.source(endless, name="b") | ctx.stream("render")
    first.start()
    try:
        with pytest.raises(
            PipelineStateError,
            match=r"^start\(\): stream 'render' is already fed by a running pipeline of this "
            r"context \(<Pipeline a \| render>\); stop\(\) that one first",
        ):
            second.start()
        assert "rxstream:b" not in [t.name for t in live_threads()]
    finally:
        first.stop()
    second.start()  # once the first stopped
    second.stop()


class Closes(rxstream.transport.MemoryTransport):
    """A memory transport that counts its closes."""

    closes = 0

    def close(self) -> None:
        self.closes += 1
        super().close()


def test_a_finished_pipelines_late_stop_leaves_the_running_ones_transport_open() -> None:
    """A completed run's stop() (a late wait(), stop_all()) does not close what another opened."""
    transport = Closes()
    ctx = rxstream.Context(transport=transport)
    first = ctx.source(lambda: iter(range(3)), name="a") | ctx.stream("video")
    first.start()
    assert first.wait(timeout=30)  # completed: stopped, the transport closed once
    assert transport.closes == 1
    again = ctx.source(lambda: iter(range(3)), name="c") | ctx.stream("video")
    again.start()
    until(lambda: again.state == "completed", "the second run completed")
    second = ctx.source(endless, name="b") | ctx.stream("video")
    second.start()  # stops `again` (over, not stopped: it held the transport) before it opens
    assert again.state == "stopped"
    closes = transport.closes
    again.stop()
    first.stop()
    assert (transport.closes, second.running) == (closes, True)
    second.stop()
    assert transport.closes == closes + 1


def test_stop_all_stops_a_started_pipeline_a_cell_lost_the_name_of(
    ctx: rxstream.Context,
) -> None:
    """stop_all() stops pipelines started with start(), not only background() runs."""
    (ctx.source(endless, name="a") | ctx.stream("video")).start()  # a cell; its name is lost
    pipeline = ctx.source(endless, name="a") | ctx.stream("video")  # the cell run again
    with pytest.raises(PipelineStateError, match=r"stop_all\(\) stops every started pipeline"):
        pipeline.start()
    stop_all()
    assert "running=0" in repr(ctx)
    pipeline.start()  # the name the cell holds now starts
    pipeline.stop()


def test_an_interrupt_during_wait_stops_the_run(ctx: rxstream.Context) -> None:
    """Ctrl-C (KeyboardInterrupt) in wait() stops the run, as background() and run() do."""
    pipeline = ctx.source(endless) | ctx.stream("out")
    pipeline.start()
    main = threading.get_ident()

    def interrupt() -> None:
        while not in_wait(sys._current_frames().get(main)):  # the main thread blocks in it
            time.sleep(0.001)
        signal.pthread_kill(main, signal.SIGINT)  # as Ctrl-C (it wakes a blocked wait)

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        pipeline.wait()
    interrupter.join()
    assert pipeline.state == "stopped"
    assert live_threads() == []


# --- rxstream.notebook: background runs and the statistics view ---------------------------


@pytest.fixture
def no_background_left() -> Iterator[None]:
    """The test ends with its background runs stopped, whatever it asserted."""
    yield
    stop_all()


def test_a_failed_background_run_says_so_and_is_printed(
    ctx: rxstream.Context, capsys: pytest.CaptureFixture[str], no_background_left: None
) -> None:
    """A background run whose source fails reads failed (handle, view) and prints the error."""
    pipeline = ctx.source(fail_at(5), name="bad") | ctx.stream("out")
    bg = background(pipeline)
    done = threading.Event()
    pipeline._over.on_done(done.set)  # after the handle's own callback
    assert done.wait(10)
    assert not bg.running
    assert bg.state.startswith("failed: stage 'bad' failed")
    assert repr(bg) == f"<Background {pipeline!r} {bg.state}>"
    view = StatsView(pipeline, interval=60.0)
    try:
        caption = "<caption>&lt;Pipeline bad | out&gt;: failed: stage &#x27;bad&#x27; failed"
        assert caption in view.html()
    finally:
        view.close()
    printed = capsys.readouterr().err
    assert "the background run of <Pipeline bad | out> failed: stage 'bad' failed" in printed
    assert "bad frame 5" in printed


def test_background_again_replaces_the_previous_run(
    ctx: rxstream.Context, no_background_left: None
) -> None:
    """Re-running a background(...) cell stops the previous run of the same stream first."""
    handles = [
        background(ctx.source(endless, name=f"src{i}") | ctx.stream("render")) for i in range(3)
    ]
    assert [h.running for h in handles] == [False, False, True]
    assert [h.state for h in handles[:2]] == ["stopped", "stopped"]
    names = sorted(t.name for t in live_threads())
    assert names == ["rxstream:render", "rxstream:src2", "rxstream:watchdog"]
    again = background(handles[2].pipeline)  # the same pipeline: restarted, not refused
    assert again.running
    assert sorted(t.name for t in live_threads()) == names  # one run, not two


def test_background_again_after_a_failure_starts_afresh(
    ctx: rxstream.Context, capsys: pytest.CaptureFixture[str], no_background_left: None
) -> None:
    """background(pipeline) on a pipeline whose background run failed starts it again."""
    pipeline = ctx.source(fail_at(5), name="bad") | ctx.stream("out")
    done = threading.Event()
    background(pipeline)
    pipeline._over.on_done(done.set)
    assert done.wait(10)
    bg = background(pipeline)
    assert bg.state in ("running", "failed: " + str(pipeline.error))
    with pytest.raises(PipelineError, match="bad frame 5"):
        bg.hold(10)
    assert "failed" in capsys.readouterr().err  # the first failure, printed as it happened


# --- live statistics ----------------------------------------------------------------------


def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after 10 s."""
    deadline = time.monotonic() + 10.0
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


@pytest.mark.parametrize("capacity", [8, TOKENS_MAX + 1], ids=["c-queues", "deque"])
def test_a_busy_stage_s_work_reads_live(ctx: rxstream.Context, capacity: int) -> None:
    """Under a backlog that never ends, the busy stage's work_s grows as items leave it."""
    gate = threading.Event()

    def slow(x: int) -> int:
        gate.wait(10)  # the inbox fills first: every delivery after the first is a backlog
        time.sleep(0.001)  # the stage's work: slower than the source
        return x

    pipeline = (
        ctx.source(endless) | ctx.pipe(slow, name="slow", capacity=capacity) | ctx.stream("out")
    )
    pipeline.start()
    try:
        stats = pipeline.statistics
        until(lambda: stats()["slow"].inbox_depth >= 8, "a full inbox")
        gate.set()
        until(lambda: stats()["slow"].items_out >= 3, "3 items out")
        first = stats()["slow"]
        until(lambda: stats()["slow"].items_out >= first.items_out + 3, "3 more items out")
        assert stats()["slow"].work_s > first.work_s > 0
    finally:
        pipeline.stop()


# --- interrupts and reprs -----------------------------------------------------------------


def test_an_interrupted_drive_is_logged_as_a_stop_and_starts_over(ctx: rxstream.Context) -> None:
    """Ctrl-C in a drive logs pipeline_interrupted (not pipeline_failed); the next starts over."""

    def frames() -> Iterator[int]:
        for x in itertools.count():
            if x == 2 and not interrupted:
                interrupted.append(x)
                raise KeyboardInterrupt
            yield x

    interrupted: list[int] = []
    pipeline = ctx.source(frames) | ctx.stream("out")
    saved = structlog.get_config()
    structlog.reset_defaults()  # an earlier test's configure_logging may filter out INFO
    try:
        with structlog.testing.capture_logs() as logs, pytest.raises(KeyboardInterrupt):
            pipeline.drive(frames=3)
    finally:
        structlog.configure(**saved)
    assert [log["event"] for log in logs] == ["pipeline_interrupted"]
    assert pipeline.drive(frames=2) == [0, 1]


def test_context_and_generations_read_well(ctx: rxstream.Context) -> None:
    """Context and ctx.generations have readable reprs (not <… object at 0x…>)."""
    ctx.doc("model", defaults={"k": 1})
    pipeline = ctx.source(endless) | ctx.stream("out")
    pipeline.start()
    try:
        assert repr(ctx) == (
            "<rxstream.Context docs=['model'] transport=MemoryTransport rank=0/1 running=1>"
        )
    finally:
        pipeline.stop()
    pipeline.update(prompt="a")
    assert repr(ctx.generations) == "<Generations prompt=1 flush=0 drop=1>"
