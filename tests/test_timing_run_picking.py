"""A review of the timing log's runs: a bad ``run`` value, naming and picking runs (``(no id)``,
``id:``, self tests, ``--stream``), their order in time, what ``plot`` draws, and how ids and
counts are shown."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rxstream import ArgumentError, ArgumentTypeError, cli
from rxstream.timing import ClientTiming, HopTiming, TimingRecord, format_summary, load, summarize
from rxstream.timing._analysis import plotted
from rxstream.timing._client import ClockOffset
from rxstream.timing._runs import show_time
from rxstream.transport._photon import PhotonJoin, Shown

A, B = "aaaa00000001", "bbbb00000002"


def record_of(run: str, input_seq: int, stream: str = "video", **kw: Any) -> TimingRecord:
    """A one-hop record of ``run``."""
    hops = (HopTiming("gen", 1.0, 9.0),)
    return TimingRecord(
        stream, input_seq, 0, False, 0, 0, "input.recv", 10.0, None, hops, run=run, **kw
    )


def line(record: TimingRecord, at: str = "", **extra: Any) -> dict[str, Any]:
    """The log line of ``record`` (with ``timestamp`` ``at`` when given), ``extra`` over it."""
    fields = {"event": f"[timing:{record.stream}]", "level": "info", **record.fields()}
    if at:
        fields["timestamp"] = at
    return {**fields, **extra}


def photon(run: Any, input_seq: int) -> dict[str, Any]:
    """A ``[photon:video]`` line of ``run`` for ``input_seq``."""
    shown = ClientTiming(photon_ms=30.0, net_ms=5.0, decode_ms=2.0, present_ms=3.0).fields()
    return {"event": "[photon:video]", "run": run, "stream": "video", "input_seq": input_seq,
            **shown, "page": 1}  # fmt: skip


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    """``lines`` as a JSON-lines log at ``path``."""
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def timing(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``rxstream timing ARGS``: exit status, stdout, stderr."""
    status = cli.main(["timing", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# --- 1. a run that is not a string ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "null (NoneType)"), (123, "123 (int)"), (True, "true (bool)"),
     ({"a": 1}, '{"a": 1} (dict)'), (["x"], '["x"] (list)'), (1.5, "1.5 (float)")],
)  # fmt: skip
def test_a_run_that_is_not_a_string_is_a_malformed_line(
    tmp_path: Path, value: Any, shown: str
) -> None:
    """null, numbers, booleans, objects and lists as ``run`` make the timing line (and a
    photon line) malformed, never a run named by their str()."""
    good = line(record_of("", 1))
    path = write(tmp_path / "t.jsonl", [good, {**good, "run": value}, photon(value, 1)])
    log = load(path)
    assert [r.run for r in log.records] == [""]
    assert [(m.line, m.reason) for m in log.malformed] == [
        (2, f"timing line with a bad value: run must be a string, got {shown}"),
        (3, f"photon line with a bad value: run must be a string, got {shown}"),
    ]


def test_a_json_line_nested_too_deeply_is_malformed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line of 100,000 nested lists is a malformed line for load and `rxstream timing`."""
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(line(record_of(A, 1))) + "\n" + "[" * 100_000 + "\n")
    assert [(m.line, m.reason) for m in load(path).malformed] == [
        (2, "not JSON: nested too deeply")
    ]
    status, out, _ = timing(capsys, str(path))
    assert status == 0
    assert out.splitlines()[-1] == "1 malformed line, first at line 2: not JSON: nested too deeply"


# --- 2, 6. naming a run ---------------------------------------------------------------------


def test_the_run_without_id_is_picked_as_no_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``(no id)``, the name the listing gives the id-less run, picks it (as ``''`` does);
    the first line says so."""
    path = write(tmp_path / "t.jsonl", [line(record_of("", 1)), line(record_of(A, 2))])
    assert summarize(load(path), run="(no id)").run == ""
    for name in ("(no id)", ""):
        status, out, _ = timing(capsys, str(path), "--run", name)
        assert status == 0
        first = out.splitlines()[0]
        assert "showing (no id); --run ID or --run all (--run '(no id)': the lines" in first


def test_an_id_named_all_or_last_is_picked_with_id_prefix() -> None:
    """``id:all`` and ``id:last`` pick the runs with those ids, not every run nor the last."""
    records = [record_of("all", 1), record_of("last", 2), record_of(A, 3)]
    assert (summarize(records, run="id:all").run, summarize(records, run="id:all").records) == (
        "all",
        1,
    )
    assert summarize(records, run="id:last").run == "last"
    first = format_summary(summarize(records, run="id:all")).splitlines()[0]
    assert first.endswith("showing all; --run ID or --run all")
    assert summarize(records, run="last").run == A


def test_a_run_that_is_not_a_string_is_refused_by_type() -> None:
    """select(123) and summarize(run=b"x") raise ArgumentTypeError naming run and the value."""
    log_records = [record_of(A, 1)]
    with pytest.raises(ArgumentTypeError, match=r"^run must be a string .*got 123 \(int\)$"):
        summarize(log_records, run=123)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"got b'x' \(bytes\)$"):
        summarize(log_records, run=b"x")  # type: ignore[arg-type]


def test_an_uppercase_id_is_told_ids_are_lowercase() -> None:
    """An id given in uppercase matches none, and the error says ids are lowercase hex."""
    with pytest.raises(ArgumentError, match=r"got 'AAAA' \(run ids are lowercase hex"):
        summarize([record_of(A, 1)], run="AAAA")


def test_ids_are_shown_safely_and_the_error_lists_as_many_as_the_header() -> None:
    """A control character is escaped, a long id cut with an ellipsis; an unknown id's error
    names the latest five runs and counts the rest."""
    odd, long = "bad\nrun", "x" * 5000
    records = [record_of(f"{k:012x}", k) for k in range(5)] + [
        record_of(odd, 6),
        record_of(long, 7),
    ]
    first = format_summary(summarize(records)).splitlines()[0]
    assert "'bad\\nrun' (1 record)" in first
    assert f"{'x' * 39}… (1 record)" in first
    assert len(first) < 400
    with pytest.raises(ArgumentError) as caught:
        summarize(records, run="nope")
    assert str(caught.value).endswith(
        f"its runs are: 000000000002, 000000000003, 000000000004, 'bad\\nrun', {'x' * 39}… "
        "(…and 2 earlier)"
    )


# --- 3. plot draws the summary's run --------------------------------------------------------


def test_plot_draws_only_the_records_of_the_run_summarised(tmp_path: Path) -> None:
    """Given every run's records, plot draws the summary's run (with its self test), or all
    of them for a pooled summary; and writes the file."""
    check = replace(record_of("5e1f00000000", 1), self_test=True)
    records = [record_of(A, 1), check, record_of(B, 2)]
    records = [records[0], replace(check), records[2]]
    records = [replace(r, run=r.run or A) for r in records]
    last = summarize(records)
    assert [r.run for r in plotted(last, records)] == ["5e1f00000000", B]
    assert [r.run for r in plotted(summarize(records, run="all"), records)] == [
        A,
        "5e1f00000000",
        B,
    ]
    from rxstream.timing import plot

    plot(last, records, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


# --- 4. runs in time order ------------------------------------------------------------------


def test_logs_concatenated_newest_first_still_show_the_newest_run_as_last(tmp_path: Path) -> None:
    """Runs are ordered by their first line's timestamp: the later run is "last" even when
    its lines come first; a log with a timestamp that is no time keeps file order."""
    new = line(record_of(B, 1), "2026-12-02T05:00:00.000001Z")
    old = line(record_of(A, 1), "2026-12-02T04:00:00+00:00")
    log = load(write(tmp_path / "t.jsonl", [new, old]))
    assert [r.id for r in log.runs] == [A, B]
    assert summarize(log).run == B
    unknown = load(write(tmp_path / "u.jsonl", [new, {**old, "timestamp": "yesterday"}]))
    assert [r.id for r in unknown.runs] == [B, A]
    assert show_time("2026-12-02T04:00:00.123456Z") == "2026-12-02T04:00:00.123Z"
    assert show_time("2026-12-02T05:00:00.5+01:00") == "2026-12-02T04:00:00.500Z"


# --- 5. self tests and --stream in the CLI --------------------------------------------------


def self_tested_log(path: Path) -> Path:
    """Two launches: each a self-test run (1 record), then a live run."""
    lines = []
    for k, (test, live) in enumerate((("5e1f0000000a", A), ("5e1f0000000b", B))):
        lines.append(line(record_of(test, 1, self_test=True), f"2026-01-01T0{k}:00:00Z"))
        lines += [line(record_of(live, s), f"2026-01-01T0{k}:00:0{s}Z") for s in (2, 3)]
    return write(path, lines)


def test_left_out_counts_the_self_test_of_the_run_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`left out: N self-test record(s)` counts those of the run shown (its self test before
    it), all of them for --run all."""
    path = self_tested_log(tmp_path / "t.jsonl")
    assert load(path).self_tests == 2
    _, out, _ = timing(capsys, str(path))
    assert out.splitlines()[-1] == "left out: 1 self-test record (--include-self-test keeps them)"
    _, out, _ = timing(capsys, str(path), "--run", "all")
    assert out.splitlines()[-1] == "left out: 2 self-test records (--include-self-test keeps them)"


def test_a_self_test_run_asked_for_says_include_self_test_selects_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--run <self-test id> without --include-self-test: exit 2 saying it is a self test."""
    path = self_tested_log(tmp_path / "t.jsonl")
    status, _, err = timing(capsys, str(path), "--run", "5e1f0000000b")
    assert status == 2
    assert "run '5e1f0000000b' is an app's self test (5e1f0000000b), left out by default: " in err
    assert "--include-self-test" in err
    status, out, _ = timing(capsys, str(path), "--run", "5e1f0000000b", "--include-self-test")
    assert (status, out.splitlines()[1]) == (0, "1 timing records (ms)")


def test_stream_picks_among_every_run_and_says_which_run_lacks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--stream with --run of a run without that stream says so; --stream alone shows the
    last run (not an older one with the stream), naming the log's runs."""
    lines = [line(record_of(A, 1, "video"), "2026-01-01T00:00:00Z")]
    lines += [line(record_of(B, 1, "audio"), "2026-01-01T01:00:00Z")]
    lines += [line(record_of(B, 2, "video"), "2026-01-01T01:00:01Z")]
    path = write(tmp_path / "t.jsonl", lines)
    status, out, _ = timing(capsys, str(path), "--stream", "video")
    assert status == 0
    assert out.splitlines()[0].startswith(f"log holds 2 runs: {A} (1 record, first at ")
    assert f"showing {B} (the last)" in out.splitlines()[0]
    assert out.splitlines()[1] == "1 timing records (ms)"
    status, _, err = timing(capsys, str(path), "--stream", "audio", "--run", "aaaa")
    assert status == 1
    assert err == (
        f"rxstream timing: {path}: run {A} has no records of stream 'audio'; the runs with "
        f"some: {B} (--run ID picks one)\n"
    )


# --- photon lines joined to no record -------------------------------------------------------


def test_photon_lines_of_no_record_are_counted_per_run_and_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A photon line matching no record of its run is counted under that run and `rxstream
    timing` says how many of the run shown (and of the whole log)."""
    lines = [line(record_of(A, 1), "2026-01-01T00:00:00Z"), photon(A, 9), photon(B, 1)]
    lines.append(line(record_of(B, 1), "2026-01-01T01:00:00Z"))
    path = write(tmp_path / "t.jsonl", lines)
    assert load(path).unjoined == {A: 1, B: 1}
    _, out, _ = timing(capsys, str(path), "--run", "aaaa")
    assert out.splitlines()[-1] == (
        "photon lines joined to no record: 1 of the run shown, 2 in the whole log"
    )
    _, out, _ = timing(capsys, str(path), "--run", "all")
    assert out.splitlines()[-1] == "photon lines joined to no record: 2"


def test_json_carries_the_left_out_self_tests_and_the_unjoined_photon_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json says what the text's closing lines say: self-test records left out of the run
    shown, photon lines joined to no record (of the run shown, of the log)."""
    path = self_tested_log(tmp_path / "t.jsonl")
    _, out, _ = timing(capsys, str(path), "--json")
    shown = json.loads(out)
    assert shown["self_tests_left_out"] == 1
    assert shown["photon_unjoined"] == {"run": 0, "log": 0}
    lines = [line(record_of(A, 1), "2026-01-01T00:00:00Z"), photon(A, 9), photon(B, 1)]
    lines.append(line(record_of(B, 1), "2026-01-01T01:00:00Z"))
    path = write(tmp_path / "p.jsonl", lines)
    _, out, _ = timing(capsys, str(path), "--run", "aaaa", "--json")
    assert json.loads(out)["photon_unjoined"] == {"run": 1, "log": 2}


def test_a_waiting_report_never_joins_the_next_run_s_record() -> None:
    """A page's report waiting for its record in one run is dropped when the next run starts:
    that run's record of the same input_seq gets no join from it."""
    join = PhotonJoin()
    clock = ClockOffset()
    clock.add(0.0, 0.25, 0.5)
    join.sent("video", 1, (("input.recv", 1.0),))
    join.record(record_of(A, 7))  # run A is on
    shown = Shown("video", 1, 3, arrived=1015.0, decoded=1016.0, presented=1020.0)
    assert join.shown(shown, clock, page=1) is None  # waits for A's record of input 3
    assert join.record(record_of(B, 3)) == []  # B's record of input 3: not A's report
    join.sent("video", 2, (("input.recv", 2.0),))
    later = Shown("video", 2, 4, arrived=2015.0, decoded=2016.0, presented=2020.0)
    assert join.shown(later, clock, page=1) is None  # waits, in run B
    (joined,) = join.record(record_of(B, 4))
    assert (joined[0].run, joined[0].input_seq) == (B, 4)
