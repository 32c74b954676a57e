"""ctx.window: count windows, ms windows on virtual time, the N:1 metadata merge, build errors.

Time windows run on the drive's virtual clock: sources are pulled ``interval`` virtual seconds
apart, and a burst of items at one instant is made by unbatching a list.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rxstream import Context, PipelineError, PipelineItem, PipelineMetadata, StageBuildError
from rxstream.testing import drive, drive_items


def test_count_windows_group_consecutive_items(ctx: Context) -> None:
    """window(count=3) over 0..8 emits [0,1,2], [3,4,5], [6,7,8]."""
    out = drive(ctx.source(range(9)) | ctx.window(count=3), 9)
    assert out == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_partial_count_window_is_flushed_at_completion(ctx: Context) -> None:
    """The last, incomplete window is emitted when the upstream completes (the 8th pull)."""
    out = drive(ctx.source(range(7)) | ctx.window(count=3), 8)
    assert out == [[0, 1, 2], [3, 4, 5], [6]]


def test_partial_count_window_waits_for_the_next_drive(ctx: Context) -> None:
    """A drive leaves an incomplete window open; the next drive fills it (one session)."""
    pipeline = ctx.source(range(10)) | ctx.window(count=3)
    assert drive(pipeline, 4) == [[0, 1, 2]]
    assert drive(pipeline, 2) == [[3, 4, 5]]
    assert drive(pipeline, 5) == [[6, 7, 8], [9]]  # the 11th pull ends the source


def test_count_one_wraps_every_item(ctx: Context) -> None:
    """window(count=1) emits each item alone in a list."""
    assert drive(ctx.source("abc") | ctx.window(count=1), 3) == [["a"], ["b"], ["c"]]


def test_ms_window_closes_ms_after_it_opens(ctx: Context) -> None:
    """Items every 100 ms in 250 ms windows: each window holds what came in its first 250 ms."""
    out = drive(ctx.source(range(7)) | ctx.window(ms=250), 7, interval=0.1)
    assert out == [[0, 1, 2], [3, 4, 5], [6]]


def test_ms_window_opens_with_its_first_item(ctx: Context) -> None:
    """Items every 300 ms with 250 ms windows: one window per item, none empty in the gaps."""
    out = drive(ctx.source(range(4)) | ctx.window(ms=250), 4, interval=0.3)
    assert out == [[0], [1], [2], [3]]


def test_no_empty_windows_across_silent_stretches(ctx: Context) -> None:
    """Batches with empty stretches between them never produce an empty window."""
    batches = [[0, 1], [], [], [], [2], [], [], [], [3]]
    pipeline = ctx.source(batches) | ctx.unbatch() | ctx.window(ms=150)
    out = drive(pipeline, len(batches), interval=0.1)
    assert out == [[0, 1], [2], [3]]


def test_no_window_without_items(ctx: Context) -> None:
    """A drive of zero frames emits no window at all (count or time)."""
    assert drive(ctx.source(range(3)) | ctx.window(count=2, ms=100), 0, interval=0.1) == []


def test_count_or_time_whichever_comes_first(ctx: Context) -> None:
    """count=3, ms=150: bursts close on count, stragglers close on time, the rest at completion."""
    batches = [[0, 1, 2, 3], [4], [], [5, 6, 7, 8], [], [], [9]]
    pipeline = ctx.source(batches) | ctx.unbatch() | ctx.window(count=3, ms=150)
    out = drive(pipeline, len(batches), interval=0.1)
    assert out == [[0, 1, 2], [3, 4], [5, 6, 7], [8], [9]]


def test_count_reached_before_time_closes_early(ctx: Context) -> None:
    """count=2 with a 250 ms span and items every 100 ms: every window closes on count."""
    out = drive(ctx.source(range(5)) | ctx.window(count=2, ms=250), 5, interval=0.1)
    assert out == [[0, 1], [2, 3], [4]]


def test_time_reached_before_count_closes_early(ctx: Context) -> None:
    """count=5 with a 250 ms span and items every 100 ms: every window closes on time."""
    out = drive(ctx.source(range(8)) | ctx.window(count=5, ms=250), 8, interval=0.1)
    assert out == [[0, 1, 2], [3, 4, 5], [6, 7]]


def ticks() -> Iterator[PipelineItem]:
    """Five input samples, input_seq 1..5 at 100 ms apart, generation 2 from the fourth on."""
    for seq in range(1, 6):
        yield PipelineItem(
            f"tick{seq}",
            PipelineMetadata(
                input_seq=seq,
                input_at_ms=100 * seq,
                pts=seq,
                prompt_generation=2 if seq >= 4 else 1,
                cutover=seq == 4,
                timeline=(("input.recv", float(seq)),),
            ),
        )


def test_window_carries_the_newest_tick_correlation(ctx: Context) -> None:
    """Each window's input_seq/input_at_ms/pts are those of its newest input tick."""
    out = drive_items(ctx.source(ticks) | ctx.window(count=2), 6)  # the 6th pull ends it
    assert [item.payload for item in out] == [["tick1", "tick2"], ["tick3", "tick4"], ["tick5"]]
    assert [(i.metadata.input_seq, i.metadata.input_at_ms, i.metadata.pts) for i in out] == [
        (2, 200, 2),
        (4, 400, 4),
        (5, 500, 5),
    ]


def test_window_merges_generations_and_cutover(ctx: Context) -> None:
    """A window holds the highest generation of its items and cutover if any item had it."""
    out = drive_items(ctx.source(ticks) | ctx.window(count=2), 6)
    assert [(i.metadata.prompt_generation, i.metadata.cutover) for i in out] == [
        (1, False),
        (2, True),
        (2, False),
    ]


def test_window_timeline_is_the_newest_tick_plus_its_own_stamps(ctx: Context) -> None:
    """The timeline is the newest tick's (input.recv, source stamps) then window.in/.hold/.out."""
    out = drive_items(ctx.source(ticks) | ctx.window(count=2, name="win"), 6)
    for item, newest in zip(out, [2, 4, 5], strict=True):
        hops = [hop for hop, _ in item.metadata.timeline]
        assert hops == ["input.recv", "ticks.in", "ticks.out", "win.in", "win.hold", "win.out"]
        assert item.metadata.timeline[0] == ("input.recv", float(newest))


def test_window_correlation_skips_items_without_an_input(ctx: Context) -> None:
    """A window ending in an item with no input_seq still carries the newest tick's."""

    def mixed() -> Iterator[PipelineItem]:
        yield PipelineItem("tick", PipelineMetadata(input_seq=7, input_at_ms=700, pts=1))
        yield PipelineItem("frame", PipelineMetadata(pts=2))

    (item,) = drive_items(ctx.source(mixed) | ctx.window(count=2), 2)
    assert item.payload == ["tick", "frame"]
    md = item.metadata
    assert (md.input_seq, md.input_at_ms, md.pts) == (7, 700, 2)


def test_time_window_carries_the_newest_tick_correlation(ctx: Context) -> None:
    """ms windows on virtual time merge metadata the same way as count windows."""
    out = drive_items(ctx.source(ticks) | ctx.window(ms=250), 5, interval=0.1)
    assert [item.payload for item in out] == [["tick1", "tick2", "tick3"], ["tick4", "tick5"]]
    assert [(i.metadata.input_seq, i.metadata.input_at_ms) for i in out] == [(3, 300), (5, 500)]


def test_window_statistics_count_items_in_and_windows_out(ctx: Context) -> None:
    """The window stage counts every item in and every window out."""
    pipeline = ctx.source(range(7)) | ctx.window(count=3)
    drive(pipeline, 8)
    stats = pipeline.statistics()["window"]
    assert (stats.items_in, stats.items_out) == (7, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"^window needs count=, ms= or until=, got none of them for 'window'$"),
        ({"name": "w"}, r"^window needs count=, ms= or until=, got none of them for 'w'$"),
        ({"count": 0}, r"^window count must be an int >= 1, got 0 for stage 'window'$"),
        ({"count": -2}, r"^window count must be an int >= 1, got -2 for stage 'window'$"),
        ({"count": 1.5}, r"^window count must be an int >= 1, got 1\.5 for stage 'window'$"),
        ({"count": "3"}, r"^window count must be an int >= 1, got '3' for stage 'window'$"),
        ({"count": True}, r"^window count must be an int >= 1, got True for stage 'window'$"),
        ({"count": 0, "name": "w"}, r"^window count must be an int >= 1, got 0 for stage 'w'$"),
        ({"ms": 0}, r"^window ms must be > 0, got 0 for stage 'window'$"),
        ({"ms": -5.0}, r"^window ms must be > 0, got -5\.0 for stage 'window'$"),
        ({"ms": "10"}, r"^window ms must be > 0, got '10' for stage 'window'$"),
        ({"ms": float("nan")}, r"^window ms must be > 0, got nan for stage 'window'$"),
        ({"count": 2, "ms": 0}, r"^window ms must be > 0, got 0 for stage 'window'$"),
        ({"until": 3}, r"^window until must be a callable, got 3 for stage 'window'$"),
    ],
)
def test_bad_window_arguments_raise_stage_build_error(
    ctx: Context, kwargs: dict[str, Any], message: str
) -> None:
    """Bad count or ms fail at build time with a message stating the rule and the value."""
    with pytest.raises(StageBuildError, match=message):
        ctx.window(**kwargs)


def test_bool_ms_is_rejected_like_a_bool_count(ctx: Context) -> None:
    """window(ms=True) is a bad span, rejected like count=True."""
    with pytest.raises(
        StageBuildError, match=r"^window ms must be > 0, got True for stage 'window'$"
    ):
        ctx.window(ms=True)


# --- until: another stream's ticks close the windows --------------------------------------------


def clock_and_samples() -> Iterator[PipelineItem]:
    """Pointer samples (input_seq 1..5) with clock ticks (payload None) after the 2nd and 5th."""
    seq = 0
    for payload in ("a", "b", None, "c", "d", "e", None):
        if payload is None:
            yield PipelineItem(None, PipelineMetadata())
        else:
            seq += 1
            yield PipelineItem(payload, PipelineMetadata(input_seq=seq, input_at_ms=seq))


def test_until_closes_each_window_with_the_item_that_matches(ctx: Context) -> None:
    """until=is-a-tick: one window per tick, the tick last; its samples' newest correlation."""
    window = ctx.window(until=lambda payload: payload is None)
    out = drive_items(ctx.source(clock_and_samples) | window, 7, interval=0.01)
    assert [item.payload for item in out] == [["a", "b", None], ["c", "d", "e", None]]
    assert [item.metadata.input_seq for item in out] == [2, 5]


def test_until_ignores_time_between_ticks(ctx: Context) -> None:
    """Items 100 ms apart and a tick every third: windows follow the ticks, not a timer."""
    out = drive(ctx.source(range(9)) | ctx.window(until=lambda n: n % 3 == 2), 9, interval=0.1)
    assert out == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_until_that_raises_fails_the_run_naming_the_window(ctx: Context) -> None:
    """A raising until() is the window stage's error: the drive raises a PipelineError."""

    def until(n: int) -> bool:
        if n == 1:
            raise ValueError("bad tick")
        return n % 2 == 0

    pipeline = ctx.source(range(5)) | ctx.window(until=until, name="w")
    with pytest.raises(PipelineError, match=r"'w'") as caught:
        drive(pipeline, 5)
    assert isinstance(caught.value.__cause__, ValueError)


def test_window_in_is_the_arrival_of_the_reported_item(ctx: Context) -> None:
    """window.in stamps the newest input's arrival, not the tick's that closed the window."""
    pipeline = ctx.source(clock_and_samples) | ctx.window(until=lambda p: p is None, name="w")
    first, _ = drive_items(pipeline, 7, interval=0.01)
    t = dict(first.metadata.timeline)
    # the window's .in follows the reported sample's own source stamps ("b", input_seq 2)
    assert first.metadata.input_seq == 2
    assert t["clock_and_samples.out"] <= t["w.in"] < t["w.hold"] <= t["w.out"]
