"""`rxstream timing` on logs with nothing to summarise, and the self test's own records."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rxstream
from rxstream.testing import capture_timing
from rxstream.timing import TimingRecord, format_summary, load, summarize

GOLDEN = Path(__file__).parent / "data" / "timing_golden.jsonl"


def rxstream_timing(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m rxstream timing ARGS`` in ``cwd`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "rxstream", "timing", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=120,
    )


def write_log(path: Path, records: list[TimingRecord], others: int = 0) -> Path:
    """A JSON-lines log as ``configure_logging`` writes it: ``others`` other events, then
    one ``[timing:<stream>]`` line per record."""
    lines = [{"event": "pipeline_started", "level": "info"}] * others
    lines += [{"event": f"[timing:{r.stream}]", "level": "info", **r.fields()} for r in records]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def driven_records(self_test_first: bool) -> list[TimingRecord]:
    """The records of a small input-driven pipeline: its self test's frame, then three more."""
    ctx = rxstream.Context()
    pipeline = ctx.input("mouse") | ctx.pipe(lambda x: x * 2, name="gen") | ctx.stream("video")
    with capture_timing() as records:
        if self_test_first:
            with ctx.self_test():
                pipeline.feed("mouse", 1)
                assert pipeline.drive(frames=1) == [2]
        for sample in (2, 3, 4):
            pipeline.feed("mouse", sample)
        assert pipeline.drive(frames=3) == [4, 6, 8]
    return list(records)


def bad_log(kind: str, folder: Path) -> tuple[list[str], str]:
    """The arguments of a log with nothing to summarise, and the one line expected about it."""
    if kind == "empty file":
        path = folder / "empty.jsonl"
        path.write_bytes(b"")
        return [str(path)], f"{path}: no timing records (the file is empty)"
    if kind == "/dev/null":
        return ["/dev/null"], "/dev/null: no timing records (the file is empty)"
    if kind == "--stream naming no stream":
        path = write_log(folder / "log.jsonl", driven_records(self_test_first=False))
        return [str(path), "--stream", "audio"], (
            f"{path}: no records of stream 'audio'; its streams are: video"
        )
    if kind == "binary file":
        path = folder / "frames.bin"
        path.write_bytes((bytes(range(14, 256)) + b"\n") * 40)  # no \r: 40 lines
        return [str(path)], (
            f"{path}: no timing records; 40 malformed lines, first at line 1: not JSON: "
        )
    if kind == "only other events":
        path = write_log(folder / "events.jsonl", [], others=3)
        return [str(path)], f"{path}: no timing records; 3 other log event(s)"
    assert kind == "only the self test's record"
    records = [r for r in driven_records(self_test_first=True) if r.self_test]
    path = write_log(folder / "self_test.jsonl", records)
    return [str(path)], (
        f"{path}: no timing records; 1 self-test record(s) left out: --include-self-test keeps them"
    )


@pytest.mark.parametrize(
    "kind",
    [
        "empty file",
        "/dev/null",
        "--stream naming no stream",
        "binary file",
        "only other events",
        "only the self test's record",
    ],
)
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["table", "--json"])
def test_a_log_with_nothing_to_summarise_is_one_line_and_an_error(
    tmp_path: Path, kind: str, mode: str
) -> None:
    """No table of nan, no JSON, no PNG: one line on stderr naming the problem, exit 1."""
    args, expected = bad_log(kind, tmp_path)
    extra = ["--json"] if mode == "--json" else []
    result = rxstream_timing(*args, *extra, "--plot", "out.png", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"rxstream timing: {expected}"), result.stderr
    assert not (tmp_path / "out.png").exists()


def test_malformed_lines_are_summarised_in_one_line(tmp_path: Path) -> None:
    """Records among many bad lines: the table, then 'N malformed lines, first at line K: …'."""
    good = GOLDEN.read_text(encoding="utf-8")
    path = tmp_path / "mixed.jsonl"
    path.write_text(good + "\x00\x01garbage\n" * 35, encoding="utf-8")
    result = rxstream_timing(str(path), cwd=tmp_path)
    assert result.returncode == 0
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == "6 timing records (ms)"
    assert lines[-1] == "38 malformed lines, first at line 6: not JSON: Expecting value (column 1)"
    assert sum("malformed" in line for line in lines) == 1


def test_the_self_test_record_is_tagged() -> None:
    """A frame that egresses inside ctx.self_test() makes a record tagged self_test."""
    records = driven_records(self_test_first=True)
    assert [(r.input_seq, r.self_test) for r in records] == [
        (1, True),
        (2, False),
        (3, False),
        (4, False),
    ]
    assert records[0].fields()["self_test"] is True
    assert "self_test" not in records[1].fields()  # a live run's lines are as they were
    assert TimingRecord.from_fields(records[0].fields()).self_test is True
    assert TimingRecord.from_fields(records[1].fields()).self_test is False


@pytest.mark.slow
def test_summaries_leave_the_self_test_out_unless_asked(tmp_path: Path) -> None:
    """load() and `rxstream timing` skip the self test's record; --include-self-test keeps it."""
    path = write_log(tmp_path / "run.jsonl", driven_records(self_test_first=True))
    log = load(path)
    assert ([r.input_seq for r in log.records], log.self_tests) == ([2, 3, 4], 1)
    everything = load(path, include_self_test=True)
    assert ([r.input_seq for r in everything.records], everything.self_tests) == ([1, 2, 3, 4], 0)

    result = rxstream_timing(str(path), cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == (
        format_summary(summarize(log))
        + "\nleft out: 1 self-test record (--include-self-test keeps them)\n"
    )
    kept = rxstream_timing(str(path), "--include-self-test", "--json", cwd=tmp_path)
    assert kept.returncode == 0
    assert json.loads(kept.stdout)["records"] == 4


@pytest.mark.parametrize(
    ("plot", "expected"),
    [
        (
            "plot.xyz",
            r"^rxstream timing: --plot must end in one of the formats .*\bpng\b.*\bsvg\b.*, "
            r"got 'plot\.xyz' \(format 'xyz'\)$",
        ),
        ("folder", r"^rxstream timing: --plot folder is a folder; give a file name .*$"),
    ],
)
def test_plot_to_a_format_or_a_folder_it_cannot_write_is_one_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    plot: str,
    expected: str,
) -> None:
    """``--plot`` with an unknown suffix or naming a folder: one line, exit 2, no table, no file."""
    from rxstream import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    assert cli.main(["timing", str(GOLDEN), "--plot", plot]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert re.match(expected, err.strip()), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]
    assert list((tmp_path / "folder").iterdir()) == []


def test_plot_without_a_suffix_names_the_png_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--plot report`` writes ``report.png`` and the closing line names that file."""
    from rxstream import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["timing", str(GOLDEN), "--plot", "report"]) == 0
    assert capsys.readouterr().out.endswith("\nplot written to report.png\n")
    assert [p.name for p in tmp_path.iterdir()] == ["report.png"]
    assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")
