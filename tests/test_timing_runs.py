"""Which run a timing line belongs to: the run id on every ``[timing:…]``/``[photon:…]`` line,
``load`` keeping it, the photon join within a run, and ``rxstream timing`` on a log of runs."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog

import rxstream
from rxstream import ArgumentError, cli
from rxstream.timing import (
    ClientTiming,
    HopTiming,
    LoggedRun,
    TimingRecord,
    configure_logging,
    format_summary,
    load,
    summarize,
)
from rxstream.timing import _emit as timing_emit
from rxstream.timing._analysis import plotted
from rxstream.timing._client import ClockOffset
from rxstream.timing._emit import emit
from rxstream.transport._photon import PhotonJoin, Shown, log_photon

ROOT = Path(__file__).resolve().parent.parent
FRAMES_APP = str(ROOT / "tests" / "apps" / "frames_app.py")
MAIN_RANKS_APP = str(ROOT / "tests" / "apps" / "main_ranks_app.py")
RUN_ID = re.compile(r"^[0-9a-f]{12}$")


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``check`` until it holds; raise (never hang) if it does not."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """Whatever the test configures, structlog's config is restored and the log file closed."""
    saved = structlog.get_config()
    try:
        yield
    finally:
        opened = timing_emit._opened
        if opened is not None:
            opened.close()
            timing_emit._opened = None
        structlog.reset_defaults()
        structlog.configure(**saved)


def lines_of(path: Path, prefix: str = "[timing:") -> list[dict[str, Any]]:
    """The JSON lines of the log at ``path`` whose event starts with ``prefix``."""
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [e for e in entries if str(e.get("event", "")).startswith(prefix)]


def mouse_pipeline(ctx: rxstream.Context) -> rxstream.Pipeline:
    """mouse | work | video."""
    return ctx.input("mouse") | ctx.pipe(lambda x: x + 1, name="work") | ctx.stream("video")


def threaded_run(pipeline: rxstream.Pipeline, samples: int) -> str:
    """Start ``pipeline``, feed ``samples`` inputs, wait for them at the sink, stop; its id."""
    pipeline.start()
    try:
        for sample in range(samples):
            pipeline.feed("mouse", sample)
        wait_until(
            lambda: pipeline.statistics()["video"].items_out == samples, f"{samples} items out"
        )
    finally:
        pipeline.stop()
    run_id = pipeline.run_id
    assert run_id is not None
    return run_id


def notebook_log(path: Path, samples: tuple[int, ...]) -> list[str]:
    """A notebook's log: per run, ``configure_logging(path)`` again (appending) and a threaded
    run of that many inputs; the runs' ids."""
    ids = []
    for count in samples:
        configure_logging(path)
        ids.append(threaded_run(mouse_pipeline(rxstream.Context()), count))
    return ids


# --- the id on every line -------------------------------------------------------------------


def test_each_run_and_drive_session_gets_its_own_id(
    ctx: rxstream.Context, restored_logging: None, tmp_path: Path
) -> None:
    """run_id: None before a run; one per driven session (kept across drives, new after reset)
    and per threaded run; every [timing:…] line of the run carries it as ``run``."""
    path = tmp_path / "t.jsonl"
    configure_logging(path)
    pipeline = mouse_pipeline(ctx)
    assert pipeline.run_id is None
    pipeline.feed("mouse", 1)
    pipeline.drive(frames=1)
    session = pipeline.run_id
    assert session is not None
    assert RUN_ID.match(session)
    pipeline.feed("mouse", 2)
    pipeline.drive(frames=1)
    assert pipeline.run_id == session  # a session of drives is one run
    pipeline.reset()
    pipeline.feed("mouse", 3)
    pipeline.drive(frames=1)
    second = pipeline.run_id
    assert second not in (None, session)
    threaded = threaded_run(pipeline, 4)
    assert threaded not in (session, second)
    runs = [line["run"] for line in lines_of(path)]
    assert runs == [session, session, second, *[threaded] * 4]


def test_a_record_made_outside_a_run_has_the_empty_run() -> None:
    """A TimingRecord made by hand has run "" and writes it; from_fields of an old line too."""
    record = TimingRecord("s", 1, 0, False, 0, 0, "input.recv", 1.0, None, (HopTiming("h", 1, 0),))
    assert record.run == ""
    assert record.fields()["run"] == ""
    old = {k: v for k, v in record.fields().items() if k != "run"}
    assert TimingRecord.from_fields(old).run == ""
    assert TimingRecord.from_fields({**old, "run": "abc"}).run == "abc"


def test_photon_lines_carry_the_run_of_their_record(restored_logging: None, tmp_path: Path) -> None:
    """log_photon writes the record's run on the [photon:…] line."""
    path = tmp_path / "p.jsonl"
    configure_logging(path)
    log_photon(record_of("a1a1a1a1a1a1", 3), client(), page=1)
    (line,) = lines_of(path, "[photon:")
    assert (line["run"], line["input_seq"]) == ("a1a1a1a1a1a1", 3)


# --- a multi-rank launch is one run ---------------------------------------------------------


def test_a_two_rank_launch_is_one_run(restored_logging: None, tmp_path: Path) -> None:
    """The sink on rank 1 logs the id rank 0 chose for the launch (LaunchResult.run_id)."""
    log = tmp_path / "timing.jsonl"
    result = rxstream.launch(
        FRAMES_APP, ranks=2, frames=12, timeout=60, settings=("split=true",), log=log
    )
    assert RUN_ID.match(result.run_id)
    live = [line for line in lines_of(log) if not line.get("self_test")]
    assert live, log.read_text()
    assert {line["run"] for line in live} == {result.run_id}
    assert load(log).runs == (LoggedRun(result.run_id, len(live), live[0]["timestamp"]),)


def test_a_main_app_s_run_on_two_ranks_has_the_id_rank_0_chose(
    restored_logging: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A main app's pipeline run on two ranks: rank 1's sink logs the id rank 0's launcher
    chose for that run (rank 1's process does not see this test's patch, only the hand-over)."""
    monkeypatch.setattr("rxstream.ranks._launch.new_run_id", lambda: "feedc0ffee00")
    log, seen = tmp_path / "timing.jsonl", tmp_path / "rank1.pid"
    result = rxstream.launch(
        MAIN_RANKS_APP, ranks=2, frames=20, timeout=60, settings=(f"seen={seen}",), log=log
    )
    assert result.egressed >= 20
    live = [line for line in lines_of(log) if not line.get("self_test")]
    assert live, log.read_text()
    assert {line["run"] for line in live} == {"feedc0ffee00"}


# --- load() and the photon join within a run ------------------------------------------------


def record_of(run: str, input_seq: int, total_ms: float = 10.0) -> TimingRecord:
    """A one-hop record of ``run``."""
    hops = (HopTiming("gen", 1.0, total_ms - 1.0),)
    return TimingRecord(
        "video", input_seq, 0, False, 0, input_seq, "input.recv", total_ms, None, hops, run=run
    )


def client(photon_ms: float = 30.0) -> ClientTiming:
    """A page's part of a record."""
    return ClientTiming(photon_ms=photon_ms, net_ms=5.0, decode_ms=2.0, present_ms=3.0)


def test_photon_lines_never_join_a_record_of_another_run(
    restored_logging: None, tmp_path: Path
) -> None:
    """A photon line of run 2 waits for run 2's record of its input_seq (unmatched before it),
    and a late one of run 1 joins run 1's record, not run 2's of the same input_seq."""
    path = tmp_path / "t.jsonl"
    configure_logging(path)
    first, second = "1111aaaa1111", "2222bbbb2222"
    emit(record_of(first, 1, 10.0))
    log_photon(record_of(second, 1), client(99.0), page=1)  # run 2's page, before its record
    emit(record_of(second, 1, 20.0))
    log_photon(record_of(first, 1), client(31.0), page=1)  # run 1's page, late
    log = load(path)
    assert [(r.run, r.total_ms, r.photon_ms) for r in log.records] == [
        (first, 10.0, 31.0),
        (second, 20.0, None),
    ]
    assert log.unjoined == {second: 1}  # run 2's early photon line: no record of its run before
    assert log.other_events == 0


def test_a_live_page_s_report_in_a_new_run_joins_its_record() -> None:
    """The web session's join: a page that reported input_seq 0 (a cutover) in one run still
    gets its report of the next run's cutover 0 joined, under that run's id."""
    join = PhotonJoin()
    clock = ClockOffset()
    clock.add(0.0, 0.25, 0.5)  # the page's clock is the server's, known to 0.5 ms
    joined = []
    for run in ("1111aaaa1111", "2222bbbb2222"):
        join.sent("video", 1, (("steer", 1.0),))  # each run numbers its frames from 1
        join.record(replace(record_of(run, 0, 40.0), origin="steer", cutover=True))
        shown = Shown("video", 1, 0, arrived=1045.0, decoded=1046.0, presented=1050.0)
        result = join.shown(shown, clock, page=1)
        assert result is not None, run
        joined.append((result[0].run, result[1].photon_ms))
    assert joined == [("1111aaaa1111", 50.0), ("2222bbbb2222", 50.0)]


def test_an_old_log_reads_as_one_run(tmp_path: Path) -> None:
    """Lines without ``run`` (written before runs had ids) are one run "": records, photon
    joins and the summary as before, with no line about runs."""
    path = tmp_path / "old.jsonl"
    lines = []
    for seq in (1, 2, 3):
        flat = {k: v for k, v in record_of("", seq, 10.0 * seq).fields().items() if k != "run"}
        lines.append({**flat, "event": "[timing:video]", "timestamp": f"2025-01-01T00:00:0{seq}Z"})
    photon = {"stream": "video", "input_seq": 2, "total_ms": 20.0, **client(45.0).fields()}
    lines.append({**photon, "event": "[photon:video]", "page": 1})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    log = load(path)
    assert [r.photon_ms for r in log.records] == [None, 45.0, None]
    assert log.runs == (LoggedRun("", 3, "2025-01-01T00:00:01Z"),)
    summary = summarize(log)
    assert (summary.records, summary.run, summary.shown) == (3, "", 1)
    assert format_summary(summary).splitlines()[0] == "3 timing records (ms)"


def test_an_old_log_appended_to_is_a_run_without_id_among_the_new() -> None:
    """Old lines (run "") then a new run: the new run shows, the old is named "(no id)" and
    picked by its exact id "" (which is a prefix of every id)."""
    records = [record_of("", 1), record_of("", 2), record_of("c0ffee000001", 3)]
    summary = summarize(records)
    assert (summary.run, summary.records) == ("c0ffee000001", 1)
    assert (
        format_summary(summary)
        .splitlines()[0]
        .startswith("log holds 2 runs: (no id) (2 records), c0ffee000001 (1 record); ")
    )
    assert (summarize(records, run="").run, summarize(records, run="").records) == ("", 2)


# --- summarize / format_summary -------------------------------------------------------------


def test_summarize_takes_the_last_run_unless_told() -> None:
    """Records of two runs: the last run by default, a prefix picks one, "all" pools them;
    the summary names every run either way."""
    records = [record_of("aaaa00000001", k) for k in (1, 2)]
    records += [record_of("bbbb00000002", k, 50.0) for k in (1, 2, 3)]
    runs = (LoggedRun("aaaa00000001", 2), LoggedRun("bbbb00000002", 3))
    last = summarize(records)
    assert (last.records, last.run, last.runs) == (3, "bbbb00000002", runs)
    assert last.total_ms["max"] == 50.0
    first = summarize(records, run="aaaa")
    assert (first.records, first.run) == (2, "aaaa00000001")
    pooled = summarize(records, run="all")
    assert (pooled.records, pooled.run) == (5, "all")
    assert format_summary(pooled).splitlines()[0] == (
        "log holds 2 runs: aaaa00000001 (2 records), bbbb00000002 (3 records); "
        "showing all of them pooled; --run ID shows one"
    )


def test_a_self_test_run_goes_with_the_run_after_it() -> None:
    """Kept self-test records (include_self_test) form their own drive-session runs: never
    the "last", summarised with the run that follows them, or alone when picked."""
    check = [replace(record_of("5e1f00000001", 1), self_test=True)]
    live = [record_of("00000000aaaa", k) for k in (2, 3)]
    records = [*check, *live]
    summary = summarize(records)
    assert (summary.records, summary.run) == (3, "00000000aaaa")
    assert summary.runs[0] == LoggedRun("5e1f00000001", 1, "", self_test=True)
    assert format_summary(summary).splitlines()[0] == (
        "log holds 2 runs: 5e1f00000001 (1 record, self test), 00000000aaaa (2 records); "
        "showing 00000000aaaa (the last) with the self test before it; --run ID or --run all"
    )
    assert summarize(records, run="5e1f").records == 1


def test_a_run_matching_none_or_several_is_refused_naming_the_runs() -> None:
    """An unknown id and an ambiguous prefix raise ArgumentError listing the log's runs."""
    records = [record_of("abc100000000", 1), record_of("abc200000000", 1)]
    with pytest.raises(
        ArgumentError,
        match=r"^run must be 'last', 'all', '\(no id\)' or the id \(or a unique prefix; 'id:' "
        r"before an id named 'all' or 'last'\) of one of the log's runs, got 'ffff'; its runs "
        r"are: abc100000000, abc200000000$",
    ):
        summarize(records, run="ffff")
    with pytest.raises(
        ArgumentError,
        match=r"^run 'abc' is the prefix of several runs \(abc100000000, abc200000000\): give "
        r"more of the id; the log's runs are: abc100000000, abc200000000$",
    ):
        summarize(records, run="abc")


def test_the_runs_line_lists_the_latest_runs_and_counts_the_earlier() -> None:
    """With more runs than RUNS_LISTED, the first line names the latest and counts the rest."""
    records = [record_of(f"{k:012x}", 1) for k in range(7)]
    first = format_summary(summarize(records)).splitlines()[0]
    assert first.startswith("log holds 7 runs: 2 earlier, then 000000000002 (1 record), ")
    assert first.endswith("000000000006 (1 record); showing 000000000006 (the last); "
                          "--run ID or --run all")  # fmt: skip


# --- rxstream timing on a log of several runs -----------------------------------------------


def test_cli_on_two_appended_runs_shows_the_last_and_names_both(
    restored_logging: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs appended to one log (configure_logging twice): the last run's records, and a
    first line naming both with their counts."""
    path = tmp_path / "nb.jsonl"
    first, second = notebook_log(path, (2, 3))
    assert cli.main(["timing", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.match(
        rf"^log holds 2 runs: {first} \(2 records, first at [0-9T:-]+\.[0-9]{{3}}Z\), {second} "
        rf"\(3 records, first at [0-9T:-]+\.[0-9]{{3}}Z\); showing {second} \(the last\); "
        r"--run ID or --run all$",
        out[0],
    ), out[0]
    assert out[1] == "3 timing records (ms)"


def test_cli_run_flag_picks_by_prefix_pools_all_and_refuses_an_unknown_id(
    restored_logging: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--run PREFIX shows that run, --run all pools (and says so), --json carries the run
    shown and the runs; an unknown id exits 2 naming the runs held."""
    path = tmp_path / "nb.jsonl"
    first, second = notebook_log(path, (2, 3))
    assert cli.main(["timing", str(path), "--run", first[:6]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"showing {first}; --run ID or --run all")
    assert out[1] == "2 timing records (ms)"
    assert cli.main(["timing", str(path), "--run", "all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("showing all of them pooled; --run ID shows one")
    assert out[1] == "5 timing records (ms)"
    assert cli.main(["timing", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["run"], data["records"]) == (second, 3)
    assert [(r["id"], r["records"]) for r in data["runs"]] == [(first, 2), (second, 3)]
    assert cli.main(["timing", str(path), "--run", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"rxstream timing: {path}: run must be 'last', 'all', '(no id)' or the id (or a unique "
        f"prefix; 'id:' before an id named 'all' or 'last') of one of the log's runs, got "
        f"'nope'; its runs are: {first}, {second}\n"
    )


def test_cli_plot_draws_the_run_shown(
    restored_logging: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--plot draws the records of the run summarised, not every run's (``plotted``)."""
    path = tmp_path / "nb.jsonl"
    first, second = notebook_log(path, (2, 3))
    drawn: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(
        cli,
        "plot",
        lambda summary, records, target: drawn.append(
            (summary.run, [r.run for r in plotted(summary, records)])
        ),
    )
    assert cli.main(["timing", str(path), "--plot", str(tmp_path / "p.png")]) == 0
    assert cli.main(["timing", str(path), "--plot", str(tmp_path / "p.png"), "--run", first]) == 0
    capsys.readouterr()
    assert drawn == [(second, [second] * 3), (first, [first] * 2)]


# --- the run id of a launch: LaunchResult.run_id and `rxstream run` --------------------------

MAIN_APP = str(ROOT / "tests" / "apps" / "main_app.py")


def test_a_main_app_s_launch_result_names_its_run(restored_logging: None, tmp_path: Path) -> None:
    """LaunchResult.run_id of a main app is the run its live timing lines carry."""
    log = tmp_path / "timing.jsonl"
    result = rxstream.launch(MAIN_APP, ranks=1, frames=3, timeout=60, log=log)
    assert RUN_ID.match(result.run_id), result
    live = {line["run"] for line in lines_of(log) if not line.get("self_test")}
    assert live == {result.run_id}


def test_rxstream_run_prints_the_run_id_beside_the_log(
    restored_logging: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rxstream run --log` ends naming the log and the run's id in it."""
    log = tmp_path / "timing.jsonl"
    assert cli.main(["run", MAIN_APP, "--frames", "3", "--timeout", "60", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    live = {line["run"] for line in lines_of(log) if not line.get("self_test")}
    assert len(live) == 1
    (run_id,) = live
    assert f"timing log: {log}, run {run_id} (summarise it with: rxstream timing {log})" in out


SELF_TESTED_BUILD_APP = """\
import numpy as np


def build(ctx):
    pipeline = (
        ctx.input("clicks")
        | ctx.pipe(lambda c: np.full((16, 16, 3), c, np.uint8), name="paint")
        | ctx.stream("video")
    )
    with ctx.self_test():
        pipeline.feed("clicks", 1)
        (frame,) = pipeline.drive(frames=1)
        assert frame.shape == (16, 16, 3)
    return pipeline
"""


def test_a_build_app_s_self_test_is_logged_once(
    restored_logging: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A self test inside build(ctx) (built twice: the command line's check, then the run)
    leaves one ``self_test_passed`` and its ``self_test`` records in ``--log``, as a main
    app's does."""
    app = tmp_path / "self_tested.py"
    app.write_text(SELF_TESTED_BUILD_APP)
    log = tmp_path / "timing.jsonl"
    assert cli.main(["run", str(app), "--timeout", "0.2", "--log", str(log)]) == 0
    assert len(lines_of(log, "self_test_passed")) == 1
    records = lines_of(log)
    assert records
    assert all(r.get("self_test") for r in records), records
    assert len({r["run"] for r in records}) == 1  # one self test's session, not two
    out = capsys.readouterr().out
    assert f"timing log: {log}: no timing record of the run written" in out


def test_a_build_app_s_self_test_is_logged_with_no_sink_on_rank_0(
    restored_logging: None, tmp_path: Path
) -> None:
    """The sink on rank 1: rank 0's self test is logged, once (rank 1's is not)."""
    log = tmp_path / "timing.jsonl"
    args = ["run", FRAMES_APP, "--ranks", "2", "--set", "split=true", "--frames", "4"]
    assert cli.main([*args, "--log", str(log)]) == 0
    assert len(lines_of(log, "self_test_passed")) == 1
