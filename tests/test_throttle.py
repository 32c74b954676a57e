"""``ctx.throttle(ms=…)``: at most one item per ``ms``, the rest dropped and counted."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import rxstream
from rxstream._exceptions import StageBuildError
from rxstream.runtime._books import unbalanced
from rxstream.runtime._threaded import ThreadedRun


def test_throttle_passes_the_first_item_of_each_quiet_span(ctx: rxstream.Context) -> None:
    """Pulls 25 virtual ms apart through a 60 ms throttle: items 0, 3, 6, 9 pass."""
    pipeline = ctx.source(range(10), name="src") | ctx.throttle(ms=60, name="t")
    assert pipeline.drive(10, interval=0.025) == [0, 3, 6, 9]
    t = pipeline.statistics()["t"]
    assert (t.items_out, dict(t.dropped)) == (4, {"throttled": 6})


def test_throttle_passes_everything_slower_than_its_span(ctx: rxstream.Context) -> None:
    """Items further apart than ``ms`` all pass: a throttle only bounds the rate."""
    pipeline = ctx.source(range(5)) | ctx.throttle(ms=10)
    assert pipeline.drive(5, interval=0.05) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("ms", [0, -1, float("nan"), float("inf"), True, "10"])
def test_throttle_refuses_a_span_that_is_not_a_positive_number(
    ctx: rxstream.Context, ms: object
) -> None:
    """``ms`` must be a finite number > 0: one line naming the field, the stage and the value."""
    with pytest.raises(StageBuildError) as caught:
        ctx.throttle(ms=ms, name="preview")  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"throttle ms must be a finite number > 0, got {ms!r} for stage 'preview'"
    )


def test_a_threaded_throttle_balances_its_books(
    ctx: rxstream.Context, balanced_books: list[ThreadedRun]
) -> None:
    """Threaded, a burst through a long throttle: the first passes, the rest are
    ``throttled``, and the books hold the stage to its 1:1 law over what it took."""
    done = threading.Event()
    pipeline = (
        ctx.source(range(20), name="src")
        | ctx.throttle(ms=60_000, name="t")
        | ctx.tap(lambda _: done.set(), name="seen")
    )
    pipeline.start()
    assert done.wait(10)
    pipeline.wait(timeout=10)
    pipeline.stop()
    t = pipeline.statistics()["t"]
    assert (t.items_out, t.dropped["throttled"]) == (1, 19)
    assert unbalanced(balanced_books[0]) == []


def test_a_codec_error_after_a_throttle_names_the_stage_before_it(
    ctx: rxstream.Context,
) -> None:
    """A throttle hands payloads on as they came (its kind declares ``passes``): a sink's
    refusal names the stage that made the frame, not the throttle."""
    bad = np.zeros((1, 32, 48, 3), np.uint8)
    pipeline = (
        ctx.source(range(10), name="counter")
        | ctx.pipe(lambda _: bad, name="paint")
        | ctx.throttle(ms=10)
        | ctx.stream("video", codec="h264")
    )
    with pytest.raises(rxstream.PipelineError) as failed:
        pipeline.drive(frames=1)
    assert str(failed.value.__cause__).endswith("got shape (1, 32, 48, 3) from stage 'paint'")
