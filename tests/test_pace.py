"""ctx.pace on virtual time: pts in the time base, idle repeats, overflow policies, build errors.

Everything runs through ``pipeline.drive(interval=...)``: sources are pulled ``interval``
virtual seconds apart and the pace ticks run on the drive's virtual clock, so the number of
idle repeats between two frames is exactly determined. (The pace core needs the engine's
private stage shell and clock, so it is not driven through ``reactivex.testing`` here.)
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest

from rxstream import Context, PipelineItem, PipelineMetadata, StageBuildError
from rxstream.testing import drive_items


def frames(out: list[PipelineItem]) -> list[tuple[Any, int, bool]]:
    """(payload, pts, idle) of every item a drive returned."""
    return [(item.payload, item.metadata.pts, item.metadata.idle) for item in out]


def test_pts_counts_frames_in_the_default_time_base(ctx: Context) -> None:
    """Without time_base, pts counts in 1/fps: 0, 1, 2, ... and nothing is idle."""
    out = drive_items(ctx.source(range(10)) | ctx.pace(fps=10), 5)
    assert frames(out) == [
        (0, 0, False),
        (1, 1, False),
        (2, 2, False),
        (3, 3, False),
        (4, 4, False),
    ]


@pytest.mark.parametrize(
    ("fps", "time_base", "step"),
    [
        (24, Fraction(1, 90000), 3750),
        (30, Fraction(1, 90000), 3000),
        (Fraction(30000, 1001), Fraction(1, 90000), 3003),
        (24, Fraction(1, 48), 2),
        (25.0, Fraction(1, 1000), 40),
    ],
)
def test_pts_steps_in_the_declared_time_base(
    ctx: Context, fps: Any, time_base: Fraction, step: int
) -> None:
    """pts advances by period/time_base per frame (24 fps at 1/90000: steps of 3750)."""
    out = drive_items(ctx.source(range(4)) | ctx.pace(fps=fps, time_base=time_base), 4)
    assert [item.metadata.pts for item in out] == [0, step, 2 * step, 3 * step]
    assert [item.payload for item in out] == [0, 1, 2, 3]


def test_underflow_repeats_the_last_frame_marked_idle(ctx: Context) -> None:
    """Frames every 0.25 s at 10 fps: each tick without a new frame repeats the last, idle."""
    out = drive_items(ctx.source(range(10)) | ctx.pace(fps=10), 3, interval=0.25)
    assert frames(out) == [
        (0, 0, False),
        (0, 1, True),
        (0, 2, True),
        (1, 3, False),
        (1, 4, True),
        (2, 5, False),
    ]


def test_idle_repeats_count_in_the_time_base(ctx: Context) -> None:
    """Idle ticks advance pts by the same time-base step as real frames (24 fps, 1/90000)."""
    pace = ctx.pace(fps=24, time_base=Fraction(1, 90000))
    out = drive_items(ctx.source(range(3)) | pace, 3, interval=0.1)
    assert [(item.payload, item.metadata.idle) for item in out] == [
        (0, False),
        (0, True),
        (0, True),
        (1, False),
        (1, True),
        (2, False),
    ]
    assert [item.metadata.pts for item in out] == [3750 * k for k in range(6)]


def test_idle_repeat_of_a_cutover_frame_is_not_a_cutover(ctx: Context) -> None:
    """Only the real first frame of a generation is the cutover; its idle repeats are not."""

    def frames_with_cutover() -> Iterator[PipelineItem]:
        yield PipelineItem("a", PipelineMetadata(cutover=True, prompt_generation=1))
        yield PipelineItem("b", PipelineMetadata(prompt_generation=1))

    out = drive_items(ctx.source(frames_with_cutover) | ctx.pace(fps=10), 2, interval=0.25)
    assert [(i.payload, i.metadata.idle, i.metadata.cutover) for i in out] == [
        ("a", False, True),
        ("a", True, False),
        ("a", True, False),
        ("b", False, False),
    ]
    assert {item.metadata.prompt_generation for item in out} == {1}


def test_no_idle_tail_after_the_upstream_completes(ctx: Context) -> None:
    """A source that ends at 0.44 s: idle repeats fill the gaps, none follow the completion."""
    out = drive_items(ctx.source(range(2)) | ctx.pace(fps=10), 5, interval=0.22)
    assert frames(out) == [
        (0, 0, False),
        (0, 1, True),
        (0, 2, True),
        (1, 3, False),
        (1, 4, True),
    ]


def test_buffered_frames_drain_at_the_rate_then_complete(ctx: Context) -> None:
    """Frames all arriving at t=0 drain one per tick, then the stage completes: no idle."""
    out = drive_items(ctx.source(range(3)) | ctx.pace(fps=10), 3)
    assert frames(out) == [(0, 0, False), (1, 1, False), (2, 2, False)]


def test_empty_upstream_completes_without_output(ctx: Context) -> None:
    """A pace that never saw a frame emits nothing (no tick without a first frame)."""
    assert drive_items(ctx.source(range(3)) | ctx.pace(fps=10), 0) == []


def test_overflow_latest_drops_the_oldest_and_counts_it(ctx: Context) -> None:
    """overflow='latest' (capacity 2): frames every 30 ms into 10 fps drop the oldest, counted."""
    pipeline = ctx.source(range(8)) | ctx.pace(fps=10, overflow="latest")
    out = drive_items(pipeline, 8, interval=0.03)
    assert frames(out) == [
        (0, 0, False),
        (2, 1, False),
        (5, 2, False),
        (6, 3, False),
        (7, 4, False),
    ]
    stats = pipeline.statistics()["pace"]
    assert dict(stats.dropped) == {"latest": 3}
    assert (stats.items_in, stats.items_out) == (8, 5)


def test_overflow_latest_respects_the_capacity(ctx: Context) -> None:
    """overflow='latest' with capacity=1 keeps only the newest frame between ticks."""
    pipeline = ctx.source(range(8)) | ctx.pace(fps=10, overflow="latest", capacity=1)
    out = drive_items(pipeline, 8, interval=0.03)
    assert [item.payload for item in out] == [0, 3, 6, 7]
    assert dict(pipeline.statistics()["pace"].dropped) == {"latest": 4}


def test_overflow_throttle_drops_nothing(ctx: Context) -> None:
    """overflow='throttle' (the default): every frame goes out in order, none dropped."""
    pipeline = ctx.source(range(8)) | ctx.pace(fps=10)
    out = drive_items(pipeline, 8, interval=0.03)
    assert frames(out) == [(k, k, False) for k in range(8)]
    stats = pipeline.statistics()["pace"]
    assert dict(stats.dropped) == {}
    assert (stats.items_in, stats.items_out) == (8, 8)


def test_drive_is_repeatable(ctx: Context) -> None:
    """Two sessions of one pipeline on virtual time produce identical pts/idle sequences."""
    pipeline = ctx.source(range(10)) | ctx.pace(fps=10, overflow="latest")
    first = frames(drive_items(pipeline, 10, interval=0.07))
    pipeline.reset()
    second = frames(drive_items(pipeline, 10, interval=0.07))
    assert first == second
    assert [pts for _, pts, _ in first] == list(range(len(first)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fps": 0}, r"^fps must be a finite number > 0, got 0 for stage 'pace'$"),
        ({"fps": -24.0}, r"^fps must be a finite number > 0, got -24\.0 for stage 'pace'$"),
        ({"fps": float("nan")}, r"^fps must be a finite number > 0, got nan for stage 'pace'$"),
        ({"fps": "24"}, r"^fps must be a number > 0, got '24' for stage 'pace'$"),
        ({"fps": None}, r"^fps must be a number > 0, got None for stage 'pace'$"),
        ({"fps": True}, r"^fps must be a number > 0, got True for stage 'pace'$"),
        (
            {"fps": 0, "name": "video_pace"},
            r"^fps must be a finite number > 0, got 0 for stage 'video_pace'$",
        ),
        (
            {"fps": 24, "overflow": "drop_new"},
            r"^overflow must be one of throttle, latest, got 'drop_new' for stage 'pace'$",
        ),
        (
            {"fps": 24, "time_base": Fraction(1, 100)},
            r"^time_base must divide the frame period 1/24 s into whole ticks, "
            r"got 1/100 for stage 'pace'$",
        ),
        (
            {"fps": 24, "time_base": Fraction(-1, 90000)},
            r"^time_base must be > 0, got -1/90000 for stage 'pace'$",
        ),
    ],
)
def test_bad_pace_arguments_raise_stage_build_error(
    ctx: Context, kwargs: dict[str, Any], message: str
) -> None:
    """Bad fps, overflow or time_base fail at build time with a message stating the rule."""
    with pytest.raises(StageBuildError, match=message):
        ctx.pace(**kwargs)
