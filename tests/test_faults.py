"""The fault suite: signals to ``rxstream run`` and to its ranks, and a rank that stops answering.

Every case runs ``python -m rxstream run tests/apps/frames_app.py`` (small frames at 50 fps,
``--out`` an MP4) in a session of its own, sends one signal once frames reach the file, and
checks what came of it: the exit status and a line naming the cause, no process of the run's
process group left, none of the run's own ``/dev/shm`` segments (``rxs_<pid>_…``) left, and,
after a signal the run can catch, an MP4 that PyAV decodes to the end. The 20 kills are drawn
once from a seeded generator (target, signal, delay, ranks, headless or served), so the suite
is the same on every run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rxstream.ranks._common import HEARTBEAT_ENV, HEARTBEAT_S, heartbeat_s

ROOT = Path(__file__).resolve().parent.parent
FRAMES_APP = str(ROOT / "tests" / "apps" / "frames_app.py")
STOPPED_HEARTBEAT_S = 1.5
"""The heartbeat (``RXSTREAM_HEARTBEAT_S``) of the run whose rank is stopped: named within
this, plus the controller's poll. The other runs keep the default, so that a rank starved of
the CPU for a moment on a loaded machine is not taken for a stopped one."""
CATCHABLE = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class Kill:
    """One fault: ``signum`` to ``target`` (``parent``, ``rank1`` or the whole ``group``)
    ``delay`` seconds after frames reached the file, in a run on ``ranks`` ranks."""

    target: str
    signum: int
    delay: float
    ranks: int
    serve: bool

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        how = "served" if self.serve else "headless"
        return f"{name}-{self.target}-{self.ranks}ranks-{how}-{self.delay:.2f}s"


def _draw(count: int, seed: int = 15) -> list[Kill]:
    """``count`` kills: every signal to the parent, to rank 1 and to the whole group of a run
    on 2 ranks, then random ones."""
    rng = random.Random(seed)
    signals = (*CATCHABLE, signal.SIGKILL)
    kills = [
        Kill(target, signum, round(rng.uniform(0, 0.5), 2), 2, rng.random() < 0.3)
        for target in ("parent", "rank1", "group")
        for signum in signals
    ]
    while len(kills) < count:
        ranks = rng.choice((1, 2))
        target = rng.choice(("parent", "group") if ranks == 1 else ("parent", "rank1", "group"))
        kills.append(
            Kill(
                target,
                rng.choice(signals),
                round(rng.uniform(0, 0.5), 2),
                ranks,
                rng.random() < 0.3,
            )
        )
    return kills


KILLS = _draw(20)


class Run:
    """``rxstream run`` of the frames app in a session of its own, SIGINT handled by default
    (a child of a non-interactive shell would inherit SIGINT ignored)."""

    def __init__(
        self,
        folder: Path,
        ranks: int,
        serve: bool = False,
        heartbeat: float = HEARTBEAT_S,
        nohup: bool = False,
    ) -> None:
        self.folder = folder
        self.video = folder / "video.mp4"
        command = [
            sys.executable, "-m", "rxstream", "run", FRAMES_APP, "--ranks", str(ranks),
            "--set", f"split={'true' if ranks > 1 else 'false'}", "--set", "fps=50",
            "--set", f"pids={folder}", "--out", str(self.video),
        ]  # fmt: skip
        if serve:
            command += ["--serve", "--port", "0"]
        env = {**os.environ, HEARTBEAT_ENV: str(heartbeat)}
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env=env, start_new_session=True, preexec_fn=_nohup if nohup else _default_signals,
        )  # fmt: skip
        self.ranks = ranks
        self.pids: dict[str, int] = {}
        self.out = self.err = ""

    def wait_running(self) -> None:
        """Until every rank wrote its pid and the first frame reached the file."""
        files = {
            "parent": self.folder / "rank0.pid",
            **{f"rank{r}": self.folder / f"rank{r}.pid" for r in range(1, self.ranks)},
        }
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            if all(f.exists() and f.read_text() for f in files.values()) and self._has_frames():
                self.pids = {name: int(f.read_text()) for name, f in files.items()}
                assert self.pids["parent"] == self.proc.pid
                return
            time.sleep(0.02)
        self.finish(kill=True)
        pytest.fail(f"the run never got going (status {self.proc.returncode}):\n{self.err}")

    def grows(self, fragments: int, timeout: float = 30) -> bool:
        """Whether the MP4 grew ``fragments`` more times (a fragment a second) while the run
        went on."""
        sizes = {self.video.stat().st_size}
        deadline = time.monotonic() + timeout
        while len(sizes) <= fragments and self.proc.poll() is None:
            if time.monotonic() > deadline:
                return False
            sizes.add(self.video.stat().st_size)
            time.sleep(0.02)
        return self.proc.poll() is None

    def _has_frames(self) -> bool:
        return self.video.exists() and self.video.stat().st_size > 0

    def send(self, target: str, signum: int) -> None:
        """Signal the parent, a rank, or the whole process group (as a terminal does)."""
        if target == "group":
            os.killpg(self.proc.pid, signum)
        else:
            os.kill(self.pids[target], signum)

    def finish(self, timeout: float = 30, kill: bool = False) -> int:
        """Wait for the run to end (kill its group first with ``kill``, or after ``timeout``);
        its exit status."""
        if kill:
            _killpg(self.proc.pid)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(self.proc.pid)
            out, err = self.proc.communicate()
            pytest.fail(f"the run did not end within {timeout} s:\n{self.err}{err}")
        self.out += out
        self.err += err
        return self.proc.returncode

    def leftovers(self) -> tuple[list[int], list[str]]:
        """The processes of the run's group and its own /dev/shm segments, once they had a
        few seconds to go."""
        deadline = time.monotonic() + 5
        while True:
            procs, shm = group_processes(self.proc.pid), own_segments(self.proc.pid)
            if not (procs or shm) or time.monotonic() > deadline:
                _killpg(self.proc.pid)  # leave nothing to the next test, whatever happened
                return procs, shm
            time.sleep(0.05)


def _default_signals() -> None:
    for signum in CATCHABLE:
        signal.signal(signum, signal.SIG_DFL)


def _nohup() -> None:
    _default_signals()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def group_processes(pgid: int) -> list[int]:
    """The live (not zombie) processes in process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def own_segments(pid: int) -> list[str]:
    """The /dev/shm segments process ``pid`` created (rings are named ``rxs_<pid>_…``)."""
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"rxs_{pid}_")]


def decoded_frames(path: Path) -> list[tuple[int, int]]:
    """The (width, height) of every frame PyAV decodes from ``path``, to its end."""
    av = pytest.importorskip("av")
    with av.open(str(path)) as container:
        return [(frame.width, frame.height) for frame in container.decode(video=0)]


def expected(kill: Kill) -> tuple[int, str]:
    """The exit status and the line on stderr that a kill must end the run with."""
    name = signal.Signals(kill.signum).name
    if kill.target == "rank1":
        if kill.signum == signal.SIGKILL:
            return 1, "rank 1 died (exit code -9: killed by SIGKILL)"
        if kill.signum == signal.SIGINT:  # a rank ignores it; the parent's SIGTERM ends the run
            return 143, "interrupted, stopped (SIGTERM)"
        return 1, f"rank 1 was stopped by {name} (sent to it alone)"
    if kill.signum == signal.SIGKILL:
        return -signal.SIGKILL, ""  # nothing can say it; the status does
    return 128 + kill.signum, f"interrupted, stopped ({name})"


@pytest.mark.slow
@pytest.mark.parametrize("kill", KILLS, ids=str)
def test_a_kill_is_reported_and_leaves_nothing_behind(kill: Kill, tmp_path: Path) -> None:
    """A signal to the run, a rank or both: status and cause said, nothing left, MP4 plays."""
    run = Run(tmp_path, kill.ranks, kill.serve)
    try:
        run.wait_running()
        time.sleep(kill.delay)  # the drawn moment in the run, not a wait for a condition
        run.send(kill.target, kill.signum)
        if kill.target == "rank1" and kill.signum == signal.SIGINT:
            run.send("parent", signal.SIGTERM)  # the rank ignored it: the run goes on till this
        status = run.finish()
    finally:
        if run.proc.poll() is None:
            run.finish(kill=True)
    procs, shm = run.leftovers()
    want_status, want_line = expected(kill)
    assert status == want_status, run.err
    assert want_line in run.err
    assert procs == []
    assert shm == []
    assert "resource_tracker" not in run.err  # nothing leaked to it, nothing unlinked twice
    if kill.target != "rank1" and kill.signum != signal.SIGKILL:
        assert f"items egressed on {kill.ranks} rank(s)" in run.out  # the statistics
        frames = decoded_frames(run.video)
        assert frames
        assert set(frames) == {(48, 32)}
    elif kill.target == "rank1":
        assert set(decoded_frames(run.video)) <= {(48, 32)}  # finished by the parent: plays


@pytest.mark.slow
def test_a_stopped_rank_is_named_killed_and_the_run_fails(tmp_path: Path) -> None:
    """SIGSTOP to rank 1: the heartbeat names it within its bound, kills it, the run fails."""
    run = Run(tmp_path, 2, heartbeat=STOPPED_HEARTBEAT_S)
    try:
        run.wait_running()
        run.send("rank1", signal.SIGSTOP)
        stopped = time.monotonic()
        status = run.finish()
        took = time.monotonic() - stopped
    finally:
        if run.proc.poll() is None:
            run.finish(kill=True)
    procs, shm = run.leftovers()
    assert status == 1, run.err
    assert "rank 1 stopped answering: nothing from it for" in run.err
    assert took < STOPPED_HEARTBEAT_S + 15  # generous: this machine is shared
    assert procs == []
    assert shm == []
    assert set(decoded_frames(run.video)) == {(48, 32)}


@pytest.mark.slow
def test_a_second_signal_forces_the_exit(tmp_path: Path) -> None:
    """A graceful stop held up by a stopped rank: the second SIGTERM kills it and exits 143."""
    run = Run(tmp_path, 2)
    try:
        run.wait_running()
        run.send("rank1", signal.SIGSTOP)  # the stop now waits for a rank that cannot answer
        run.send("parent", signal.SIGTERM)
        deadline = time.monotonic() + 30
        while "stopping (the same again forces an exit)" not in _peek(run) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)
        run.send("parent", signal.SIGTERM)
        status = run.finish()
    finally:
        if run.proc.poll() is None:
            run.finish(kill=True)
    procs, shm = run.leftovers()
    assert status == 143, run.err
    assert "SIGTERM again: forced exit, rank processes killed" in run.err
    assert procs == []
    assert shm == []


@pytest.mark.slow
def test_a_signal_ignored_by_whoever_started_the_run_stays_ignored(tmp_path: Path) -> None:
    """Under nohup (SIGHUP ignored) a hangup to the group stops nothing; SIGTERM still does."""
    run = Run(tmp_path, 2, nohup=True)
    try:
        run.wait_running()
        run.send("group", signal.SIGHUP)  # the terminal hung up: the parent and rank 1 get it
        assert run.grows(fragments=2)  # rank 1 still paints, the parent still writes
        assert "SIGHUP" not in _peek(run)
        run.send("parent", signal.SIGTERM)
        status = run.finish()
    finally:
        if run.proc.poll() is None:
            run.finish(kill=True)
    procs, shm = run.leftovers()
    assert status == 143, run.err
    assert "SIGHUP" not in run.err
    assert "interrupted, stopped (SIGTERM)" in run.err
    assert procs == []
    assert shm == []


def _peek(run: Run) -> str:
    """What the run wrote on stderr so far (read without blocking: the pipe is non-blocking)."""
    assert run.proc.stderr is not None
    os.set_blocking(run.proc.stderr.fileno(), False)
    chunk = run.proc.stderr.read() or ""
    run.err += chunk
    return run.err


def test_the_heartbeat_setting_is_checked() -> None:
    """RXSTREAM_HEARTBEAT_S must be a number of seconds > 0; the error names it and the value."""
    with pytest.MonkeyPatch.context() as patch:
        message = r"^RXSTREAM_HEARTBEAT_S must be a number of seconds > 0, got '0'$"
        patch.setenv(HEARTBEAT_ENV, "0")
        with pytest.raises(ValueError, match=message):
            heartbeat_s()
        patch.setenv(HEARTBEAT_ENV, "2.5")
        assert heartbeat_s() == 2.5
        patch.delenv(HEARTBEAT_ENV)
        assert heartbeat_s() == HEARTBEAT_S


_CRASHING_APP = """
import os
import signal

import numpy as np


def crash(frame):
    if int(frame.flat[0]) == 2:
        os.kill(os.getpid(), signal.SIGSEGV)  # as a crash in native code ends a process
    return frame


def build(ctx):
    frames = (np.full((4, 4), i, dtype=np.uint8) for i in range(100))
    return ctx.source(frames, rank=0) | ctx.pipe(crash, rank=1) | ctx.stream("out", rank=1)
"""


@pytest.mark.slow
def test_a_rank_a_signal_killed_is_said_with_the_signal_name(tmp_path: Path) -> None:
    """A rank that a signal ended (a segfault) is named with the signal, not a bare -11."""
    app = tmp_path / "crashing.py"
    app.write_text(_CRASHING_APP)
    done = subprocess.run(
        [sys.executable, "-m", "rxstream", "run", str(app), "--ranks", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "rxstream run: stage 'rank 1' failed: RuntimeError: rank 1 died "
        "(exit code -11: killed by SIGSEGV)"
    )
