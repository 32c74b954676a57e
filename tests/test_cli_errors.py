"""Every command's bad input: one line on stderr naming the problem and a non-zero exit, found
before anything runs; ``rxstream topology`` shows the limits in force and the rank layout; a
run's summary names a rank without stages."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rxstream import cli

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "examples" / "demo.py")
FRAMES_APP = str(ROOT / "tests" / "apps" / "frames_app.py")
RANKS_APP = str(ROOT / "tests" / "apps" / "ranks_app.py")


@pytest.fixture
def listening() -> Iterator[int]:
    """A port some other program already listens on (loopback)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


Case = Callable[[Path, int], tuple[list[str], str]]

CASES: dict[str, Case] = {
    "test: missing file": lambda tmp, _: (
        ["test", str(tmp / "nope.py")],
        r"^rxstream test: app file '.*nope\.py' does not exist$",
    ),
    "test: syntax error": lambda tmp, _: (
        ["test", _write(tmp / "broken.py", "def build(ctx:\n")],
        r"^rxstream test: '\(' was never closed \(broken\.py, line 1\)$",
    ),
    "test: neither build nor main": lambda tmp, _: (
        ["test", _write(tmp / "empty.py", "x = 1\n")],
        r"^rxstream test: app '.*empty\.py' has neither a build\(ctx\) -> Pipeline "
        r"nor an async def main\(ctx\)$",
    ),
    "run: missing file": lambda tmp, _: (
        ["run", str(tmp / "nope.py")],
        r"^rxstream run: app file '.*nope\.py' does not exist$",
    ),
    "run: build raises": lambda tmp, _: (
        ["run", _write(tmp / "raising.py", "def build(ctx):\n    return {}['codec']\n")],
        r"^rxstream run: app '.*raising\.py': build\(ctx\) raised KeyError: 'codec' "
        r"\(.*raising\.py:2 in build\)$",
    ),
    "run: syntax error": lambda tmp, _: (
        ["run", _write(tmp / "broken.py", "def build(ctx:\n")],
        r"^rxstream run: '\(' was never closed \(broken\.py, line 1\)$",
    ),
    "run: --out under a file": lambda tmp, _: (
        ["run", FRAMES_APP, "--out", f"{_write(tmp / 'plain', '')}/x.mp4"],
        r"^rxstream run: --out .*plain/x\.mp4: .*plain is a file, not a folder$",
    ),
    "run: --log is a folder": lambda tmp, _: (
        ["run", FRAMES_APP, "--log", str(tmp)],
        r"^rxstream run: --log .* is a folder; give a file name$",
    ),
    "run: port in use": lambda tmp, port: (
        ["run", FRAMES_APP, "--serve", "--port", str(port)],
        rf"^rxstream run: --port {port}: cannot listen on 127\.0\.0\.1:{port}: "
        r"Address already in use$",
    ),
    "topology: missing file": lambda tmp, _: (
        ["topology", str(tmp / "nope.py")],
        r"^rxstream topology: app file '.*nope\.py' does not exist$",
    ),
    "topology: syntax error": lambda tmp, _: (
        ["topology", _write(tmp / "broken.py", "def build(ctx:\n")],
        r"^rxstream topology: '\(' was never closed \(broken\.py, line 1\)$",
    ),
    "topology: unreadable config": lambda tmp, _: (
        ["topology", DEMO, "--config", str(tmp / "nope.yaml")],
        r"^rxstream topology: cannot read .*nope\.yaml: No such file or directory$",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_a_non_zero_exit(
    case: str, tmp_path: Path, listening: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing app, a syntax error, a bad output path or a taken port: one line, exit != 0."""
    argv, pattern = CASES[case](tmp_path, listening)
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert status != 0
    assert err.count("\n") == 1, err
    assert re.match(pattern, err.strip()), err


def test_a_missing_output_folder_is_created_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` into a folder that does not exist: the folder is made, and the run says so."""
    out = tmp_path / "made" / "here" / "x.mp4"
    assert cli.main(["run", FRAMES_APP, "--frames", "3", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"created the folder {out.parent}/ for --out" in err
    assert out.exists()


def test_a_failed_import_leaves_no_half_module(tmp_path: Path) -> None:
    """An app whose import fails can be loaded once fixed, in the same process."""
    from rxstream.launch import load_app

    app = tmp_path / "flaky_app.py"
    app.write_text("raise RuntimeError('not yet')\n")
    with pytest.raises(RuntimeError, match=r"^not yet$"):
        load_app(str(app))
    app.write_text("def build(ctx):\n    return ctx.source(range(1)) | ctx.stream('s')\n")
    assert load_app(str(app)).build is not None


def test_topology_shows_the_limits_a_config_lowers_and_the_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config`` shows each lowered bound beside the declared one; ``--ranks 3`` the layout."""
    config = _write(tmp_path / "serving.yaml", "client_streams:\n  pointer:\n    max_items: 50\n")
    assert cli.main(["topology", DEMO, "--config", config, "--ranks", "3"]) == 0
    out = capsys.readouterr().out
    assert "pointer: client -> rank0, max 50 items (serving config; declared unbounded)" in out
    assert "layout on 3 rank(s):" in out
    assert "  rank 1: render, decode, pace, video" in out
    assert "  rank 2: no stages" in out


def test_topology_refuses_a_config_over_the_bound_listing_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A serving config that does not fit the app exits 1 with every problem listed."""
    config = _write(tmp_path / "serving.yaml", "client_streams:\n  pointer:\n    max_items: -1\n")
    assert cli.main(["topology", DEMO, "--config", config]) == 1
    err = capsys.readouterr().err
    assert "max_items must be > 0, got -1 for client stream 'pointer'" in err


@pytest.mark.slow
def test_a_rank_without_stages_says_so_in_the_summary() -> None:
    """``run --ranks 3`` of a two-rank app: rank 2's table reads "no stages", not an empty one."""
    done = subprocess.run(
        [sys.executable, "-m", "rxstream", "run", RANKS_APP, "--ranks", "3", "--frames", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\nrank 2\nno stages\n\n" in done.stdout, done.stdout  # then the findings
    headers = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert headers == ["rank 0", "rank 1", "rank 2"]


NO_SINK_APP = "def build(ctx):\n    return ctx.source(range(100)) | ctx.pipe(abs, name='keep')\n"
NOT_A_PIPELINE_APP = "def build(ctx):\n    return 42\n"
TWO_STREAMS_APP = (
    "def build(ctx):\n"
    "    up = ctx.source(range(100))\n"
    "    return ctx.graph(up | ctx.stream('left'), up | ctx.stream('right'))\n"
)

USAGE: dict[str, Case] = {
    "run: --out of an app without a stream": lambda tmp, _: (
        [
            "run",
            _write(tmp / "nosink.py", NO_SINK_APP),
            "--frames",
            "20",
            "--out",
            str(tmp / "x.mp4"),
        ],
        r"^rxstream run: --out .*x\.mp4: the app has no ctx\.stream sink, so nothing would be "
        r"written \(--out writes one of its streams\)$",
    ),
    "run: --out-stream the app lacks": lambda tmp, _: (
        ["run", DEMO, "--frames", "3", "--out-stream", "audio", "--out", str(tmp / "a.mp4")],
        r"^rxstream run: --out-stream must be one of the app's streams \('video'\), "
        r"got 'audio'$",
    ),
    "run: --out of an app with two streams": lambda tmp, _: (
        ["run", _write(tmp / "two.py", TWO_STREAMS_APP), "--out", str(tmp / "a.mp4")],
        r"^rxstream run: --out .*a\.mp4: the app has 2 streams \('left', 'right'\); pick the "
        r"one to write with --out-stream$",
    ),
    "run: build returns no Pipeline": lambda tmp, _: (
        ["run", _write(tmp / "badret.py", NOT_A_PIPELINE_APP)],
        r"^rxstream run: app '.*badret\.py': build\(ctx\) must return a Pipeline, got int 42$",
    ),
    "topology: build returns no Pipeline": lambda tmp, _: (
        ["topology", _write(tmp / "badret.py", NOT_A_PIPELINE_APP)],
        r"^rxstream topology: app '.*badret\.py': build\(ctx\) must return a Pipeline, "
        r"got int 42$",
    ),
    "run: too few ranks": lambda tmp, _: (
        ["run", RANKS_APP, "--frames", "10"],
        r"^rxstream run: --ranks must be at least the ranks the app places stages on \(2\), "
        r"got 1: run it with --ranks 2$",
    ),
}


@pytest.mark.parametrize("case", sorted(USAGE))
def test_what_the_app_cannot_do_is_refused_before_anything_runs(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag the app cannot honour, or a build that is no Pipeline: one line, exit 2, no run."""
    argv, pattern = USAGE[case](tmp_path, 0)
    apps = set(tmp_path.iterdir())
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no self test, no statistics: nothing ran
    assert err.count("\n") == 1, err
    assert re.match(pattern, err.strip()), err
    assert set(tmp_path.iterdir()) == apps  # no file written


@pytest.mark.parametrize("flag", ["--out", "--log"])
@pytest.mark.parametrize("path", ["/proc/rxstream-x.out", "/proc/rxstream-a/b/x.out"])
def test_an_output_place_that_cannot_be_written_is_refused_naming_the_flag(
    flag: str, path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out``/``--log`` under /proc (writable by its bits for root): one line, exit 2."""
    assert cli.main(["run", FRAMES_APP, "--frames", "3", flag, path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert re.match(rf"^rxstream run: {flag} {path}: cannot write in the folder /proc: \w", err)


def test_a_refused_run_leaves_no_folder_nor_file_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked outputs are made only once every check passed: a later refusal leaves nothing."""
    argv = ["run", RANKS_APP, "--out", str(tmp_path / "made" / "x.mp4")]
    assert cli.main([*argv, "--log", str(tmp_path / "x.jsonl")]) == 2
    assert "run it with --ranks 2" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_stage_builder_given_no_callable_names_the_value() -> None:
    """``ctx.pipe(42)``: the error names the builder, the rule, the type and the value."""
    from rxstream import Context, StageBuildError

    with pytest.raises(StageBuildError, match=r"^ctx\.pipe needs a callable, got int 42$"):
        Context().pipe(42)  # type: ignore[arg-type]


def test_an_existing_output_file_that_is_not_writable_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ``--out`` file there already but not writable (its bits; root passes them, hence the
    patch): one line naming the flag, exit 2, the file untouched."""
    import os

    video = tmp_path / "old.mp4"
    video.write_bytes(b"old")
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != video)
    assert cli.main(["run", FRAMES_APP, "--frames", "3", "--out", str(video)]) == 2
    assert capsys.readouterr().err == f"rxstream run: --out {video}: the file is not writable\n"
    assert video.read_bytes() == b"old"


@pytest.mark.slow
def test_ranks_checking_one_output_at_once_never_refuse_each_other(tmp_path: Path) -> None:
    """Two ranks (threads) check one ``--out`` and one missing folder at once: no refusal, and
    no probe left behind (a probe by the target's own name raced: "File exists")."""
    import threading

    from rxstream.cli._run import _check_output

    paths = [str(tmp_path / "out.mp4"), str(tmp_path / "made" / "x.mp4")]
    start = threading.Barrier(2)
    problems: list[str] = []

    def rank() -> None:
        start.wait()
        for _ in range(1500):
            for path in paths:
                problem = _check_output("--out", path)
                if problem is not None:
                    problems.append(problem)

    ranks = [threading.Thread(target=rank) for _ in range(2)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join()
    assert problems == []
    assert list(tmp_path.iterdir()) == []


def test_a_dangling_symlink_output_is_written_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` a symlink to a file not there yet: accepted (not "File exists"), written."""
    real = tmp_path / "real.mp4"
    link = tmp_path / "link.mp4"
    link.symlink_to(real)
    assert cli.main(["run", FRAMES_APP, "--frames", "3", "--out", str(link)]) == 0, (
        capsys.readouterr().err
    )
    assert real.stat().st_size > 0
