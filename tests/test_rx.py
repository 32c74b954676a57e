"""ctx.rx: reactivex operators lifted into stages, metadata re-attached, time on virtual clocks.

Time-based operators run on the drive's virtual clock (``drive(interval=...)``); the expected
emissions of the raw operator come from ``reactivex.testing.TestScheduler`` on the same timed
input, so the stage is checked against Rx itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import reactivex
from reactivex import operators as ops
from reactivex.notification import OnCompleted, OnNext
from reactivex.testing import ReactiveTest, TestScheduler

from rxstream import Context, PipelineError, PipelineItem, PipelineMetadata
from rxstream.item import evolve_metadata
from rxstream.testing import drive, drive_items

RxOp = Callable[[reactivex.Observable[Any]], reactivex.Observable[Any]]


def ticks() -> Iterator[PipelineItem]:
    """Input samples: payload seq % 3, input_seq 1..6, at 100 ms apart, pts 10, 20, ..."""
    for seq in range(1, 7):
        yield PipelineItem(
            seq % 3,
            PipelineMetadata(input_seq=seq, input_at_ms=100 * seq, pts=10 * seq),
        )


# --- payload-level operators --------------------------------------------------------------------


def test_filter_keeps_each_passing_item_metadata(ctx: Context) -> None:
    """ctx.rx(ops.filter(...)) lets the matching payloads through with their own pts."""
    out = drive_items(ctx.source(range(6)) | ctx.rx(ops.filter(lambda x: x % 2 == 0)), 6)
    assert [(i.payload, i.metadata.pts) for i in out] == [(0, 0), (2, 2), (4, 4)]


def test_filter_keeps_the_input_correlation(ctx: Context) -> None:
    """A filtered item keeps its own input_seq/input_at_ms, not the latest input's."""
    out = drive_items(ctx.source(ticks) | ctx.rx(ops.filter(lambda x: x == 1)), 6)
    assert [(i.payload, i.metadata.input_seq, i.metadata.input_at_ms) for i in out] == [
        (1, 1, 100),
        (1, 4, 400),
    ]


def test_distinct_until_changed_drops_repeats(ctx: Context) -> None:
    """ctx.rx(ops.distinct_until_changed()) drops consecutive repeats; survivors keep pts."""
    source = ctx.source([1, 1, 2, 2, 2, 1, 3, 3])
    out = drive_items(source | ctx.rx(ops.distinct_until_changed()), 8)
    assert [(i.payload, i.metadata.pts) for i in out] == [(1, 0), (2, 2), (1, 5), (3, 6)]


def test_map_new_values_get_the_latest_input_metadata(ctx: Context) -> None:
    """ctx.rx(ops.map(f)): each new value carries the metadata of the input it came from."""
    out = drive_items(ctx.source(ticks) | ctx.rx(ops.map(lambda x: f"v{x}")), 6)
    assert [(i.payload, i.metadata.input_seq, i.metadata.pts) for i in out] == [
        ("v1", 1, 10),
        ("v2", 2, 20),
        ("v0", 3, 30),
        ("v1", 4, 40),
        ("v2", 5, 50),
        ("v0", 6, 60),
    ]


def test_map_result_equal_to_an_earlier_input_gets_the_latest_metadata(ctx: Context) -> None:
    """ops.map(x // 2) over 0..3 yields 0, 0, 1, 1 carrying pts 0, 1, 2, 3 (latest input)."""
    out = drive_items(ctx.source(range(4)) | ctx.rx(ops.map(lambda x: x // 2)), 4)
    assert [(i.payload, i.metadata.pts) for i in out] == [(0, 0), (0, 1), (1, 2), (1, 3)]


def test_buffer_values_get_the_latest_input_metadata(ctx: Context) -> None:
    """ctx.rx(ops.buffer_with_count(2)): each list carries the metadata of its last input."""
    out = drive_items(ctx.source(range(5)) | ctx.rx(ops.buffer_with_count(2)), 6)
    assert [(i.payload, i.metadata.pts) for i in out] == [([0, 1], 1), ([2, 3], 3), ([4], 4)]


def test_rx_stage_stamps_its_hops(ctx: Context) -> None:
    """An rx stage appends <name>.in/<name>.out to the timeline of what it lets through."""
    out = drive_items(ctx.source(range(2)) | ctx.rx(ops.filter(bool), name="nonzero"), 2)
    assert [[hop for hop, _ in i.metadata.timeline] for i in out] == [
        ["source.in", "source.out", "nonzero.in", "nonzero.out"]
    ]


def test_operator_that_completes_early_ends_the_stream(ctx: Context) -> None:
    """ctx.rx(ops.take(2)) emits two items and completes; the drive returns just those."""
    assert drive(ctx.source(range(10)) | ctx.rx(ops.take(2)), 10) == [0, 1]


def test_operator_error_names_the_stage(ctx: Context) -> None:
    """An exception inside the lifted operator ends the drive with a PipelineError."""
    pipeline = ctx.source(range(-2, 2)) | ctx.rx(ops.map(lambda x: 1 // x), name="inverse")
    with pytest.raises(
        PipelineError,
        match=r"^stage 'inverse' failed on item pts=2 input_seq=0: ZeroDivisionError: ",
    ) as excinfo:
        drive(pipeline, 4)
    assert excinfo.value.stage == "inverse"
    assert isinstance(excinfo.value.__cause__, ZeroDivisionError)


# --- items=True ---------------------------------------------------------------------------------


def test_items_true_operator_sees_pipeline_items(ctx: Context) -> None:
    """With items=True the operator filters on metadata (here: input_seq is even)."""

    def even_input(item: PipelineItem) -> bool:
        return item.metadata.input_seq % 2 == 0

    out = drive_items(ctx.source(ticks) | ctx.rx(ops.filter(even_input), items=True), 6)
    assert [(i.payload, i.metadata.input_seq) for i in out] == [(2, 2), (1, 4), (0, 6)]


def test_items_true_operator_controls_the_metadata(ctx: Context) -> None:
    """With items=True the metadata the operator builds travels on (plus the stage's stamps)."""

    def mark(item: PipelineItem) -> PipelineItem:
        metadata = evolve_metadata(item.metadata, cutover=True, prompt_generation=7)
        return PipelineItem(item.payload * 10, metadata)

    out = drive_items(ctx.source(range(3)) | ctx.rx(ops.map(mark), items=True, name="mark"), 3)
    assert [
        (i.payload, i.metadata.pts, i.metadata.cutover, i.metadata.prompt_generation) for i in out
    ] == [(0, 0, True, 7), (10, 1, True, 7), (20, 2, True, 7)]
    assert [hop for hop, _ in out[0].metadata.timeline][-2:] == ["mark.in", "mark.out"]


# --- time-based operators on virtual time ---------------------------------------------------------


def test_throttle_first_on_virtual_time(ctx: Context) -> None:
    """throttle_first(0.25 s) over items every 100 ms keeps 0, 3, 6, 9 with their own pts."""
    pipeline = ctx.source(range(10)) | ctx.rx(ops.throttle_first(0.25))
    out = drive_items(pipeline, 10, interval=0.1)
    assert [(i.payload, i.metadata.pts) for i in out] == [(0, 0), (3, 3), (6, 6), (9, 9)]


@pytest.mark.parametrize(
    ("duetime", "expected"),
    [
        (0.15, [9]),
        (0.05, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
    ],
)
def test_debounce_on_virtual_time(ctx: Context, duetime: float, expected: list[int]) -> None:
    """debounce longer than the 100 ms spacing keeps only the last; shorter keeps every item."""
    pipeline = ctx.source(range(10)) | ctx.rx(ops.debounce(duetime))
    out = drive_items(pipeline, 10, interval=0.1)
    assert [i.payload for i in out] == expected
    assert [i.metadata.pts for i in out] == expected


def test_debounce_with_bursts_emits_the_last_of_each_burst(ctx: Context) -> None:
    """Bursts 0.3 s apart through debounce(0.1 s): one item, the last, per burst."""
    batches = [[0, 1, 2], [], [], [3, 4], [], [], [5]]
    pipeline = ctx.source(batches) | ctx.unbatch() | ctx.rx(ops.debounce(0.1))
    assert drive(pipeline, len(batches), interval=0.1) == [2, 4, 5]


def rx_reference(op: RxOp, n: int, spacing: int) -> list[Any]:
    """What ``op`` emits on reactivex's TestScheduler for 0..n-1 every ``spacing`` ticks."""
    on_next, on_completed = ReactiveTest.on_next, ReactiveTest.on_completed
    scheduler = TestScheduler()
    messages = [on_next(i * spacing, i) for i in range(n)]
    messages.append(on_completed((n - 1) * spacing))
    source = scheduler.create_cold_observable(messages)
    observer = scheduler.start(lambda: source.pipe(op), disposed=100_000)
    notifications = [m.value for m in observer.messages]
    assert isinstance(notifications[-1], OnCompleted)
    return [n.value for n in notifications if isinstance(n, OnNext)]


@pytest.mark.parametrize(
    "make_op",
    [
        pytest.param(lambda: ops.throttle_first(25), id="throttle_first"),
        pytest.param(lambda: ops.throttle_first(15), id="throttle_first-short"),
        pytest.param(lambda: ops.throttle_first(10), id="throttle_first-equal"),
        pytest.param(lambda: ops.debounce(15), id="debounce-long"),
        pytest.param(lambda: ops.debounce(5), id="debounce-short"),
        pytest.param(lambda: ops.sample(24), id="sample"),
        pytest.param(lambda: ops.delay(35), id="delay"),
    ],
)
def test_time_operator_matches_rx_on_a_test_scheduler(
    ctx: Context, make_op: Callable[[], RxOp]
) -> None:
    """The lifted operator under drive emits what it emits on reactivex's TestScheduler."""
    expected = rx_reference(make_op(), 12, 10)
    pipeline = ctx.source(range(12)) | ctx.rx(make_op())
    assert drive(pipeline, 13, interval=10) == expected  # the 13th pull ends the source


def test_curried_operators_get_the_kind_as_name(ctx: Context) -> None:
    """reactivex operators are private curried wrappers, so an unnamed rx stage is 'rx'."""
    pipeline = ctx.source([1]) | ctx.rx(ops.filter(bool)) | ctx.rx(ops.map(str))
    assert list(pipeline.stages) == ["source", "rx", "rx-2"]
