"""The command line when its stdout's reader leaves (``| head -1``) or Ctrl-C comes early: a
quiet exit, no traceback, and nothing the run made is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SIGPIPE = 141
"""128 + SIGPIPE: the status of a command whose stdout's reader left (``yes | head -1``)."""
ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "examples" / "demo.py")
FRAMES_APP = str(ROOT / "tests" / "apps" / "frames_app.py")

SLOW_APP = '''\
"""An app whose import says so on stderr, then waits for the file RELEASE names."""
import os
import sys
import time
from pathlib import Path

print("importing", file=sys.stderr, flush=True)
while not Path(os.environ["RELEASE"]).exists():
    time.sleep(0.01)


async def main(ctx):
    print("self test ran", flush=True)
    pipeline = ctx.source(range(3)) | ctx.stream("out")
    with ctx.self_test():
        assert pipeline.drive(frames=1) == [0]
    await pipeline.run()
'''


def decoded_frames(path: Path) -> int:
    """How many frames PyAV decodes from the video file at ``path``."""
    av = pytest.importorskip("av")
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def without_reader(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m rxstream ARGS`` writing to a pipe nobody reads (closed before it starts)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "rxstream", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
        )
    finally:
        os.close(write)


@pytest.mark.slow
def test_topology_into_a_closed_pipe_exits_quietly() -> None:
    """``rxstream topology APP | head -0``: exit 141 (128 + SIGPIPE), nothing on stderr."""
    done = without_reader("topology", DEMO)
    assert (done.returncode, done.stderr) == (SIGPIPE, "")


@pytest.mark.slow
def test_a_run_into_a_closed_pipe_exits_quietly_with_its_file_complete(tmp_path: Path) -> None:
    """``rxstream run … --out F | head -0`` on 2 ranks: exit 141, no traceback, all of F."""
    video = tmp_path / "v.mp4"
    done = without_reader(
        "run", FRAMES_APP, "--ranks", "2", "--set", "split=true", "--frames", "5",
        "--out", str(video),
    )  # fmt: skip
    assert done.returncode == SIGPIPE, done.stderr
    assert "Traceback" not in done.stderr
    assert "BrokenPipeError" not in done.stderr
    assert decoded_frames(video) == 5


@pytest.mark.slow
def test_an_app_printing_into_a_closed_pipe_runs_to_its_end(tmp_path: Path) -> None:
    """The demo prints as it runs; with no reader left its run still ends well: 141, full MP4."""
    video = tmp_path / "demo.mp4"
    done = without_reader("run", DEMO, "--frames", "3", "--out", str(video))
    assert done.returncode == SIGPIPE, done.stderr
    assert "Traceback" not in done.stderr
    assert "Broken pipe" not in done.stderr
    assert decoded_frames(video) == 3


PRINTING_RANK_APP = '''\
"""Two ranks: the paint stage and the sink on rank 1, the stage printing each frame."""
import numpy as np


def build(ctx):
    def paint(i):
        print(f"frame {i}", flush=True)
        return np.full((32, 48, 3), i % 255, np.uint8)

    return (
        ctx.source(range(100000), rank=0)
        | ctx.pipe(paint, rank=1)
        | ctx.stream("video", rank=1)
    )
'''


@pytest.mark.slow
def test_a_rank_printing_into_a_closed_pipe_runs_to_its_end(tmp_path: Path) -> None:
    """A stage on spawned rank 1 prints with no reader left: 141, no BrokenPipeError, full MP4."""
    app = tmp_path / "printing.py"
    app.write_text(PRINTING_RANK_APP)
    video = tmp_path / "r1.mp4"
    done = without_reader("run", str(app), "--ranks", "2", "--frames", "5", "--out", str(video))
    assert done.returncode == SIGPIPE, done.stderr
    assert "BrokenPipeError" not in done.stderr
    assert "Traceback" not in done.stderr
    assert decoded_frames(video) == 5


def interruptible(*args: str, release: Path) -> subprocess.Popen[str]:
    """``python -m rxstream ARGS`` with SIGINT at its default (as a terminal's foreground job
    has it; a background job of a shell ignores it), the slow app's release file in RELEASE."""
    start = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.executable, [sys.executable, '-m', 'rxstream', *sys.argv[1:]])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", start, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "RELEASE": str(release)},
    )


@pytest.mark.parametrize("command", ["run", "test"])
def test_ctrl_c_while_the_app_imports_exits_130_without_a_traceback(
    command: str, tmp_path: Path
) -> None:
    """SIGINT while the app is imported: exit 130, no traceback, no self test, no run."""
    app = tmp_path / "slow_app.py"
    app.write_text(SLOW_APP)
    release = tmp_path / "release"
    proc = interruptible(command, str(app), release=release)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "importing\n"
        proc.send_signal(signal.SIGINT)
        if command == "run":  # `run` took SIGINT over: it says so, and the import goes on
            assert "SIGINT: stopping" in proc.stderr.readline() + proc.stderr.readline()
            release.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "self test ran" not in out
    last = err.strip().splitlines()[-1]
    expected = {
        "run": "rxstream run: interrupted before the run started (SIGINT)",
        "test": "rxstream test: interrupted",
    }
    assert last == expected[command], err


def test_a_signal_before_the_session_opened_says_the_run_never_started(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while the ranks come up (the launch ends before its session opened): one line,
    "interrupted before the run started", exit 130, and no tables of "no stages"."""
    from rxstream import cli
    from rxstream.ranks._common import LaunchResult

    def interrupted(*args: object, **kwargs: object) -> LaunchResult:
        os.kill(os.getpid(), signal.SIGINT)  # the CLI's handler: a stop, not a raise
        return LaunchResult(2)

    monkeypatch.setattr("rxstream.ranks._launch.launch", interrupted)
    assert cli.main(["run", FRAMES_APP, "--ranks", "2"]) == 130
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[-1] == "rxstream run: interrupted before the run started (SIGINT)"
