"""``rxstream run`` and ``rxstream test``: flags, typed settings, serving configs, the session's
file and log, the status line, Ctrl-C, and the self test under the CPU harness."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

import rxstream
from rxstream import PipelineError, cli
from rxstream._settings import split_setting, typed_settings
from rxstream.ipc import ShmRing
from rxstream.launch import SettingError, launch, load_app
from rxstream.ranks._egress import Egress
from rxstream.topology import ClientStreamLimitExceeded
from rxstream.transport import MemoryTransport, Session

ROOT = Path(__file__).resolve().parent.parent
APPS = ROOT / "tests" / "apps"
FRAMES_APP = str(APPS / "frames_app.py")
MAIN_APP = str(APPS / "main_app.py")
FAILING_APP = str(APPS / "failing_app.py")
RANKS_APP = str(APPS / "ranks_app.py")
MAIN_RANKS_APP = str(APPS / "main_ranks_app.py")


def rxstream_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m rxstream ARGS`` in a subprocess (stdout and stderr are pipes, not a TTY)."""
    return subprocess.run(
        [sys.executable, "-m", "rxstream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def decoded_frames(path: Path) -> list[tuple[int, int]]:
    """The (width, height) of every frame PyAV decodes from the video file at ``path``."""
    av = pytest.importorskip("av")
    with av.open(str(path)) as container:
        return [(frame.width, frame.height) for frame in container.decode(video=0)]


def serving_config(tmp_path: Path, streams: dict[str, Any]) -> str:
    """A serving config file with these ``client_streams``."""
    path = tmp_path / "serving.yaml"
    path.write_text(json.dumps({"client_streams": streams}))  # JSON is YAML
    return str(path)


def shm_segments(pid: int | None = None) -> set[str]:
    """The shared-memory segments that exist now; with ``pid``, only those that process made
    (rings are named ``rxs_<pid>_…``; /dev/shm is shared with everything else)."""
    names = set(os.listdir("/dev/shm"))
    return names if pid is None else {n for n in names if n.startswith(f"rxs_{pid}_")}


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (and is not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- --set: typed by the doc --------------------------------------------------------------------


def test_set_values_are_typed_by_the_doc_values() -> None:
    """--set types each value like the doc's value at its dotted key; unknown keys read JSON."""
    doc = rxstream.Context().doc(
        "control",
        defaults={
            "steps": 4,
            "gain": 0.5,
            "on": False,
            "prompt": "sea",
            "vae": {"model": "smooth"},
            "tags": [],
            "seed": None,
        },
    )
    settings = [
        "steps=8",
        "gain=2",
        "on=yes",
        "prompt=123",
        "vae.model=sharp",
        'tags=["a", 1]',
        "seed=7",
        'extra={"x": true}',
    ]
    assert typed_settings(doc, settings) == {
        "steps": 8,
        "gain": 2.0,
        "on": True,
        "prompt": "123",
        "vae": {"model": "sharp"},
        "tags": ["a", 1],
        "seed": 7,
        "extra": {"x": True},
    }


@dataclass
class _Schema:
    mode: Literal["fast", "slow"] = "fast"
    limit: int | None = None
    label: str | int = "a"
    ratio: float = 1.0


def test_set_values_follow_a_dataclass_schema() -> None:
    """With a dataclass schema, Literal, X | None and unions type the value by annotation."""
    doc = rxstream.Context().doc("control", schema=_Schema)
    assert typed_settings(doc, ["mode=slow", "limit=5", "label=7", "ratio=3"]) == {
        "mode": "slow",
        "limit": 5,
        "label": 7,
        "ratio": 3.0,
    }
    assert typed_settings(doc, ["limit=null", "label=x"]) == {"limit": None, "label": "x"}
    with pytest.raises(
        SettingError, match=r"^--set mode=medium: refused: control\.mode must be one of "
    ):
        typed_settings(doc, ["mode=medium"])
    with pytest.raises(
        SettingError,
        match=r"^--set limit=lots: refused: control\.limit must be an int or null, got 'lots'$",
    ):
        typed_settings(doc, ["limit=lots"])


def test_set_errors_name_the_setting_the_rule_and_the_value() -> None:
    """A value that cannot be typed, a clash and a malformed KEY=VALUE are SettingErrors."""
    doc = rxstream.Context().doc("control", defaults={"steps": 4, "on": False, "vae": {"m": "a"}})
    with pytest.raises(
        SettingError, match=r"^--set steps=abc: refused: control\.steps must be an int, got 'abc'$"
    ):
        typed_settings(doc, ["steps=abc"])
    with pytest.raises(
        SettingError,
        match=(
            r"^--set on=maybe: refused: control\.on must be a bool \(true or false\), "
            r"got 'maybe'$"
        ),
    ):
        typed_settings(doc, ["on=maybe"])
    with pytest.raises(
        SettingError,
        match=r"^--set vae=3: refused: control\.vae must be JSON \(an object\), got '3'$",
    ):
        typed_settings(doc, ["vae=3"])
    with pytest.raises(
        SettingError,
        match=r"^--set vae\.m\.x=1: refused: control\.vae\.m was set to a value already",
    ):
        typed_settings(doc, ["vae.m=b", "vae.m.x=1"])
    for malformed in ("steps", "=3", "a..b=1", " a=1"):
        with pytest.raises(SettingError, match=r"^--set takes KEY=VALUE with a dotted KEY"):
            split_setting(malformed)


def test_run_set_reaches_the_app_typed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rxstream run --set` writes nested, typed values before build reads the doc."""
    report = tmp_path / "state.json"
    status = cli.main(
        [
            "run",
            FRAMES_APP,
            "--frames",
            "2",
            "--set",
            "size.height=8",
            "--set",
            "gain=2",
            "--set",
            "mode=flat",
            "--set",
            "limit=5",
            "--set",
            'tags=["a","b"]',
            "--set",
            f"report={report}",
        ]
    )
    assert status == 0, capsys.readouterr().err
    state = json.loads(report.read_text())
    assert state["size"] == {"height": 8, "width": 48}
    assert (state["gain"], state["mode"], state["limit"], state["tags"]) == (
        2.0,
        "flat",
        5,
        ["a", "b"],
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "size.height=7",
            "rxstream run: --set size.height=7: refused: control.size: height and width must "
            "be even and >= 2, got 7x48",
        ),
        (
            "fps=fast",
            "rxstream run: --set fps=fast: refused: control.fps must be a number, got 'fast'",
        ),
        (
            "mode=zigzag",
            "rxstream run: --set mode=zigzag: refused: control.mode must be one of 'ramp', 'flat', "
            "got 'zigzag'",
        ),
        (
            "nope=1",
            "rxstream run: --set nope=1: refused: control.nope is not a field of the doc "
            "(fields there: fps, gain, limit, mode, pids, report, size, split, steer_every, "
            "tags), got 1\n",
        ),
        ("=1", "rxstream run: --set takes KEY=VALUE with a dotted KEY"),
    ],
)
def test_run_refused_setting_exits_2_naming_it(
    setting: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --set value the doc refuses (or cannot be typed) exits 2 naming key, rule and value."""
    assert cli.main(["run", FRAMES_APP, "--frames", "1", "--set", setting]) == 2
    assert capsys.readouterr().err.startswith(message)


# --- --frames, --out, --log ---------------------------------------------------------------------


def test_run_frames_stops_after_n_egressed(capsys: pytest.CaptureFixture[str]) -> None:
    """--frames N stops the run once the sink egressed N frames; no status line off a TTY."""
    assert cli.main(["run", FRAMES_APP, "--frames", "7"]) == 0
    out, err = capsys.readouterr()
    assert "7 items egressed on 1 rank(s)" in out
    assert "rank 0" in out
    assert "\r" not in err
    assert "fps" not in err


@pytest.mark.slow
def test_run_two_ranks_writes_the_mp4_and_the_log_from_the_sink_rank(tmp_path: Path) -> None:
    """With the sink on rank 1, --out gets exactly N decodable frames and --log its records."""
    video, log = tmp_path / "out" / "run.mp4", tmp_path / "timing.jsonl"
    done = rxstream_cli(
        "run", FRAMES_APP, "--ranks", "2", "--set", "split=true", "--frames", "12",
        "--out", str(video), "--log", str(log),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "12 items egressed on 2 rank(s)" in done.stdout
    assert "\r" not in done.stderr  # stderr is a pipe: no status line
    assert decoded_frames(video) == [(48, 32)] * 12
    records = [json.loads(line) for line in log.read_text().splitlines()]
    timing = [r for r in records if r["event"] == "[timing:video]"]
    assert timing, records
    assert all(r["cutover"] and r["origin"] == "steer" for r in timing)
    summary = rxstream_cli("timing", str(log))
    assert summary.returncode == 0, summary.stderr


def test_timing_log_is_another_spelling_of_log() -> None:
    """--timing-log (what torchrun lets through) sets the same option as --log."""
    from rxstream.cli import _parser

    args = _parser().parse_args(["run", "app.py", "--timing-log", "t.jsonl"])
    assert args.log == "t.jsonl"


# --- main(ctx) apps -----------------------------------------------------------------------------


def test_load_app_finds_main_and_build() -> None:
    """load_app finds both entries; :build picks one; a main(seconds, log) is not an app main."""
    both = load_app(MAIN_APP)
    assert both.main is not None
    assert both.build is not None
    only_build = load_app(f"{MAIN_APP}:build")
    assert (only_build.main, only_build.build) == (None, both.build)
    assert load_app(str(ROOT / "examples" / "two_ranks.py")).main is None
    with pytest.raises(AttributeError, match=r"has neither a build\(ctx\) -> Pipeline nor"):
        load_app(str(ROOT / "rxstream" / "item.py"))


def test_run_main_app_writes_its_frames(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A main(ctx) app runs on rank 0; its session ends at --frames and the MP4 holds them."""
    video = tmp_path / "main.mp4"
    assert cli.main(["run", MAIN_APP, "--frames", "5", "--out", str(video)]) == 0
    out = capsys.readouterr().out
    assert "fed 10 clicks" in out
    assert "items egressed on 1 rank(s)" in out
    assert "clicks" in out.split("rank 0", 1)[1]  # its statistics table
    assert decoded_frames(video) == [(16, 16)] * 5


MAIN_ONLY_APP = """\
import numpy as np


async def main(ctx):
    pipeline = ctx.input("clicks") | ctx.pipe(lambda c: np.zeros((16, 16, 3), np.uint8))
    await (pipeline | ctx.stream("video")).run()
"""


def test_run_main_app_with_a_bad_out_stream_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A main app's streams are known once its session opens: a bad ``--out-stream`` fails
    the run then (exit 1), naming the flag as the build-app path does."""
    app = tmp_path / "main_only.py"  # (no build: nothing to check before the run)
    app.write_text(MAIN_ONLY_APP)
    video = tmp_path / "main.mp4"
    args = ["run", str(app), "--frames", "5", "--out", str(video), "--out-stream", "audio"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "rxstream run: --out-stream must be one of the app's streams ('video'), got 'audio'"
    )
    assert "FileTransport" not in err


@pytest.mark.parametrize("entry", [MAIN_APP, f"{MAIN_APP}:build"])
def test_launch_refuses_an_out_stream_the_app_lacks(entry: str, tmp_path: Path) -> None:
    """``launch(out_stream=)`` naming no stream of the app (main or build) is an
    ArgumentError naming the argument, not the FileTransport's."""
    with pytest.raises(rxstream.ArgumentError) as caught:
        launch(entry, 1, frames=2, timeout=60, out=tmp_path / "a.mp4", out_stream="audio")
    assert str(caught.value) == (
        "out_stream must be one of the app's streams ('video'), got 'audio'"
    )


TWICE_APP = """\
import numpy as np


def build(ctx):
    paint = ctx.pipe(lambda i: np.full((16, 16, 3), i, np.uint8), name="paint", rank=ctx.world - 1)
    return ctx.source(range(3)) | paint | ctx.stream("video", rank=ctx.world - 1)


async def main(ctx):
    pipeline = build(ctx)
    await pipeline.run()
    await pipeline.run()
"""


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_main_app_s_egressed_sums_every_run(ranks: int, tmp_path: Path) -> None:
    """A main app that runs its pipeline twice (3 items each): ``egressed`` counts both runs'
    (on 2 ranks, with ``out``: rank 1's forwarded items counted once), the statistics the
    last run's."""
    app = tmp_path / f"twice{ranks}.py"
    app.write_text(TWICE_APP)
    video = tmp_path / "twice.mp4"
    result = launch(str(app), ranks, timeout=60, out=video if ranks > 1 else None)
    assert (result.egressed, result.refused) == (6, 0)
    assert result.statistics[ranks - 1]["video"].items_out == 3
    if ranks > 1:
        assert len(decoded_frames(video)) == 6


def test_run_main_app_without_build_on_several_ranks_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--ranks 2 with a main(ctx) app that has no build(ctx) exits 2 saying the ranks need it."""
    assert cli.main(["run", f"{MAIN_APP}:main", "--ranks", "2"]) == 2
    assert capsys.readouterr().err == (
        "rxstream run: an async main(ctx) app runs on 2 ranks only with a build(ctx) -> "
        "Pipeline too (ranks 1..1 call it to build the graph main runs); "
        f"'{MAIN_APP}:main' has none\n"
    )


# --- main(ctx) apps on several ranks ------------------------------------------------------------


@pytest.fixture
def rings_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the rings this process creates in the test; none may be left in /dev/shm."""
    names: list[str] = []
    create = ShmRing.create

    def spy(**options: Any) -> ShmRing:
        ring = create(**options)
        names.append(ring.name)
        return ring

    monkeypatch.setattr(ShmRing, "create", spy)
    yield names
    assert set(names) & shm_segments() == set()


def test_run_main_app_on_two_ranks_egresses_the_frames_from_rank_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rings_made: list[str]
) -> None:
    """--ranks 2: main runs on rank 0 and its rank-1 stages in rank 1's process, to --frames."""
    seen = tmp_path / "rank1.pid"
    args = ["run", MAIN_RANKS_APP, "--ranks", "2", "--frames", "20", "--set", f"seen={seen}"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "20 items egressed on 2 rank(s)" in out
    rank0, rank1 = out.split("\nrank 0\n", 1)[1].split("\nrank 1\n", 1)
    assert re.search(r"^ticks +input ", rank0, re.MULTILINE)
    assert not re.search(r"^work ", rank0, re.MULTILINE)
    assert re.search(r"^work +pipe +\d+ +\d+ ", rank1, re.MULTILINE)
    assert re.search(r"^out +stream +\d+ +20 ", rank1, re.MULTILINE)
    assert rings_made  # the ticks>work boundary
    assert not alive(int(seen.read_text()))


def test_doc_writes_of_a_main_app_reach_its_stages_on_rank_1(
    tmp_path: Path, rings_made: list[str]
) -> None:
    """main's writes reach rank 1: the one before run() at spawn (a steer, its generation too),
    the one during it at once."""
    page = MemoryTransport(keep=100)
    result = launch(
        MAIN_RANKS_APP, 2, frames=20, transport=page, settings=[f"seen={tmp_path / 'seen'}"]
    )
    payloads = page.payloads("out")
    assert [p["n"] for p in payloads] == list(range(1, 21))
    assert {(p["rank"], p["pid"]) for p in payloads} == {(1, payloads[0]["pid"])}
    assert payloads[0]["pid"] != os.getpid()
    tags = [p["tag"] for p in payloads]
    assert tags[0] == "before run"  # rank 1 read it before main wrote "during run"
    assert tags[-1] == "during run"
    assert tags == sorted(tags)  # once read there, the new value stays
    assert {p["generation"] for p in payloads} == {1}  # rank 1 knows the steer before run()
    # no item dropped as stale (rank 1 knew the generation from the start); ticks main fed
    # after the 20th may still sit in work's inbox when the run halts: those count `stopped`
    assert set(result.statistics[1]["work"].dropped) <= {"stopped"}
    assert (result.ranks, result.egressed, sorted(result.statistics)) == (2, 20, [0, 1])
    assert not alive(payloads[0]["pid"])


@pytest.mark.parametrize(
    ("mode", "cause"),
    [
        ("raise", r"stage 'work' failed on item pts=\d+ input_seq=\d+: RuntimeError: "
                  r"rank 1 broke on tick 5"),
        ("die", r"rank 1 died \(exit code 3\)"),
    ],
    ids=["raise", "die"],
)  # fmt: skip
def test_a_failing_rank_1_ends_main_s_run_naming_it(
    mode: str,
    cause: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    rings_made: list[str],
) -> None:
    """A rank-1 stage raising, or rank 1 dying, raises a PipelineError naming rank 1 in main."""
    seen = tmp_path / "rank1.pid"
    with pytest.raises(PipelineError, match=rf"^stage 'rank 1' failed: RuntimeError: {cause}$"):
        launch(MAIN_RANKS_APP, 2, settings=[f"mode={mode}", f"seen={seen}"], timeout=60)
    assert "main caught: stage 'rank 1' failed: RuntimeError: " in capsys.readouterr().out
    assert not alive(int(seen.read_text()))


# --- --config -----------------------------------------------------------------------------------


def test_config_lowers_the_limit_a_main_app_meets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A serving config lowering max_items to 3: the app's 4th click is refused."""
    config = serving_config(tmp_path, {"clicks": {"max_items": 3}})
    assert cli.main(["run", MAIN_APP, "--frames", "3", "--timeout", "30", "--config", config]) == 0
    out = capsys.readouterr().out
    assert (
        "refused after 3: client stream 'clicks' is limited to 3 items per session; "
        "this sample would bring it to 4 items"
    ) in out


class _Clicker(MemoryTransport):
    """A client: on open, clicks until the session refuses a click."""

    def __init__(self) -> None:
        super().__init__(keep=None)
        self.accepted = 0
        self.refused: ClientStreamLimitExceeded | None = None

    def open(self, session: Session) -> None:
        try:
            for click in range(1, 11):
                session.feed("clicks", click, None)
                self.accepted += 1
        except ClientStreamLimitExceeded as exc:
            self.refused = exc


def test_config_lowers_the_limit_a_client_of_a_build_app_meets(tmp_path: Path) -> None:
    """launch(serving=…) lowers a build app's input bound for the session's client."""
    clicker = _Clicker()
    config = {"client_streams": {"clicks": {"max_items": 4}}}
    result = launch(f"{MAIN_APP}:build", 1, serving=config, transport=clicker, frames=4, timeout=30)
    assert clicker.accepted == 4
    assert clicker.refused is not None
    assert (clicker.refused.stream, clicker.refused.bound) == ("clicks", 4)
    assert result.egressed == 4
    assert clicker.counts == {"video": 4}


def test_config_over_the_declared_bound_is_rejected_listing_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A serving config raising a bound, naming an unknown stream: exit 2, both listed."""
    config = serving_config(tmp_path, {"clicks": {"max_items": 30}, "nope": {"max_items": 1}})
    assert cli.main(["run", f"{MAIN_APP}:build", "--frames", "1", "--config", config]) == 2
    err = capsys.readouterr().err
    assert (
        "max_items must be <= 10 (declared by the model), got 30 for client stream 'clicks'" in err
    )
    assert "client_streams.nope is not a client stream of the model (client streams: clicks)" in err


def test_config_that_cannot_be_read_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing serving config file exits 2 naming it."""
    missing = tmp_path / "missing.yaml"
    assert cli.main(["run", FRAMES_APP, "--config", str(missing)]) == 2
    assert (
        capsys.readouterr().err
        == f"rxstream run: cannot read {missing}: No such file or directory\n"
    )


# --- --serve ------------------------------------------------------------------------------------


def test_serve_refuses_a_remote_host_and_stray_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """--host 0.0.0.0 needs --allow-remote; --host without --serve is a usage error."""
    assert cli.main(["run", FRAMES_APP, "--serve", "--host", "0.0.0.0"]) == 2
    assert "host must be a loopback address" in capsys.readouterr().err
    assert cli.main(["run", FRAMES_APP, "--host", "127.0.0.1"]) == 2
    assert "--host, --port and --allow-remote go with --serve" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_prints_the_url_of_the_page() -> None:
    """--serve --port 0 prints the page's URL on stderr and serves the page there."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rxstream", "run", FRAMES_APP, "--serve", "--port", "0",
         "--timeout", "2", "--set", "fps=20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert re.match(
            r"^rxstream run: .* serving the page at http://127\.0\.0\.1:\d+/\?token=\S+$", line
        ), line
        url = line.split()[-1]  # the last word: nothing glued to it
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200
            assert b"<html" in page.read()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.communicate()


# --- the status line, Ctrl-C --------------------------------------------------------------------


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.slow
def test_status_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a TTY, stderr gets a line of per-stage fps, depth and drops, rewritten, then erased."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["run", FRAMES_APP, "--frames", "30", "--set", "fps=30"]) == 0
    text = terminal.getvalue()
    lines = [part for part in text.split("\r") if "fps" in part]
    assert lines, text
    for stage in ("counter", "paint", "video"):
        assert f"{stage} " in lines[-1]
    assert re.search(r"paint [\d.]+ fps q\d/2", lines[-1]), lines[-1]
    assert text.endswith("\r\x1b[K")  # erased before the statistics were printed


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_and_closes_the_file(tmp_path: Path) -> None:
    """SIGINT to the run's process group: exit 130, rank processes gone, no shm, MP4 playable."""
    video = tmp_path / "cut.mp4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rxstream", "run", FRAMES_APP, "--ranks", "2",
         "--set", "split=true", "--set", "fps=50", "--set", f"pids={tmp_path}",
         "--out", str(video)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "Ctrl-C stops" in line, line + proc.stderr.read()
        pidfiles = [tmp_path / f"rank{r}.pid" for r in (0, 1)]
        deadline = time.monotonic() + 30
        while not all(p.exists() for p in pidfiles) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # let frames reach the file
        pids = [int(p.read_text()) for p in pidfiles]
        assert pids[0] == proc.pid
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does
        assert proc.wait(timeout=30) == 130
        assert "rxstream run: interrupted, stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    deadline = time.monotonic() + 5
    while (alive(pids[1]) or shm_segments(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pids[1])
    assert shm_segments(proc.pid) == set()
    frames = decoded_frames(video)
    assert frames
    assert set(frames) == {(48, 32)}


def test_ctrl_c_stops_a_main_app_and_closes_the_file(tmp_path: Path) -> None:
    """SIGINT during a main(ctx) app's session: main is cancelled, exit 130, the MP4 plays."""
    video = tmp_path / "main.mp4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rxstream", "run", MAIN_APP, "--out", str(video)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "fed 10 clicks\n"  # the session holds until Ctrl-C
        time.sleep(0.3)  # let the frames reach the file
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    assert "rxstream run: interrupted, stopped" in err
    assert decoded_frames(video) == [(16, 16)] * 10


@pytest.mark.slow
def test_ctrl_c_stops_a_main_app_on_every_rank(tmp_path: Path) -> None:
    """SIGINT during a main(ctx) app's run on 2 ranks: exit 130, rank 1 gone, no shm left."""
    seen = tmp_path / "rank1.pid"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rxstream", "run", MAIN_RANKS_APP, "--ranks", "2",
         "--set", f"seen={seen}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (seen.exists() and seen.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        rank1 = int(seen.read_text())  # rank 1 runs its stage
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    assert "rxstream run: interrupted, stopped" in err
    deadline = time.monotonic() + 5
    while shm_segments(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shm_segments(proc.pid) == set()
    assert not alive(rank1)


class _LatePage(MemoryTransport):
    """A page-like session transport: detached until opened, then attached until it leaves."""

    def __init__(self) -> None:
        super().__init__(keep=1)
        self.opened = False

    @property
    def connected(self) -> bool:
        return self.opened and super().connected

    def open(self, session: Session) -> None:
        self.opened = True


def test_a_session_not_yet_open_does_not_end_the_run() -> None:
    """Before the session opens a detached transport does not end it; after, its leaving does."""
    page = _LatePage()
    egress = Egress(page, out=None, out_stream=None, frames=None, on_open=None)
    assert not egress.ended  # a main(ctx) app still in its self test keeps its session
    egress.open(Session())
    assert egress.connected
    assert not egress.ended
    page.disconnect()
    assert egress.ended


# --- rxstream test ------------------------------------------------------------------------------


@pytest.mark.parametrize("app", [FRAMES_APP, MAIN_APP])
def test_self_test_passes(app: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`rxstream test` exits 0 when the block passes, for a build and for a main app."""
    assert cli.main(["test", app]) == 0
    assert f"rxstream test: {app}: self test passed" in capsys.readouterr().out


def test_self_test_failure_exits_1_with_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """A failing block exits 1 showing the failure and its traceback's tail."""
    assert cli.main(["test", FAILING_APP]) == 1
    err = capsys.readouterr().err
    assert (
        f"rxstream test: {FAILING_APP}: self test failed: AssertionError: "
        "frame shape (4, 4, 3), wanted (8, 8, 3)"
    ) in err
    assert 'failing_app.py", line 12, in check_frame' in err
    assert err.rstrip().endswith("AssertionError: frame shape (4, 4, 3), wanted (8, 8, 3)")


def test_a_failed_self_test_is_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    """`rxstream run` and `rxstream test` of an app whose block fails say the failure once:
    no ``self_test_failed`` log line beside their own."""
    for command in ("run", "test"):
        assert cli.main([command, FAILING_APP]) == 1
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if "self test failed" in line]
        assert len(said) == 1, err
        assert "self_test_failed" not in err


def test_self_test_missing_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An app without a self test block exits 2."""
    assert cli.main(["test", RANKS_APP]) == 2
    assert "has no self test" in capsys.readouterr().err


FAILS_AT_3_APP = """\
import numpy as np


def build(ctx):
    def paint(index):
        if index == 3:
            raise RuntimeError("paint broke at frame 3")
        return np.full((16, 16, 3), index, dtype=np.uint8)

    return ctx.source(range(100)) | ctx.pipe(paint, name="paint") | ctx.stream("video")
"""


def test_a_failed_run_names_the_video_and_log_it_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stage that raises: the error, and the MP4 (with its frames) and log that stay."""
    app = tmp_path / "fails.py"
    app.write_text(FAILS_AT_3_APP)
    video, log = tmp_path / "v.mp4", tmp_path / "t.jsonl"
    assert cli.main(["run", str(app), "--out", str(video), "--log", str(log)]) == 1
    out, err = capsys.readouterr()
    assert "paint broke at frame 3" in err
    frames = len(decoded_frames(video)) if video.exists() else 0
    shown = f"({frames} frame{'s' * (frames != 1)})" if frames else "not written"
    assert out.splitlines() == [
        f"video: {video} {shown}" if frames else f"video: {video} {shown} (no frame reached it)",
        f"timing log: {log}: no timing record written (no input or steer reached a sink)",
    ]


def test_a_log_with_no_timing_record_is_said_so_and_no_summary_suggested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--log`` of a run whose sink saw no input or steer: the line says no record was
    written and suggests no ``rxstream timing`` (which would exit 1 on the file)."""
    log = tmp_path / "t.jsonl"
    args = ["run", FRAMES_APP, "--frames", "2", "--set", "steer_every=0", "--log", str(log)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    said = f"timing log: {log}: no timing record written (no input or steer reached a sink)"
    assert said in out.splitlines()
    assert "summarise it with" not in out
    assert cli.main(["timing", str(log)]) == 1  # what the line no longer suggests


def test_a_run_that_wrote_no_frame_does_not_claim_an_older_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` over a file from before, and a stage that fails at the first frame: the line
    says nothing was written, and the old file is not named as this run's."""
    app = tmp_path / "fails_at_once.py"  # (load_app keeps a module by its file's name)
    app.write_text(FAILS_AT_3_APP.replace("index == 3", "index == 0"))
    video = tmp_path / "v.mp4"
    assert cli.main(["run", FRAMES_APP, "--frames", "2", "--out", str(video)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"video: {video} (2 frames)"
    assert cli.main(["run", str(app), "--out", str(video)]) == 1
    assert capsys.readouterr().out == (
        f"video: {video} not written (no frame reached it; the file is an older one)\n"
    )
