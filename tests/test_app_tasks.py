"""An app's own work around its pipelines: spawned tasks whose failure ends the run, a library
that prints nothing unless asked, and a source that reads the newest sample of an input."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

import rxstream
import rxstream.timing
from rxstream import cli
from rxstream._util import library_logger
from rxstream.timing._emit import configure_quiet_logging
from rxstream.topology import ClientStreamLimits

ROOT = Path(__file__).resolve().parent.parent

TYPO = (
    r"DocValidationError: control\.promt is not a field of the doc \(fields there: prompt\), "
    r"got 'a storm'"
)


def steering_pipeline(ctx: rxstream.Context) -> rxstream.Pipeline:
    """An input to a sink: it runs until stopped (the memory transport stays connected)."""
    ctx.doc("control", defaults={"prompt": "a calm sea"})
    return ctx.input("pointer") | ctx.stream("out")


def test_a_spawned_task_that_raises_ends_run_with_a_task_error() -> None:
    """A task of ``ctx.spawn`` that raises (a typo in ``update``) ends the running
    ``pipeline.run()`` at once: it raises a TaskError naming the task and the cause."""
    ctx = rxstream.Context()
    pipeline = steering_pipeline(ctx)

    async def autopilot() -> None:
        await asyncio.sleep(0)
        pipeline.update(promt="a storm")

    async def main() -> None:
        ctx.spawn(autopilot())
        await pipeline.run()

    with pytest.raises(rxstream.TaskError, match=rf"^task 'autopilot' failed: {TYPO}$") as info:
        asyncio.run(main())
    assert info.value.task == "autopilot"
    assert isinstance(info.value.__cause__, rxstream.DocValidationError)
    assert pipeline.state == "stopped"


def test_run_cancels_the_spawned_tasks_when_it_ends() -> None:
    """When ``pipeline.run()`` ends (here: its session disconnected), the tasks spawned on
    its context are cancelled, and their ``finally`` blocks have run when it returns."""
    ctx = rxstream.Context()
    pipeline = steering_pipeline(ctx)
    cleaned: list[str] = []

    async def feeder() -> None:
        try:
            while True:
                await asyncio.sleep(0.01)
        finally:
            cleaned.append("feeder")

    async def main() -> asyncio.Task[None]:
        task = ctx.spawn(feeder(), name="mouse")
        assert task.get_name() == "mouse"
        loop = asyncio.get_running_loop()
        loop.call_soon(ctx.transport.disconnect)  # type: ignore[attr-defined]
        await pipeline.run()
        return task

    task = asyncio.run(main())
    assert task.cancelled()
    assert cleaned == ["feeder"]


def test_a_task_that_failed_before_run_is_raised_by_run() -> None:
    """A spawned task that failed before ``pipeline.run()`` was awaited makes that run
    raise its TaskError without starting."""
    ctx = rxstream.Context()
    pipeline = steering_pipeline(ctx)

    async def setup() -> None:
        raise KeyError("missing")

    async def main() -> None:
        await asyncio.wait({ctx.spawn(setup())})
        await pipeline.run()

    with pytest.raises(rxstream.TaskError, match=r"^task 'setup' failed: KeyError: 'missing'$"):
        asyncio.run(main())
    assert pipeline.state == "new"


def test_spawn_refuses_what_is_not_a_coroutine() -> None:
    """``ctx.spawn(autopilot)`` (the function, not called) is refused, saying to call it."""
    ctx = rxstream.Context()

    async def autopilot() -> None:
        pass

    async def main() -> None:
        ctx.spawn(autopilot)  # type: ignore[arg-type]

    with pytest.raises(
        rxstream.ArgumentTypeError,
        match=r"^ctx\.spawn needs a coroutine, got function autopilot; "
        r"call it: ctx\.spawn\(autopilot\(\.\.\.\)\)$",
    ):
        asyncio.run(main())


def test_spawn_outside_an_event_loop_is_refused() -> None:
    """``ctx.spawn`` from synchronous code (no running loop) is refused, naming the task."""
    ctx = rxstream.Context()

    async def autopilot() -> None:
        pass

    with pytest.raises(
        rxstream.PipelineStateError,
        match=r"^ctx\.spawn\('autopilot'\) outside a running event loop: call it from async "
        r"code \(an app's main\(ctx\), a notebook cell, a coroutine under asyncio\.run\)$",
    ):
        ctx.spawn(autopilot())


def test_every_run_ended_by_a_task_failure_raises_it() -> None:
    """A spawned task that fails while two runs of its context are under way ends both, and
    each ``pipeline.run()`` raises the TaskError (neither returns as if nothing happened)."""
    ctx = rxstream.Context()
    first = ctx.input("a") | ctx.stream("o1")
    second = ctx.input("b") | ctx.stream("o2")

    async def boom() -> None:
        await asyncio.sleep(0)
        raise KeyError("b")

    async def main() -> tuple[BaseException | None, BaseException | None]:
        ctx.spawn(boom())
        return await asyncio.gather(first.run(), second.run(), return_exceptions=True)

    results = asyncio.run(main())
    assert [str(result) for result in results] == ["task 'boom' failed: KeyError: 'b'"] * 2
    assert all(isinstance(result, rxstream.TaskError) for result in results)
    assert (first.state, second.state) == ("stopped", "stopped")


def test_a_run_that_ends_leaves_the_tasks_to_another_run_under_way() -> None:
    """``pipeline.run()`` ending while another run of its context is under way cancels no
    spawned task; the last run's end cancels them (their ``finally`` run by its return)."""
    ctx = rxstream.Context()
    first = ctx.input("a") | ctx.stream("o1")
    second = ctx.input("b") | ctx.stream("o2")
    cleaned: list[str] = []

    async def main() -> tuple[bool, asyncio.Task[None]]:
        feeding = asyncio.Event()

        async def feeder() -> None:
            feeding.set()
            try:
                await asyncio.Event().wait()  # feeds the second pipeline until cancelled
            finally:
                cleaned.append("feeder")

        task = ctx.spawn(feeder())
        other = asyncio.ensure_future(second.run())
        await feeding.wait()  # the second run is under way too
        asyncio.get_running_loop().call_soon(first.stop)
        await first.run()
        alive = not task.done()
        ctx.transport.disconnect()  # type: ignore[attr-defined]
        await other
        return alive, task

    alive, task = asyncio.run(main())
    assert alive
    assert task.cancelled()
    assert cleaned == ["feeder"]


def test_a_task_error_ending_a_spawned_task_is_not_a_new_failure() -> None:
    """A run awaited inside a spawned task raises the TaskError of another task; that task
    ending with it is no new failure, so a later run of the context starts and runs."""
    ctx = rxstream.Context()
    inner = ctx.input("a") | ctx.stream("o1")
    later = ctx.input("b") | ctx.stream("o2")

    async def main() -> BaseException | None:
        going = asyncio.Event()

        async def boom() -> None:
            await going.wait()
            raise KeyError("b")

        async def runner() -> None:
            going.set()
            await inner.run()

        ctx.spawn(boom())
        task = ctx.spawn(runner(), name="runner")
        await asyncio.wait({task})
        asyncio.get_running_loop().call_soon(ctx.transport.disconnect)  # type: ignore[attr-defined]
        await later.run()  # returns at the disconnect
        return task.exception()

    error = asyncio.run(main())
    assert isinstance(error, rxstream.TaskError)
    assert str(error) == "task 'boom' failed: KeyError: 'b'"
    assert later.state == "stopped"


SELF_TEST_TASK_APP = """\
async def main(ctx):
    pipeline = ctx.source(range(3)) | ctx.stream("s")

    async def check():
        with ctx.self_test():
            pipeline.drive(frames=1)

    await ctx.spawn(check())
    print("after the block (must not run)")
"""


@pytest.mark.usefixtures("unconfigured_structlog")
def test_a_self_test_ending_in_a_spawned_task_is_no_task_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rxstream test`` of a main app whose self test block runs in a spawned task passes
    and logs no ``app_task_failed``: the block's end (no ``Exception``) is no failure."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "st_app.py").write_text(SELF_TEST_TASK_APP)
    assert cli.main(["test", "st_app.py"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("rxstream test: st_app.py: self test passed\n", "")


TASK_APP = """\
import asyncio

import rxstream


def build(ctx):
    ctx.doc("control", defaults={"prompt": "a calm sea"})
    return ctx.input("pointer") | ctx.stream("out")


async def autopilot(pipeline):
    await asyncio.sleep(0.05)
    pipeline.update(promt="a storm")


async def main(ctx):
    pipeline = build(ctx)
    ctx.spawn(autopilot(pipeline))
    await pipeline.run()
"""


def test_rxstream_run_exits_1_naming_the_failed_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rxstream run`` of a main app whose spawned task raises exits 1, its last stderr line
    naming the task, the error and the task's own line (not main's await of the run)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "task_app.py").write_text(TASK_APP)
    assert cli.main(["run", "task_app.py", "--timeout", "30"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "rxstream run: task 'autopilot' failed: DocValidationError: control.promt is not a "
        "field of the doc (fields there: prompt), got 'a storm' (task_app.py:13 in autopilot)"
    )


def test_rxstream_run_says_a_failed_task_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's failure is one line on stderr under ``rxstream run``: no ``app_task_failed``
    log line before the run's own."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "task_app.py").write_text(TASK_APP)
    assert cli.main(["run", "task_app.py", "--timeout", "30"]) == 1
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "promt" in line] == [err.splitlines()[-1]]


AWAIT_OTHER_APP = """\
import asyncio

import rxstream


def build(ctx):
    return ctx.input("pointer") | ctx.stream("out")


async def feeder():
    raise RuntimeError("no pointer device")


async def main(ctx):
    pipeline = build(ctx)
    ctx.spawn(feeder())
    await asyncio.sleep(30)  # main awaits something else than pipeline.run()
"""


def test_rxstream_run_ends_when_a_task_fails_outside_pipeline_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spawned task that fails while main awaits something else ends ``rxstream run`` too
    (exit 1, the task named), not after main's own wait."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "await_other.py").write_text(AWAIT_OTHER_APP)
    assert cli.main(["run", "await_other.py", "--timeout", "60"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "rxstream run: task 'feeder' failed: RuntimeError: no pointer device "
        "(await_other.py:11 in feeder)"
    )


DRIVING_SCRIPT = """\
import sys
import threading

import rxstream
from rxstream.timing import configure_logging

if len(sys.argv) > 1:
    configure_logging(sys.argv[1])
records = []
all_in = threading.Event()


def on_timing(record):
    records.append(record)
    if len(records) == 4:
        all_in.set()


ctx = rxstream.Context()
pipeline = ctx.input("mouse") | ctx.pipe(lambda x: x * 2) | ctx.stream("video", on_timing=on_timing)
for sample in (1, 2, 3):
    pipeline.feed("mouse", sample)
assert pipeline.drive(frames=3) == [2, 4, 6]  # driven
pipeline.feed("mouse", 4)
pipeline.start()  # and threaded
assert all_in.wait(60)
pipeline.stop()
assert [record.input_seq for record in records] == [1, 2, 3, 4], records
"""


def drive_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run :data:`DRIVING_SCRIPT` in a fresh interpreter with ``args``."""
    script = tmp_path / "drive.py"
    script.write_text(DRIVING_SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def test_a_script_driving_a_pipeline_prints_nothing_without_configure_logging(
    tmp_path: Path,
) -> None:
    """Without ``configure_logging``, a script that drives and runs a pipeline (an input, a
    sink) prints no timing record, nor anything else; its ``on_timing`` hook still gets them."""
    done = drive_script(tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_configure_logging_still_writes_the_timing_records(tmp_path: Path) -> None:
    """With ``configure_logging(path)`` the same script writes its records to the file (and
    still nothing to stdout)."""
    log = tmp_path / "timing.jsonl"
    done = drive_script(tmp_path, str(log))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert events.count("[timing:video]") == 4


@pytest.fixture
def unconfigured_structlog() -> Iterator[None]:
    """structlog as a fresh process has it (unconfigured) for the test; restored after."""
    configured, saved = structlog.is_configured(), structlog.get_config()
    structlog.reset_defaults()
    try:
        yield
    finally:
        structlog.reset_defaults()
        if configured:
            structlog.configure(**saved)


@pytest.mark.usefixtures("unconfigured_structlog")
def test_an_unconfigured_warning_goes_to_stderr_as_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Unconfigured, rxstream's warnings (a skipped item) are one line on stderr, none on
    stdout: quiet is not silent."""

    def decode(x: int) -> int:
        if x == 2:
            raise ValueError("corrupt frame")
        return x

    ctx = rxstream.Context()
    pipeline = ctx.source(range(3)) | ctx.pipe(decode, on_error="skip") | ctx.stream("out")
    assert pipeline.drive(frames=3) == [0, 1]
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("[warning  ] stage_item_skipped")
    assert "stage=decode" in line


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.usefixtures("unconfigured_structlog")
def test_a_log_line_on_a_terminal_first_erases_the_status_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a terminal a launcher's log line starts by erasing its line (``\\r``, erase to the
    end), so it never runs on from the status line drawn there; elsewhere it is the bare line."""
    for terminal in (True, False):
        stream = _Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", stream)
        configure_quiet_logging()
        stream.write("\r[0] world 24 fps | [1] decode BUSY 1.2 s pts=4\x1b[K")  # the status line
        library_logger("rxstream").warning("stage 'decode' has been busy")
        text = stream.getvalue()
        line = text.split("\x1b[K", 1)[1]  # what follows the status line
        if terminal:
            assert line.startswith("\r\x1b[K"), repr(text)
        else:
            assert not line.startswith("\r"), repr(text)
        assert line.endswith("[warning  ] stage 'decode' has been busy\n"), repr(text)


def test_every_module_of_the_package_logs_through_the_library_logger() -> None:
    """No rxstream module asks structlog for a logger itself (one that would print by default)."""
    package = Path(rxstream.__file__).parent
    direct = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if path.name != "_util.py" and "structlog.get_logger(" in path.read_text()
    ]
    assert direct == []


def pointer_world(
    ctx: rxstream.Context,
) -> tuple[rxstream.Pipeline, list[rxstream.timing.TimingRecord]]:
    """A world model's tick reading the pointer now: ``world`` yields the newest pointer
    sample (or ``None`` before the first), one frame a pull, into ``video``."""
    records: list[rxstream.timing.TimingRecord] = []
    pointer = ctx.input("pointer")

    def world() -> Iterator[object]:
        while True:
            yield pointer.latest()

    return ctx.source(world, reads=pointer) | ctx.stream("video", on_timing=records.append), records


def test_a_source_reads_the_newest_sample_of_an_input_with_its_correlation() -> None:
    """``pointer.latest()`` in a source with ``reads=pointer`` is the newest fed sample
    (``None`` before one); the source's item carries that sample's ``input_seq`` and
    ``input_at_ms`` and its timeline starts at the sample's ``input.recv``."""
    ctx = rxstream.Context()
    pipeline, _ = pointer_world(ctx)
    (before,) = pipeline.drive(frames=1, items=True)
    assert (before.payload, before.metadata.input_seq) == (None, 0)
    pipeline.feed("pointer", (0.1, 0.1), at_ms=1000)
    pipeline.feed("pointer", (0.2, 0.2), at_ms=1008)
    (item,) = pipeline.drive(frames=1, items=True)
    assert item.payload == (0.2, 0.2)
    assert (item.metadata.input_seq, item.metadata.input_at_ms) == (2, 1008)
    assert [hop for hop, _ in item.metadata.timeline] == [
        "input.recv",
        "world.in",
        "world.out",
        "video.in",
        "video.out",
    ]


def test_a_reading_source_makes_one_timing_record_per_sample_read() -> None:
    """The sink of a reading source writes one record per new sample that reached it (a
    tick that read the same sample again writes none), from its ``input.recv``."""
    ctx = rxstream.Context()
    pipeline, records = pointer_world(ctx)
    pipeline.feed("pointer", (0.1, 0.1))
    pipeline.drive(frames=3)  # three ticks, one sample
    pipeline.feed("pointer", (0.2, 0.2))
    pipeline.feed("pointer", (0.3, 0.3))  # the tick sees only the newest
    pipeline.drive(frames=2)
    assert [(r.input_seq, r.origin, r.hops[0].name) for r in records] == [
        (1, "input.recv", "world"),
        (3, "input.recv", "world"),
    ]


def test_a_read_input_is_a_client_stream_of_the_pipeline() -> None:
    """An input only read (``reads=``, no stage of the graph) is fed through the pipeline and
    offered to the session like any input; a feed to another name lists it."""
    ctx = rxstream.Context()
    pipeline, _ = pointer_world(ctx)
    assert pipeline.session().inputs == ("pointer",)
    assert pipeline.feed("pointer", (0.5, 0.5)) == 1
    with pytest.raises(
        rxstream.UnknownInputError,
        match=r"^no input stream 'mouse' in this pipeline; its inputs are: pointer$",
    ):
        pipeline.feed("mouse", (0.5, 0.5))


def test_a_read_input_is_a_client_stream_of_the_topology() -> None:
    """The topology lists an input only read as a client stream into the reading source's
    partition, with its limits (what a serving config checks and lowers)."""
    ctx = rxstream.Context()
    limits = ClientStreamLimits(max_items=100)
    pointer = ctx.input("pointer", limits)

    def world() -> Iterator[object]:
        yield pointer.latest()

    pipeline = ctx.source(world, reads=pointer) | ctx.stream("video")
    clients = [c for c in pipeline.topology().connections if c.is_client_stream]
    assert [(c.edge_name, c.to_partition, c.limits) for c in clients] == [
        ("pointer", "rank0", limits)
    ]


def test_a_reading_source_runs_threaded_with_its_records() -> None:
    """Threaded, a reading source's items carry the sample read at each tick, and its sink's
    records name each sample once (a tick that read the same sample again writes none)."""
    ctx = rxstream.Context()
    pointer = ctx.input("pointer")
    ticks = [threading.Event() for _ in range(3)]
    got: list[object] = []
    arrived = threading.Condition()
    seen: list[int] = []

    def world() -> Iterator[object]:
        for tick in ticks:
            tick.wait(30)
            yield pointer.latest()

    def note(payload: object) -> None:
        with arrived:
            got.append(payload)
            arrived.notify_all()

    def until(count: int) -> None:
        with arrived:
            assert arrived.wait_for(lambda: len(got) >= count, 30)

    pipeline = (
        ctx.source(world, reads=pointer)
        | ctx.tap(note)
        | ctx.stream("video", on_timing=lambda r: seen.append(r.input_seq))
    )
    pipeline.start()
    try:
        pipeline.feed("pointer", "a")
        ticks[0].set()
        until(1)
        ticks[1].set()  # the same sample again
        until(2)
        pipeline.feed("pointer", "b")
        pipeline.feed("pointer", "c")  # the tick sees only the newest
        ticks[2].set()
        assert pipeline.wait(30)  # the source ends after its three ticks
    finally:
        pipeline.stop()
    assert got == ["a", "a", "c"]
    assert seen == [1, 3]


def test_latest_and_reads_refuse_what_is_no_input() -> None:
    """``latest()`` on a stage that is not a ``ctx.input``, and ``reads=`` naming one, are
    refused naming the stage."""
    ctx = rxstream.Context()
    triple = ctx.pipe(lambda x: x * 3, name="triple")
    with pytest.raises(
        rxstream.ArgumentTypeError,
        match=r"^latest\(\) reads an input's newest sample: stage 'triple' is a pipe stage, "
        r"not a ctx\.input$",
    ):
        triple.latest()
    with pytest.raises(
        rxstream.StageBuildError,
        match=r"^reads must be a ctx\.input stage or a list of them, got <Stage pipe 'triple'> "
        r"for source 'world'$",
    ):
        ctx.source(range(3), name="world", reads=triple)


def test_a_reading_source_off_rank_0_is_refused() -> None:
    """A source that reads an input sits on rank 0, where the samples arrive: on another rank
    its pipeline is refused, naming both."""
    ctx = rxstream.Context()
    pointer = ctx.input("pointer")
    pipeline = ctx.source(range(3), name="world", reads=pointer, rank=1) | ctx.stream("video")
    with pytest.raises(
        rxstream.StageBuildError,
        match=r"^source 'world' reads input 'pointer', whose samples arrive on rank 0 \(the "
        r"session's\): place the source on rank 0, got rank=1$",
    ):
        pipeline.plan  # noqa: B018 - compiling the plan refuses it


def test_a_threaded_run_starts_without_a_newest_sample() -> None:
    """A sample fed before a threaded run (the self test's) is not the pointer now in the
    run: ``latest()`` gives the default until the run's first sample."""
    ctx = rxstream.Context()
    pointer = ctx.input("pointer")

    def world() -> Iterator[object]:
        yield pointer.latest("none")

    pipeline = ctx.source(world, reads=pointer) | ctx.stream("video")
    pipeline.feed("pointer", "self test's")
    assert pipeline.drive(frames=1) == ["self test's"]
    pipeline.reset()
    pipeline.start()
    assert pipeline.wait(30)
    assert ctx.transport.payloads("video")[-1] == "none"  # type: ignore[attr-defined]


def test_the_pointer_world_example_writes_one_record_per_pointer_sample(tmp_path: Path) -> None:
    """examples/pointer_world.py headless with its autopilot: every timing record is one
    pointer sample's (from its ``input.recv``, through ``world``), each sample once."""
    log = tmp_path / "timing.jsonl"
    app = str(ROOT / "examples" / "pointer_world.py")
    args = ["run", app, "--frames", "12", "--set", "autopilot=true", "--log", str(log)]
    assert cli.main(args) == 0
    records = rxstream.timing.load(log).records
    assert records
    assert {(r.origin, r.hops[0].name) for r in records} == {("input.recv", "world")}
    seqs = [r.input_seq for r in records]
    assert seqs == sorted(set(seqs))


# --- a reading source's correlation is its own pull's ------------------------------------


def test_a_source_that_reads_nothing_takes_no_correlation_from_another_readers_pull() -> None:
    """Two sources declare ``reads=pointer``; ``world`` calls ``latest()`` while ``hud``'s
    pull runs, and ``hud`` never does: only ``world``'s item carries the sample (the sink's
    one record for it names ``world``, though ``hud``'s item reached the sink first)."""
    ctx = rxstream.Context()
    pointer = ctx.input("pointer")
    fed, pulling, read, hud_out = (threading.Event() for _ in range(4))
    records: list[rxstream.timing.TimingRecord] = []

    def world() -> Iterator[object]:
        fed.wait(30)
        pulling.wait(30)  # hud's pull has begun
        value = pointer.latest()
        read.set()
        hud_out.wait(30)  # hud's item is ahead of this one
        yield value

    def hud() -> Iterator[int]:
        fed.wait(30)
        pulling.set()
        read.wait(30)  # world read the pointer during this pull
        yield 0

    def note(payload: object) -> None:
        if payload == 0:
            hud_out.set()

    pipeline = (
        [ctx.source(world, name="world", reads=pointer), ctx.source(hud, name="hud", reads=pointer)]
        | ctx.merge()
        | ctx.tap(note)
        | ctx.stream("out", on_timing=records.append)
    )
    pipeline.start()
    try:
        pipeline.feed("pointer", (0.5, 0.5))
        fed.set()
        assert pipeline.wait(30)
    finally:
        pipeline.stop()
    assert [(r.hops[0].name, r.input_seq) for r in records] == [("world", 1)]


def test_a_pipe_calling_latest_gives_the_source_no_correlation() -> None:
    """A pipe that calls ``pointer.latest()`` while the source's next pull runs does not make
    that pull's item a reading of the sample: the source read nothing, its sink writes no
    record."""
    ctx = rxstream.Context()
    pointer = ctx.input("pointer")
    fed = threading.Event()
    peeked = threading.Event()
    records: list[rxstream.timing.TimingRecord] = []
    seen: list[object] = []

    def ticks() -> Iterator[int]:
        fed.wait(30)
        yield 0
        peeked.wait(30)  # the pipe called latest() during this pull
        yield 1

    def peek(value: int) -> int:
        seen.append(pointer.latest())
        peeked.set()
        return value

    pipeline = (
        ctx.source(ticks, name="ticks", reads=pointer)
        | ctx.pipe(peek, name="peek")
        | ctx.stream("out", on_timing=records.append)
    )
    pipeline.start()
    try:
        pipeline.feed("pointer", "a")
        fed.set()
        assert pipeline.wait(30)
    finally:
        pipeline.stop()
    assert seen == ["a", "a"]
    assert records == []


def test_an_async_reading_source_takes_the_correlation_of_its_own_read() -> None:
    """An async generator source reading ``pointer`` (its body runs on the pipeline's loop)
    makes items carrying the sample its pull read."""
    ctx = rxstream.Context()
    pointer = ctx.input("pointer")

    async def world() -> AsyncIterator[object]:
        while True:
            await asyncio.sleep(0)
            yield pointer.latest()

    pipeline = ctx.source(world, reads=pointer) | ctx.stream("video")
    pipeline.feed("pointer", "a", at_ms=1000)
    (item,) = pipeline.drive(frames=1, items=True)
    assert (item.payload, item.metadata.input_seq, item.metadata.input_at_ms) == ("a", 1, 1000)
    assert item.metadata.timeline[0][0] == "input.recv"


# --- an input only read ------------------------------------------------------------------


def test_an_input_only_read_keeps_its_newest_sample_and_counts_refusals_on_its_reader() -> None:
    """An input that only a source reads queues nothing (nothing waits, no ``latest`` drop
    past its capacity), its refusals count on the reading source's statistics, and a later
    run with the input as a stage inherits neither samples nor drops."""
    ctx = rxstream.Context()
    pointer = ctx.input("pointer", ClientStreamLimits(max_items=6), capacity=2, schema=str)

    def world() -> Iterator[object]:
        while True:
            yield pointer.latest()

    reading = ctx.source(world, name="world", reads=pointer) | ctx.stream("video")
    assert reading.drive(frames=1) == [None]
    for sample in "abcde":
        reading.feed("pointer", sample)
    with pytest.raises(rxstream.topology.InvalidSample):
        reading.feed("pointer", 7)
    reading.feed("pointer", "f")
    with pytest.raises(rxstream.topology.ClientStreamLimitExceeded):
        reading.feed("pointer", "g")
    assert reading.drive(frames=1) == ["f"]
    assert dict(reading.statistics()["world"].dropped) == {"invalid": 1, "limit": 1}
    taking = pointer | ctx.stream("raw")
    assert taking.drive(frames=1) == []
    assert dict(taking.statistics()["pointer"].dropped) == {}
