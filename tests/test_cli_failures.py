"""What an app author gets wrong, said by the CLI at once in one line: an idle rank, an error
in the app's own code (its type, message and the app's line), a rank that fails (never an
internal traceback), ``rxstream test`` running the self test alone, and a serving URL that
copies whole."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from rxstream import cli
from rxstream.cli._failure import TRACEBACK_ENV
from rxstream.cli._run import idle_ranks, opened_line

ROOT = Path(__file__).resolve().parent.parent
FRAMES_APP = str(ROOT / "tests" / "apps" / "frames_app.py")


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- the serving URL ----------------------------------------------------------------------------


def test_the_serving_url_is_last_on_its_line_with_nothing_glued_to_it() -> None:
    """The opened line ends with the page's URL, a space before it and nothing after it."""
    url = "http://127.0.0.1:8765/?token=abc"
    assert opened_line("app.py", "1 rank(s)", url) == (
        "rxstream run: app.py on 1 rank(s), Ctrl-C stops; serving the page at "
        "http://127.0.0.1:8765/?token=abc"
    )
    assert opened_line("app.py", "2 rank(s)", None) == (
        "rxstream run: app.py on 2 rank(s), headless; Ctrl-C stops"
    )


# --- --ranks with an idle rank ------------------------------------------------------------------

ONE_RANK_APP = "def build(ctx):\n    return ctx.source(range(5)) | ctx.stream('s')\n"


def test_ranks_with_no_stage_placed_on_one_warns_and_runs_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--ranks 2`` of an app with no ``rank=``: one warning line naming rank 1, exit 0."""
    app = _write(tmp_path / "one.py", ONE_RANK_APP)
    assert cli.main(["run", app, "--ranks", "2", "--frames", "5"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "rxstream run: warning: --ranks 2: no stage is placed on rank 1 (give a stage rank=1, "
        "or drop --ranks)"
    )
    assert len(err) == 2, err  # and the opened line


def test_a_refused_run_with_an_idle_rank_says_the_refusal_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run refused before it starts (``--out`` of an app without a stream) warns of nothing."""
    app = _write(
        tmp_path / "no_sink.py",
        "def build(ctx):\n    return ctx.source(range(5)) | ctx.pipe(abs)\n",
    )
    assert cli.main(["run", app, "--ranks", "2", "--out", str(tmp_path / "x.mp4")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert "no ctx.stream sink" in err[0]


@pytest.mark.parametrize(
    ("used", "ranks", "said"),
    [
        ({0}, 1, None),
        ({0, 1}, 2, None),
        (
            {0},
            3,
            "--ranks 3: no stage is placed on ranks 1, 2 (give a stage rank=1, or drop --ranks)",
        ),
        (
            {0, 1},
            3,
            "--ranks 3: no stage is placed on rank 2 (give a stage rank=2, or run it with "
            "--ranks 2)",
        ),
        ({0, 2}, 3, "--ranks 3: no stage is placed on rank 1 (give a stage rank=1)"),
    ],
)
def test_an_idle_rank_is_named_with_what_to_do(
    used: set[int], ranks: int, said: str | None
) -> None:
    """Each rank without a stage is named; fewer ranks are suggested only when they would do."""
    assert idle_ranks(used, ranks) == said


# --- a rank that fails: one line, never an internal traceback ------------------------------------

RANK1_FAILS_APP = str(ROOT / "tests" / "apps" / "rank1_fails_app.py")


class _Run:
    """What ``_listen`` drives of a rank's run, recorded."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.halted = False
        self.failures: list[BaseException] = []

    def halt(self) -> None:
        self.halted = True

    def fail(self, exc: BaseException) -> None:
        self.failures.append(exc)


def test_a_ranks_control_pipe_closes_only_once_its_listener_stopped_reading() -> None:
    """The rank's last close waits for the controller's ``stop`` to end the listener's read."""
    from rxstream import Context
    from rxstream.ranks._rank import _listen, close_control

    ours, theirs = multiprocessing.Pipe()
    run = _Run()
    listener = threading.Thread(
        target=_listen, args=(theirs, Context(), cast(Any, run)), daemon=True
    )
    listener.start()
    closing = threading.Thread(target=close_control, args=(theirs, listener), daemon=True)
    closing.start()  # the rank has sent its last word: it closes while the listener reads
    ours.send(("stop",))
    closing.join(10)
    assert not closing.is_alive()
    assert not listener.is_alive()
    assert theirs.closed
    assert run.halted
    assert run.done.is_set()
    assert run.failures == []  # closed under the read: "rank 0 went away", or a TypeError
    ours.close()


@pytest.mark.slow
def test_a_rank_1_failure_is_one_line_every_run() -> None:
    """A rank-1 stage that raises: the opened line and one error line, run after run."""
    for _ in range(5):
        done = subprocess.run(
            [sys.executable, "-m", "rxstream", "run", RANK1_FAILS_APP, "--ranks", "2"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
        )
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"rxstream run: {RANK1_FAILS_APP} on 2 rank(s), headless; Ctrl-C stops",
            "rxstream run: stage 'rank 1' failed: RuntimeError: stage 'work' failed on item "
            "pts=3 input_seq=0: RuntimeError: rank 1 broke on item 3",
        ], done.stderr


# --- the app's own code fails: its type, message and line -----------------------------------------

MAIN_RAISES_APP = """\
async def main(ctx):
    config = {"a": 1}
    ctx.source(range(3)) | ctx.stream("s")
    return config["b"]
"""


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("run", "rxstream run: KeyError: 'b' (main_raises_run.py:4 in main)"),
        ("test", "rxstream test: main_raises_test.py failed outside its self test: KeyError: "
         "'b' (main_raises_test.py:4 in main)"),
    ],
)  # fmt: skip
def test_an_error_in_main_names_its_type_and_the_apps_line(
    command: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A KeyError in main's own code: one line with the type, the message and app.py:line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    _write(tmp_path / f"main_raises_{command}.py", MAIN_RAISES_APP)
    assert cli.main([command, f"main_raises_{command}.py"]) == 1
    assert capsys.readouterr().err.splitlines()[-1:] == [said]  # no traceback


@pytest.mark.parametrize("asked", ["--traceback", TRACEBACK_ENV])
def test_the_whole_traceback_comes_on_request_before_the_line(
    asked: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--traceback`` (or the environment variable) prints the traceback, then the one line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    name = f"main_raises_{asked.strip('-').lower()}"
    _write(tmp_path / f"{name}.py", MAIN_RAISES_APP)
    argv = ["run", f"{name}.py"]
    if asked == TRACEBACK_ENV:
        monkeypatch.setenv(TRACEBACK_ENV, "1")
    else:
        argv.append(asked)
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert "Traceback (most recent call last):" in err
    assert '    return config["b"]' in err
    assert err[-2:] == [
        "KeyError: 'b'",
        f"rxstream run: KeyError: 'b' ({name}.py:4 in main)",
    ]


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("run", "rxstream run: ModuleNotFoundError: No module named 'cv3_nowhere' "
         "(imports_run.py:2 in <module>)"),
        ("test", "rxstream test: ModuleNotFoundError: No module named 'cv3_nowhere' "
         "(imports_test.py:2 in <module>)"),
        ("topology", "rxstream topology: ModuleNotFoundError: No module named 'cv3_nowhere' "
         "(imports_topology.py:2 in <module>)"),
    ],
)  # fmt: skip
def test_an_import_the_app_cannot_make_names_its_line(
    command: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An app whose own import fails: every command says the type, the message and the line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    _write(tmp_path / f"imports_{command}.py", "import math\nimport cv3_nowhere\n")
    assert cli.main([command, f"imports_{command}.py"]) == 1
    assert capsys.readouterr().err == said + "\n"


def test_a_build_that_raises_names_its_line_in_topology(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rxstream topology`` of a build that raises: the type, the message and build's line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    _write(tmp_path / "builds.py", "def build(ctx):\n    return {}['codec']\n")
    assert cli.main(["topology", "builds.py"]) == 1
    assert (
        capsys.readouterr().err == "rxstream topology: KeyError: 'codec' (builds.py:2 in build)\n"
    )


# --- rxstream test runs the self test alone ---------------------------------------------------

AFTER_THE_BLOCK_APP = """\
import asyncio


async def main(ctx):
    pipeline = ctx.source(range(3)) | ctx.stream("s")
    with ctx.self_test():
        assert pipeline.drive(frames=2) == [0, 1]
    print("after the block", flush=True)
    asyncio.ensure_future(asyncio.sleep(0))
    await pipeline.run()
    print("after the run", flush=True)
"""

LIVE_WITHOUT_A_BLOCK_APP = """\
async def main(ctx):
    print("before the run", flush=True)
    await (ctx.source(range(3)) | ctx.stream("s")).run()
    print("after the run", flush=True)
"""

THREADED_BLOCK_APP = """\
async def main(ctx):
    pipeline = ctx.source(range(3)) | ctx.stream("s")
    with ctx.self_test():
        pipeline.start()
        pipeline.wait(10)
        pipeline.stop()
    raise RuntimeError("past the block")
"""


def test_rxstream_test_stops_a_main_app_at_the_end_of_its_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What main does after its self test block (a print, a task, ``run()``) never runs."""
    app = _write(tmp_path / "after_the_block.py", AFTER_THE_BLOCK_APP)
    assert cli.main(["test", app]) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"rxstream test: {app}: self test passed\n")
    assert "after the" not in out


def test_rxstream_test_of_a_main_app_going_live_without_a_block_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A main that starts its run before any self test has none: exit 2 there, nothing run."""
    app = _write(tmp_path / "live_without.py", LIVE_WITHOUT_A_BLOCK_APP)
    assert cli.main(["test", app]) == 2
    out, err = capsys.readouterr()
    assert "before the run\n" in out
    assert "after the run" not in out
    assert err == f"rxstream test: {app} has no self test (a `with ctx.self_test():` block)\n"


def test_a_self_test_block_may_run_its_pipeline_threaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A block that starts a pipeline is the test itself: it runs, and passes at its end."""
    app = _write(tmp_path / "threaded_block.py", THREADED_BLOCK_APP)
    assert cli.main(["test", app]) == 0
    out = capsys.readouterr().out  # (after the self test's log line, where logging is set up)
    assert out.endswith(f"rxstream test: {app}: self test passed\n")


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("misuse", "async def main(ctx):\n    ctx.pipe(42)\n",
         "rxstream run: ctx.pipe needs a callable, got int 42 (misuse.py:2 in main)"),
        ("stage_fails",
         "async def main(ctx):\n"
         "    await (ctx.source(range(3)) | ctx.pipe(lambda x: 1 / 0, name='divide')"
         " | ctx.stream('s')).run()\n",
         "rxstream run: stage 'divide' failed on item pts=0 input_seq=0: ZeroDivisionError: "
         "division by zero"),
    ],
)  # fmt: skip
def test_rxstreams_own_errors_read_as_they_are_with_the_apps_line_where_it_helps(
    name: str,
    text: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A builder misused in main gets main's line; a stage's failure names its stage alone."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    _write(tmp_path / f"{name}.py", text)
    assert cli.main(["run", f"{name}.py"]) == 1
    assert capsys.readouterr().err.splitlines()[-1:] == [said]


RANK1_BUILD_RAISES_APP = """\
def build(ctx):
    if ctx.rank == 1:
        {}["codec"]
    return ctx.source(range(3), rank=0) | ctx.pipe(abs, rank=1) | ctx.stream("s")
"""


@pytest.mark.slow
def test_a_build_that_raises_on_rank_1_names_the_rank_and_the_apps_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1's build raising: one line naming rank 1, the error and build's line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    _write(tmp_path / "rank1_build.py", RANK1_BUILD_RAISES_APP)
    assert cli.main(["run", "rank1_build.py", "--ranks", "2"]) == 1
    assert capsys.readouterr().err == (
        "rxstream run: stage 'rank 1' failed: RuntimeError: KeyError: 'codec' "
        "(rank1_build.py:3 in build)\n"
    )
