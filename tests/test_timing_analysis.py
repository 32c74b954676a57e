"""Reading timing logs back: load, summarize, format_summary, plot, and ``rxstream timing``.

The golden log ``tests/data/timing_golden.jsonl`` is written by hand. Its 11 lines:

1, 2, 4, 7, 10  timing records of input_seq 1, 2, 3, 4, 5 (hops mouse, gen, video)
5               the timing record of a steer's cutover (input_seq 0, hops gen, video)
3               another event (a warning), counted, not a record
6               garbage, 9 a truncated JSON object, 11 a timing line without gen.compute_ms
8               empty (skipped, but counted in the line numbers)

Percentiles interpolate linearly between order statistics, like numpy's default: for n
values sorted v[0..n-1] the q-th is at rank (n - 1) * q / 100. With n = 6 (gen, video, end to
end) p50 is (v[2] + v[3]) / 2, p95 is v[4] + 0.75 (v[5] - v[4]) and p99 is v[4] + 0.95 (v[5] -
v[4]); with n = 5 (mouse, absent from the cutover) p50 is v[2], p95 is v[3] + 0.8 (v[4] - v[3])
and p99 is v[3] + 0.96 (v[4] - v[3]). The values below are worked out that way by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from rxstream.timing import (
    HopTiming,
    Malformed,
    TimingRecord,
    format_summary,
    load,
    plot,
    summarize,
)

GOLDEN = Path(__file__).parent / "data" / "timing_golden.jsonl"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def video(
    seq: int,
    pts: int,
    total: float,
    hops: tuple[tuple[str, float, float], ...],
    *,
    at_ms: int,
    from_client: float | None,
    generation: int = 0,
) -> TimingRecord:
    """An input-conditioned record of stream 'video'."""
    return TimingRecord(
        stream="video",
        input_seq=seq,
        input_at_ms=at_ms,
        cutover=False,
        prompt_generation=generation,
        pts=pts,
        origin="input.recv",
        total_ms=total,
        from_client_ms=from_client,
        hops=tuple(HopTiming(*hop) for hop in hops),
    )


EXPECTED_RECORDS = (
    video(
        1,
        0,
        12.791,
        (("mouse", 0.12, 0.011), ("gen", 0.4, 12.0), ("video", 0.2, 0.06)),
        at_ms=1_700_000_000_000,
        from_client=13.5,
    ),
    video(
        2,
        1,
        15.073,
        (("mouse", 0.25, 0.013), ("gen", 0.55, 14.0), ("video", 0.22, 0.04)),
        at_ms=1_700_000_000_042,
        from_client=15.9,
    ),
    video(
        3,
        2,
        14.223,
        (("mouse", 0.181, 0.012), ("gen", 0.63, 13.0), ("video", 0.31, 0.09)),
        at_ms=1_700_000_000_083,
        from_client=None,
    ),
    TimingRecord(
        stream="video",
        input_seq=0,
        input_at_ms=0,
        cutover=True,
        prompt_generation=1,
        pts=3,
        origin="steer",
        total_ms=36.49,
        from_client_ms=None,
        hops=(HopTiming("gen", 1.1, 35.0), HopTiming("video", 0.26, 0.13)),
    ),
    video(
        4,
        4,
        12.164,
        (("mouse", 0.41, 0.014), ("gen", 0.48, 11.0), ("video", 0.21, 0.05)),
        at_ms=1_700_000_000_167,
        from_client=12.25,
        generation=1,
    ),
    video(
        5,
        5,
        17.21,
        (("mouse", 0.15, 0.01), ("gen", 0.7, 16.0), ("video", 0.27, 0.08)),
        at_ms=1_700_000_000_208,
        from_client=17.75,
        generation=1,
    ),
)

EXPECTED_MALFORMED = (
    Malformed(6, "not JSON: Expecting value (column 1)"),
    Malformed(9, "not JSON: Expecting ',' delimiter (column 83)"),
    Malformed(11, "timing line without field 'gen.compute_ms'"),
)

# Per hop, by hand (see the module docstring):
#   mouse wait    sorted .12 .15 .181 .25 .41   -> p50 .181   p95 .378    p99 .4036
#   mouse compute sorted .010 .011 .012 .013 .014 -> p50 .012 p95 .0138   p99 .01396
#   gen wait      sorted .40 .48 .55 .63 .70 1.10 -> p50 .59  p95 1.0     p99 1.08
#   gen compute   sorted 11 12 13 14 16 35       -> p50 13.5  p95 30.25   p99 34.05
#   video wait    sorted .20 .21 .22 .26 .27 .31 -> p50 .24   p95 .30     p99 .308
#   video compute sorted .04 .05 .06 .08 .09 .13 -> p50 .07   p95 .12     p99 .128
#   end to end    sorted 12.164 12.791 14.223 15.073 17.21 36.49
#                 -> p50 14.648  p95 31.67  p99 35.526  max 36.49
EXPECTED_HOPS = {
    "mouse": (5, {50: 0.181, 95: 0.378, 99: 0.4036}, {50: 0.012, 95: 0.0138, 99: 0.01396}),
    "gen": (6, {50: 0.59, 95: 1.0, 99: 1.08}, {50: 13.5, 95: 30.25, 99: 34.05}),
    "video": (6, {50: 0.24, 95: 0.30, 99: 0.308}, {50: 0.07, 95: 0.12, 99: 0.128}),
}
EXPECTED_TOTAL = {"p50": 14.648, "p95": 31.67, "p99": 35.526, "max": 36.49}

EXPECTED_TABLE = """\
6 timing records (ms)
hop    count  wait p50   p95   p99  compute p50    p95    p99
mouse      5      0.18  0.38  0.40         0.01   0.01   0.01
gen        6      0.59  1.00  1.08        13.50  30.25  34.05
video      6      0.24  0.30  0.31         0.07   0.12   0.13
end to end: p50 14.65  p95 31.67  p99 35.53  max 36.49
slowest inputs: video#0 36.49, video#5 17.21, video#2 15.07, video#3 14.22, video#1 12.79
3 malformed lines, first at line 6: not JSON: Expecting value (column 1)
"""


def rxstream_timing(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m rxstream timing ARGS`` in a subprocess and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "rxstream", "timing", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=120,
    )


def approx(value: float) -> object:
    """Equal to ``value`` up to float rounding of the hand-computed decimal."""
    return pytest.approx(value, rel=1e-12, abs=1e-12)


# --- load -----------------------------------------------------------------------------------


def test_load_returns_records_other_events_and_malformed_lines() -> None:
    """load() gives the 6 records, 1 other event, and 3 malformed lines with their numbers."""
    log = load(GOLDEN)
    assert log.records == EXPECTED_RECORDS
    assert log.other_events == 1
    assert log.malformed == EXPECTED_MALFORMED


def test_load_keeps_only_the_asked_stream(tmp_path: Path) -> None:
    """load(stream=...) keeps that stream's records; malformed lines are reported regardless."""
    lines = GOLDEN.read_text(encoding="utf-8").splitlines()
    audio = dict(json.loads(lines[0]), stream="audio", event="[timing:audio]", input_seq=7)
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join([*lines, json.dumps(audio)]) + "\n", encoding="utf-8")

    everything = load(path)
    assert len(everything.records) == 7
    only_audio = load(path, stream="audio")
    assert [(r.stream, r.input_seq) for r in only_audio.records] == [("audio", 7)]
    assert only_audio.malformed == EXPECTED_MALFORMED
    assert load(path, stream="video").records == EXPECTED_RECORDS
    assert load(GOLDEN, stream="audio").records == ()


def test_load_names_what_is_wrong_with_each_bad_line(tmp_path: Path) -> None:
    """Non-objects, bad values and missing fields are malformed lines with exact reasons."""
    path = tmp_path / "bad.jsonl"
    timing = {"event": "[timing:v]", "stream": "v", "input_seq": 1}
    lines = [
        "[1, 2]",
        json.dumps({**timing, "total_ms": "abc", "hops": ""}),
        json.dumps({**timing, "total_ms": 1, "hops": "a", "a.wait_ms": None, "a.compute_ms": 1}),
        json.dumps({**timing, "total_ms": 1}),
        json.dumps({"event": "something_else"}),
        json.dumps({**timing, "total_ms": 2.5, "hops": ""}),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log = load(path)
    assert log.malformed == (
        Malformed(1, "not a JSON object: list"),
        Malformed(2, "timing line with a bad value: could not convert string to float: 'abc'"),
        Malformed(
            3,
            "timing line with a bad value: float() argument must be a string or a real number, "
            "not 'NoneType'",
        ),
        Malformed(4, "timing line without field 'hops'"),
    )
    assert log.other_events == 1
    assert [(r.stream, r.total_ms, r.hops) for r in log.records] == [("v", 2.5, ())]


def test_a_line_cut_inside_a_string_reads_cleanly(tmp_path: Path) -> None:
    """A line cut inside a JSON string is malformed with a reason that reads as English."""
    path = tmp_path / "cut.jsonl"
    path.write_text('"[timing:vid\n', encoding="utf-8")
    assert load(path).malformed == (
        Malformed(1, "not JSON: Unterminated string starting at (column 1)"),
    )


# --- summarize --------------------------------------------------------------------------------


def test_summarize_gives_the_hand_computed_percentiles() -> None:
    """summarize(): per-hop counts and p50/p95/p99, end-to-end percentiles, slowest inputs."""
    summary = summarize(load(GOLDEN))
    assert summary.records == 6
    assert [h.name for h in summary.hops] == ["mouse", "gen", "video"]
    for hop in summary.hops:
        count, wait, compute = EXPECTED_HOPS[hop.name]
        assert hop.count == count
        assert hop.wait_ms == {q: approx(v) for q, v in wait.items()}
        assert hop.compute_ms == {q: approx(v) for q, v in compute.items()}
    assert summary.total_ms == {k: approx(v) for k, v in EXPECTED_TOTAL.items()}
    assert [(r.input_seq, r.total_ms) for r in summary.slowest] == [
        (0, 36.49),
        (5, 17.21),
        (2, 15.073),
        (3, 14.223),
        (1, 12.791),
    ]
    assert summary.malformed == EXPECTED_MALFORMED
    assert [r.input_seq for r in summarize(EXPECTED_RECORDS, slowest=2).slowest] == [0, 5]


def test_summarize_lists_hops_in_path_order_when_some_records_lack_one() -> None:
    """A hop first seen in a later record (a rank boundary) is listed after its predecessor."""

    def record(seq: int, hops: list[str]) -> TimingRecord:
        timings = tuple(HopTiming(name, 0.1, 1.0) for name in hops)
        return TimingRecord(
            "video", seq, 0, False, 0, seq, "input.recv", 1.1 * len(hops), None, timings
        )

    summary = summarize(
        [
            record(1, ["mouse", "window", "render", "video"]),  # the self test's drive: no boundary
            record(2, ["mouse", "window", "window>render", "render", "video"]),
        ]
    )
    assert [h.name for h in summary.hops] == ["mouse", "window", "window>render", "render", "video"]
    assert [h.count for h in summary.hops] == [2, 2, 1, 2, 2]


def test_summarize_agrees_with_numpy_on_the_golden_log() -> None:
    """The golden summary's percentiles are numpy.percentile's (linear) of the same values."""
    log = load(GOLDEN)
    summary = summarize(log)
    for hop in summary.hops:
        waits = [h.wait_ms for r in log.records for h in r.hops if h.name == hop.name]
        computes = [h.compute_ms for r in log.records for h in r.hops if h.name == hop.name]
        for q in (50, 95, 99):
            assert hop.wait_ms[q] == approx(float(np.percentile(waits, q)))
            assert hop.compute_ms[q] == approx(float(np.percentile(computes, q)))


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=40))
def test_summarize_percentiles_are_numpys_linear_ones(values: list[float]) -> None:
    """For any one-hop values, p50/p95/p99 and the totals' are numpy's linear percentiles."""
    records = [
        TimingRecord("s", k + 1, 0, False, 0, k, "input.recv", v, None, (HopTiming("h", v, -v),))
        for k, v in enumerate(values)
    ]
    summary = summarize(records)
    (hop,) = summary.hops
    assert hop.count == len(values)
    for q in (50, 95, 99):
        expected = float(np.percentile(values, q))
        assert hop.wait_ms[q] == pytest.approx(expected, rel=1e-9, abs=1e-9)
        negated = float(np.percentile([-v for v in values], q))
        assert hop.compute_ms[q] == pytest.approx(negated, rel=1e-9, abs=1e-9)
        assert summary.total_ms[f"p{q}"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert summary.total_ms["max"] == max(values)


def test_summary_to_json_rounds_to_three_decimals() -> None:
    """Summary.to_json(): the same numbers rounded to 3 decimals, malformed lines listed."""
    data = summarize(load(GOLDEN)).to_json()
    assert data == {
        "run": "",  # the golden log's lines have no run: one run, ""
        "runs": [
            {
                "id": "",
                "records": 6,
                "first_at": "2025-01-01T00:00:00.013500Z",
                "self_test": False,
            }
        ],
        "records": 6,
        "hops": [
            {
                "name": "mouse",
                "count": 5,
                "wait_ms": {"p50": 0.181, "p95": 0.378, "p99": 0.404},
                "compute_ms": {"p50": 0.012, "p95": 0.014, "p99": 0.014},
            },
            {
                "name": "gen",
                "count": 6,
                "wait_ms": {"p50": 0.59, "p95": 1.0, "p99": 1.08},
                "compute_ms": {"p50": 13.5, "p95": 30.25, "p99": 34.05},
            },
            {
                "name": "video",
                "count": 6,
                "wait_ms": {"p50": 0.24, "p95": 0.3, "p99": 0.308},
                "compute_ms": {"p50": 0.07, "p95": 0.12, "p99": 0.128},
            },
        ],
        "total_ms": {"p50": 14.648, "p95": 31.67, "p99": 35.526, "max": 36.49},
        "slowest": [
            {"stream": "video", "input_seq": 0, "total_ms": 36.49},
            {"stream": "video", "input_seq": 5, "total_ms": 17.21},
            {"stream": "video", "input_seq": 2, "total_ms": 15.073},
            {"stream": "video", "input_seq": 3, "total_ms": 14.223},
            {"stream": "video", "input_seq": 1, "total_ms": 12.791},
        ],
        "malformed": [{"line": m.line, "reason": m.reason} for m in EXPECTED_MALFORMED],
    }


def test_format_summary_is_the_expected_table() -> None:
    """format_summary() renders the golden summary as the expected table, line for line."""
    assert format_summary(summarize(load(GOLDEN))) + "\n" == EXPECTED_TABLE


def test_plot_writes_a_png(tmp_path: Path) -> None:
    """plot() draws the summary into a non-empty PNG file."""
    log = load(GOLDEN)
    out = tmp_path / "direct.png"
    plot(summarize(log), log.records, out)
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > len(PNG_MAGIC)


# --- the command line -------------------------------------------------------------------------


def test_cli_prints_the_expected_table() -> None:
    """`python -m rxstream timing GOLDEN` prints exactly the expected table and exits 0."""
    result = rxstream_timing(str(GOLDEN))
    assert result.stdout == EXPECTED_TABLE
    assert result.stderr == ""
    assert result.returncode == 0


def test_cli_json_has_the_numbers() -> None:
    """`--json` prints the summary as JSON with the golden numbers."""
    result = rxstream_timing(str(GOLDEN), "--json")
    assert result.returncode == 0
    assert result.stderr == ""
    data = json.loads(result.stdout)
    # the summary's fields, and the text's two closing lines as fields (none here)
    assert data.pop("self_tests_left_out") == 0
    assert data.pop("photon_unjoined") == {"run": 0, "log": 0}
    assert data == summarize(load(GOLDEN)).to_json()
    assert data["records"] == 6
    assert data["total_ms"] == EXPECTED_TOTAL
    gen = next(h for h in data["hops"] if h["name"] == "gen")
    assert gen == {
        "name": "gen",
        "count": 6,
        "wait_ms": {"p50": 0.59, "p95": 1.0, "p99": 1.08},
        "compute_ms": {"p50": 13.5, "p95": 30.25, "p99": 34.05},
    }
    assert [m["line"] for m in data["malformed"]] == [6, 9, 11]


@pytest.mark.slow
def test_cli_plot_writes_a_png(tmp_path: Path) -> None:
    """`--plot out.png` writes a non-empty PNG and says so after the table."""
    result = rxstream_timing(str(GOLDEN), "--plot", "out.png", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stderr == ""
    assert result.stdout == EXPECTED_TABLE + "plot written to out.png\n"
    data = (tmp_path / "out.png").read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > len(PNG_MAGIC)


def test_cli_stream_filter_with_only_malformed_lines_exits_1() -> None:
    """`--stream` of a stream without records: one line naming the streams there are, exit 1."""
    result = rxstream_timing(str(GOLDEN), "--stream", "audio")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"rxstream timing: {GOLDEN}: no records of stream 'audio'; its streams are: video; "
        "3 malformed lines, first at line 6: not JSON: Expecting value (column 1)\n"
    )


def test_cli_missing_file_exits_2_with_a_message(tmp_path: Path) -> None:
    """A log that does not exist: exit status 2 and a message naming it on stderr."""
    missing = tmp_path / "missing.jsonl"
    result = rxstream_timing(str(missing))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"rxstream timing: cannot read {missing}: No such file or directory\n"


# --- hold: pace and window keep items waiting; its own category ---------------------------------

HELD_LINES = [
    {
        "event": "[timing:video]",
        "stream": "video",
        "input_seq": seq,
        "total_ms": 1.0 + hold,
        "hops": "window,render,pace",
        "window.wait_ms": 0.1,
        "window.hold_ms": 8.0 + seq,
        "window.compute_ms": 0.05,
        "render.wait_ms": 0.2,
        "render.compute_ms": 3.0,
        "pace.wait_ms": 0.1,
        "pace.hold_ms": hold,
        "pace.compute_ms": 0.02,
    }
    for seq, hold in ((1, 2.0), (2, 4.0), (3, 6.0), (4, 30.0), (5, 8.0))
]


def held_log(tmp_path: Path) -> Path:
    """A log of five records whose window and pace held their items."""
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in HELD_LINES), encoding="utf-8")
    return path


def test_load_reads_hold_and_defaults_it_to_zero(tmp_path: Path) -> None:
    """<hop>.hold_ms is read into HopTiming.hold_ms; a hop without it holds 0."""
    (first, *_) = load(held_log(tmp_path)).records
    assert [(h.name, h.hold_ms) for h in first.hops] == [
        ("window", 9.0),
        ("render", 0.0),
        ("pace", 2.0),
    ]
    assert all(hop.hold_ms == 0.0 for r in load(GOLDEN).records for hop in r.hops)


def test_summary_has_hold_percentiles_per_hop(tmp_path: Path) -> None:
    """summarize(): hold p50/p95/p99 per hop, and which hops held at all."""
    summary = summarize(load(held_log(tmp_path)))
    window, render, pace = summary.hops
    # pace holds sorted 2 4 6 8 30 -> p50 6, p95 8 + 0.8 * 22 = 25.6, p99 8 + 0.96 * 22 = 29.12
    assert pace.hold_ms == {50: approx(6.0), 95: approx(25.6), 99: approx(29.12)}
    assert window.hold_ms[50] == approx(11.0)
    assert (window.holds, render.holds, pace.holds) == (True, False, True)
    assert render.hold_ms == {50: 0.0, 95: 0.0, 99: 0.0}
    assert pace.compute_ms[50] == approx(0.02)  # the wait for the tick is not compute


def test_hold_columns_in_the_table_and_json_only_where_held(tmp_path: Path) -> None:
    """The table gains hold columns ('-' for a hop that never held); JSON hold_ms likewise."""
    summary = summarize(load(held_log(tmp_path)))
    lines = format_summary(summary).splitlines()
    assert lines[1].split() == [
        "hop", "count", "wait", "p50", "p95", "p99", "hold", "p50", "p95", "p99",
        "compute", "p50", "p95", "p99",
    ]  # fmt: skip
    assert lines[3].split() == ["render", "5", *["0.20"] * 3, "-", "-", "-", *["3.00"] * 3]
    assert lines[4].split()[:7] == ["pace", "5", "0.10", "0.10", "0.10", "6.00", "25.60"]
    hops = summary.to_json()["hops"]
    assert hops[2]["hold_ms"] == {"p50": 6.0, "p95": 25.6, "p99": 29.12}
    assert "hold_ms" not in hops[1]
    assert "hold" not in format_summary(summarize(load(GOLDEN)))  # no hop held: as before


def test_plot_draws_hold_as_its_own_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plot() stacks wait, hold and compute p50 per hop: hold is a bar of its own."""
    from matplotlib.axes import Axes

    drawn: dict[str, list[float]] = {}
    barh = Axes.barh

    def spy(self: Axes, y: Any, width: Any, *args: Any, label: str = "", **kwargs: Any) -> Any:
        drawn[label] = list(width)
        return barh(self, y, width, *args, label=label, **kwargs)

    monkeypatch.setattr(Axes, "barh", spy)
    log = load(held_log(tmp_path))
    out = tmp_path / "held.png"
    plot(summarize(log), log.records, out)
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert list(drawn) == ["queue-wait p50", "hold p50", "compute p50"]
    assert drawn["hold p50"] == [approx(11.0), 0.0, approx(6.0)]
