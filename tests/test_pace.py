"""ctx.pace on virtual time: pts in the time base, idle repeats, overflow policies, build errors,
and the phase lock (steady rate, bounded slew, idle repeat, catch-up) against the fixed grid.

Everything runs through ``pipeline.drive(interval=...)``: sources are pulled ``interval``
virtual seconds apart and the pace ticks run on the drive's virtual clock, so the number of
idle repeats between two frames is exactly determined. (The pace core needs the engine's
private stage shell and clock, so it is not driven through ``reactivex.testing`` here.)
"""

from __future__ import annotations

import importlib.util
import itertools
import random
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from reactivex.subject import Subject

from rxstream import Context, PipelineItem, PipelineMetadata, StageBuildError
from rxstream._kernel._generations import Generations
from rxstream._kernel._shell import StageShell
from rxstream.operators._pace import AHEAD_S, MIN_LEAD, SLEW, _inherit, pace_operator
from rxstream.runtime._thread import VirtualClock
from rxstream.testing import drive_items
from rxstream.typing import PaceOverflow, PacePhase

ROOT = Path(__file__).resolve().parent.parent


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
    """Frames every 0.25 s at 10 fps on the grid: each tick without a new frame repeats the last."""
    pace = ctx.pace(fps=10, phase="fixed")
    out = drive_items(ctx.source(range(10)) | pace, 3, interval=0.25)
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
    pipeline = ctx.source(range(8)) | ctx.pace(fps=10, overflow="latest", phase="fixed")
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


def test_a_frame_that_displaces_one_under_latest_carries_its_input(ctx: Context) -> None:
    """'latest' drops b for c: c is the first frame shown after b's input, so c carries it."""
    fed = PipelineMetadata(
        input_seq=7,
        input_at_ms=100,
        timeline=(("input.recv", 1.0), ("mouse.in", 1.5)),
        cutover=True,
        prompt_generation=1,
    )

    def frames() -> Iterator[PipelineItem]:
        yield PipelineItem("a", PipelineMetadata())
        yield PipelineItem("b", fed)  # displaced by c before its tick
        yield PipelineItem("c", PipelineMetadata(prompt_generation=1, timeline=(("clock", 2.0),)))

    pace = ctx.pace(fps=10, overflow="latest", capacity=1, phase="fixed")
    out = drive_items(ctx.source(frames) | pace, 3, interval=0.03)  # 3: pull c too
    assert [item.payload for item in out] == ["a", "c"]
    shown = out[1].metadata
    assert (shown.input_seq, shown.input_at_ms, shown.cutover) == (7, 100, True)
    assert [hop for hop, _ in shown.timeline][:2] == ["input.recv", "mouse.in"]
    assert shown.pts == 1


def test_a_frame_displaced_by_a_newer_generation_passes_nothing_on(ctx: Context) -> None:
    """'latest' drops b (old generation, input 7) for the steer's first frame c: c stays c's."""
    old = PipelineMetadata(input_seq=7, input_at_ms=100, timeline=(("input.recv", 1.0),))
    steered = PipelineMetadata(
        prompt_generation=1, drop_generation=1, cutover=True, timeline=(("steer", 2.0),)
    )

    def frames() -> Iterator[PipelineItem]:
        yield PipelineItem("a", PipelineMetadata())
        yield PipelineItem("b", old)  # displaced by c before its tick
        yield PipelineItem("c", steered)

    pace = ctx.pace(fps=10, overflow="latest", capacity=1, phase="fixed")
    out = drive_items(ctx.source(frames) | pace, 3, interval=0.03)
    assert [item.payload for item in out] == ["a", "c"]
    shown = out[1].metadata
    assert (shown.input_seq, shown.input_at_ms, shown.cutover) == (0, 0, True)
    assert shown.timeline[0] == ("steer", 2.0)


def test_a_displaced_cutover_without_input_keeps_its_origin(ctx: Context) -> None:
    """'latest' drops the cutover b (origin steer, no input) for c: c reports it from the steer."""
    cut = PipelineMetadata(prompt_generation=1, cutover=True, timeline=(("steer", 2.0),))
    after = PipelineMetadata(prompt_generation=1, timeline=(("clock.in", 2.5),))

    def frames() -> Iterator[PipelineItem]:
        yield PipelineItem("a", PipelineMetadata())
        yield PipelineItem("b", cut)  # displaced by c before its tick
        yield PipelineItem("c", after)

    pace = ctx.pace(fps=10, overflow="latest", capacity=1, phase="fixed")
    out = drive_items(ctx.source(frames) | pace, 3, interval=0.03)
    assert [item.payload for item in out] == ["a", "c"]
    shown = out[1].metadata
    assert (shown.input_seq, shown.cutover) == (0, True)
    assert shown.timeline[0] == ("steer", 2.0)


def test_a_displaced_cutover_passes_on_its_arrival() -> None:
    """The frame shown for a displaced input-less cutover holds from the cutover's arrival."""
    cut = PipelineItem("b", PipelineMetadata(cutover=True, timeline=(("steer", 2.0),)))
    after = PipelineItem("c", PipelineMetadata(timeline=(("clock.in", 2.5),)))
    buffer = deque([(after, 2.6, 2.6)])
    _inherit(buffer, (cut, 2.1, 2.1))
    survivor, arrived, at = buffer[0]
    assert (survivor.payload, survivor.metadata.cutover, arrived, at) == ("c", True, 2.1, 2.6)


def test_overflow_latest_respects_the_capacity(ctx: Context) -> None:
    """overflow='latest' with capacity=1 keeps only the newest frame between ticks."""
    pipeline = ctx.source(range(8)) | ctx.pace(fps=10, overflow="latest", capacity=1, phase="fixed")
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


# --- the phase lock, on virtual time ------------------------------------------------------------
#
# These drive the pace core alone on a VirtualClock: each frame arrives at a virtual time the
# test chooses (a Subject fed by scheduled actions), and every emission is recorded with the
# virtual time of its tick, so holds and periods are exact. P is the frame period (10 fps).

P = 0.1


@dataclass(frozen=True)
class Tick:
    """One emission of the pace: when (virtual s), which frame, idle or not."""

    at: float
    frame: int
    idle: bool


def run_pace(
    arrivals: Sequence[float],
    *,
    phase: PacePhase = "lock",
    capacity: int = 2,
    overflow: PaceOverflow = "throttle",
) -> list[Tick]:
    """Frames 0, 1, ... arriving at ``arrivals`` into a 10 fps pace; every tick it emits."""
    clock = VirtualClock()
    shell = StageShell(
        "pace", "pace", clock, "raise", _unexpected, _unexpected, Generations(), timing=False
    )
    subject: Subject[PipelineItem] = Subject()
    ticks: list[Tick] = []
    stream = pace_operator(P, 1, capacity, overflow, phase)(shell)([subject])

    def record(item: PipelineItem) -> None:
        ticks.append(Tick(clock.clock(), item.payload, item.metadata.idle))

    stream.subscribe(record)
    for frame, at in enumerate(arrivals):
        clock.schedule_absolute(at, _feed(subject, frame))

    def complete(_scheduler: Any, _state: Any = None) -> None:
        subject.on_completed()

    clock.schedule_absolute(max(arrivals) + 1e-6, complete)
    clock.run()
    return ticks


def _feed(subject: Subject[PipelineItem], frame: int) -> Any:
    """A scheduled action that pushes frame ``frame`` into ``subject``."""

    def action(_scheduler: Any, _state: Any = None) -> None:
        subject.on_next(PipelineItem(frame, PipelineMetadata()))

    return action


def _unexpected(*args: Any) -> None:
    """A shell callback the pace must never use here (failures, async calls)."""
    raise AssertionError(f"unexpected call with {args!r}")


def holds(ticks: list[Tick], arrivals: Sequence[float]) -> list[float]:
    """How long each real frame waited between its arrival and its tick (s), in frame order."""
    return [tick.at - arrivals[tick.frame] for tick in ticks if not tick.idle]


def periods(ticks: list[Tick]) -> list[float]:
    """The time between consecutive ticks (s)."""
    return [b.at - a.at for a, b in itertools.pairwise(ticks)]


# Frame 0 arrives at 0 s (it anchors the ticks), every later frame 40 ms before its grid tick
# (a slow first frame): on a fixed grid each waits 40 ms for its tick.
LATE_PHASE = [0.0] + [k * P - 0.04 for k in range(1, 200)]


def test_fixed_grid_holds_frames_for_the_rest_of_the_period() -> None:
    """phase='fixed': ticks exactly on the grid from the first frame; each frame waits 40 ms."""
    ticks = run_pace(LATE_PHASE, phase="fixed")
    assert [tick.frame for tick in ticks] == list(range(200))
    assert not any(tick.idle for tick in ticks)
    assert [tick.at for tick in ticks] == pytest.approx([k * P for k in range(200)], abs=1e-9)
    assert holds(ticks, LATE_PHASE)[1:] == pytest.approx([0.04] * 199, abs=1e-9)


def test_lock_moves_the_ticks_to_just_after_the_arrivals() -> None:
    """phase='lock': the hold converges from 40 ms to the minimum lead, frames in order."""
    ticks = run_pace(LATE_PHASE)
    assert [tick.frame for tick in ticks if not tick.idle] == list(range(200))
    settled = holds(ticks, LATE_PHASE)[60:]
    assert max(settled) <= MIN_LEAD + 1e-6
    assert min(settled) >= 0.0


def test_lock_keeps_the_rate_over_many_periods() -> None:
    """Steady arrivals at the rate: after locking, one tick per period, each one a real frame."""
    ticks = run_pace(LATE_PHASE)
    assert sum(tick.idle for tick in ticks) == 0
    settled = periods(ticks)[60:]
    assert settled == pytest.approx([P] * len(settled), rel=1e-3)
    assert (ticks[-1].at - ticks[60].at) / (len(ticks) - 61) == pytest.approx(P, rel=1e-4)


def jittery_arrivals(seed: int) -> list[float]:
    """300 frames at the rate with ±20 ms jitter, a 0.5 s stall and a burst of three."""
    rng = random.Random(seed)
    times = [k * P + rng.uniform(-0.02, 0.02) for k in range(300)]
    times[100:] = [t + 0.5 for t in times[100:]]  # the upstream stalls for half a second
    times[201] = times[202] = times[200]  # then three frames at once
    return sorted(max(t, 0.0) for t in times)


@pytest.mark.parametrize("seed", range(5))
def test_lock_slews_every_period_within_ten_percent(seed: int) -> None:
    """Jitter, a stall and a burst: no period is ever outside 1/fps ± 10 %."""
    arrivals = jittery_arrivals(seed)
    ticks = run_pace(arrivals)
    assert [tick.frame for tick in ticks if not tick.idle] == list(range(300))
    spans = periods(ticks)
    assert min(spans) >= (1 - SLEW) * P - 1e-9
    assert max(spans) <= (1 + SLEW) * P + 1e-9
    assert min(spans) < 0.95 * P  # the lock did slew (the burst made it catch up)


def test_lock_repeats_idle_on_underflow_at_the_rate() -> None:
    """A 0.45 s gap in the arrivals: the last frame repeats marked idle, one per period."""
    arrivals = [k * P for k in range(10)] + [1.35 + k * P for k in range(10)]
    ticks = run_pace(arrivals)
    gap = [tick for tick in ticks if tick.idle]
    assert [tick.frame for tick in gap] == [9] * len(gap)
    assert 3 <= len(gap) <= 5
    assert [tick.frame for tick in ticks if not tick.idle] == list(range(20))
    assert all((1 - SLEW) * P - 1e-9 <= span <= (1 + SLEW) * P + 1e-9 for span in periods(ticks))
    # the first idle tick waited 10 % for a late frame; the next ones come every period
    assert periods(gap) == pytest.approx([P] * (len(gap) - 1), abs=1e-9)


def test_lock_catches_up_after_a_frame_misses_its_tick() -> None:
    """A frame 40 ms late: one idle repeat, then ticks run fast until holds are short again."""
    arrivals = [k * P for k in range(100)]
    arrivals[50:] = [t + 0.005 for t in arrivals[50:]]
    arrivals[50] += 0.04  # misses its tick; the ones after arrive on time
    ticks = run_pace(arrivals)
    assert [tick.frame for tick in ticks if tick.idle] == [49]
    after = holds(ticks, arrivals)[51:]
    assert after[0] > 0.5 * P  # frame 51 waited behind the late frame
    assert max(after[15:]) < 0.02  # and the lock has caught up since
    assert min(periods(ticks)) >= (1 - SLEW) * P - 1e-9


def test_the_demos_pace_skips_a_late_frame_instead_of_queueing_behind_it() -> None:
    """The demo's pace (one slot, 'latest'): a late frame gives way to the next; no catch-up."""
    spec = importlib.util.spec_from_file_location("demo_pace", ROOT / "examples" / "demo.py")
    assert spec is not None
    assert spec.loader is not None
    demo = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses
    spec.loader.exec_module(demo)
    arrivals = [k * P for k in range(100)]
    arrivals[50:] = [t + 0.005 for t in arrivals[50:]]
    arrivals[50] += 0.04  # misses its tick (one idle repeat); frame 51 comes before the next
    ticks = run_pace(arrivals, capacity=demo.PACE_CAPACITY, overflow=demo.PACE_OVERFLOW)
    assert [tick.frame for tick in ticks if tick.idle] == [49]
    shown = [tick.frame for tick in ticks if not tick.idle]
    assert shown == [*range(50), *range(51, 100)]  # frame 50 dropped, counted as 'latest'
    after = holds(ticks, arrivals)[50:]
    assert max(after) < 0.02  # frame 51 on: no frame waits behind a late one
    assert all((1 - SLEW) * P - 1e-9 <= span <= (1 + SLEW) * P + 1e-9 for span in periods(ticks))


def test_lock_waits_within_the_slew_for_a_late_frame() -> None:
    """A frame 5 ms late for its tick (lead < 5 ms): no idle repeat, it leaves on arrival."""
    arrivals = [k * P for k in range(60)]
    arrivals[40] += 0.005 + 0.002  # later than its tick by more than the lead, within 10 ms
    ticks = run_pace(arrivals)
    assert not any(tick.idle for tick in ticks)
    late = next(tick for tick in ticks if tick.frame == 40)
    assert late.at == pytest.approx(arrivals[40], abs=1e-9)
    assert all((1 - SLEW) * P - 1e-9 <= span <= (1 + SLEW) * P + 1e-9 for span in periods(ticks))
    fixed = run_pace(arrivals, phase="fixed")
    assert [tick.frame for tick in fixed if tick.idle] == [39]  # the grid repeats instead


def test_lock_drains_a_backlog_after_a_stall() -> None:
    """A 0.4 s stall then five frames at once: the lock drains them; the grid keeps them."""
    arrivals = [k * P + 0.05 for k in range(150)]
    arrivals[20:25] = [24 * P + 0.05] * 5
    locked = holds(run_pace(arrivals), arrivals)
    fixed = holds(run_pace(arrivals, phase="fixed"), arrivals)
    assert min(fixed[30:]) > 3 * P  # the grid never gets the four periods back
    assert max(locked[100:]) < 0.01  # the lock did, at most 10 % a period faster


def test_lock_does_not_speed_up_for_a_faster_upstream() -> None:
    """Frames at twice the rate (buffered, throttled): the ticks keep 1/fps over the long run."""
    arrivals = [k * P / 2 for k in range(400)]
    ticks = run_pace(arrivals)
    assert [tick.frame for tick in ticks] == list(range(400))
    ahead = round(AHEAD_S / P)  # periods a lock may gain on the grid (one second's)
    assert ticks[-1].at - ticks[0].at >= (399 - ahead) * P - 1e-9
    assert all(span >= (1 - SLEW) * P - 1e-9 for span in periods(ticks))
    settled = periods(ticks)[10 * ahead + 1 :]
    assert settled == pytest.approx([P] * len(settled), rel=1e-6)


def test_lock_and_fixed_both_drive_through_a_pipeline(ctx: Context) -> None:
    """Under drive(), both phases emit every frame in order with pts counting ticks."""
    for phase in ("lock", "fixed"):
        pace = ctx.pace(fps=10, phase=phase, name=f"pace_{phase}")
        out = drive_items(ctx.source(range(6), name=f"src_{phase}") | pace, 6, interval=0.1)
        assert [item.payload for item in out if not item.metadata.idle] == list(range(6))
        assert [item.metadata.pts for item in out] == list(range(len(out)))


def test_bad_phase_raises_stage_build_error(ctx: Context) -> None:
    """phase must be lock or fixed; anything else fails at build time naming the stage."""
    with pytest.raises(
        StageBuildError, match=r"^phase must be one of lock, fixed, got 'grid' for stage 'pace'$"
    ):
        ctx.pace(fps=24, phase="grid")  # type: ignore[arg-type]
