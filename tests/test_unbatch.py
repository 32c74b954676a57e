"""ctx.unbatch: 1:N over a batch's leading dimension, metadata copies, pts_step, failures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rxstream import (
    Context,
    PipelineError,
    PipelineItem,
    PipelineMetadata,
    StageBuildError,
)
from rxstream.testing import drive, drive_items


def test_numpy_batch_yields_its_rows(ctx: Context) -> None:
    """A (3, 2) array unbatches into its three rows, in order."""
    batch = np.arange(6).reshape(3, 2)
    out = drive(ctx.source([batch]) | ctx.unbatch(), 1)
    assert len(out) == 3
    for row, expected in zip(out, [[0, 1], [2, 3], [4, 5]], strict=True):
        assert isinstance(row, np.ndarray)
        assert row.tolist() == expected


def test_torch_batch_yields_its_slices(ctx: Context) -> None:
    """A (2, 3, 4) tensor unbatches into two (3, 4) tensors along dim 0."""
    batch = torch.arange(24).reshape(2, 3, 4)
    out = drive(ctx.source([batch]) | ctx.unbatch(), 1)
    assert len(out) == 2
    for index, child in enumerate(out):
        assert isinstance(child, torch.Tensor)
        assert tuple(child.shape) == (3, 4)
        assert torch.equal(child, batch[index])


def test_list_and_tuple_batches_yield_their_elements(ctx: Context) -> None:
    """Lists and tuples unbatch into their elements; an empty batch yields nothing."""
    out = drive(ctx.source([[1, 2], (3,), [], ["x", None]]) | ctx.unbatch(), 4)
    assert out == [1, 2, 3, "x", None]


def test_empty_leading_dimension_yields_nothing(ctx: Context) -> None:
    """An array with a zero-length leading dimension produces no children."""
    out = drive(ctx.source([np.zeros((0, 3)), np.ones((1, 3))]) | ctx.unbatch(), 2)
    assert [row.tolist() for row in out] == [[1.0, 1.0, 1.0]]


def batches() -> Iterator[PipelineItem]:
    """Two list batches with distinct metadata (the second a cutover of generation 2)."""
    yield PipelineItem(
        ["a", "b", "c"],
        PipelineMetadata(pts=100, input_seq=3, input_at_ms=30, prompt_generation=1),
    )
    yield PipelineItem(
        ["d", "e"],
        PipelineMetadata(pts=200, input_seq=4, input_at_ms=40, prompt_generation=2, cutover=True),
    )


def test_metadata_is_copied_to_every_child(ctx: Context) -> None:
    """Every child carries its parent's metadata (pts unchanged without pts_step)."""
    out = drive_items(ctx.source(batches) | ctx.unbatch(), 2)
    assert [
        (
            i.payload,
            i.metadata.pts,
            i.metadata.input_seq,
            i.metadata.input_at_ms,
            i.metadata.prompt_generation,
            i.metadata.cutover,
        )
        for i in out
    ] == [
        ("a", 100, 3, 30, 1, False),
        ("b", 100, 3, 30, 1, False),
        ("c", 100, 3, 30, 1, False),
        ("d", 200, 4, 40, 2, True),
        ("e", 200, 4, 40, 2, True),
    ]


def test_children_keep_the_parent_timeline_plus_unbatch_stamps(ctx: Context) -> None:
    """Each child's timeline is the parent's followed by the unbatch stage's in/out stamps."""
    out = drive_items(ctx.source(batches) | ctx.unbatch(name="split"), 2)
    for item in out:
        hops = [hop for hop, _ in item.metadata.timeline]
        assert hops == ["batches.in", "batches.out", "split.in", "split.out"]


def test_pts_step_advances_pts_per_child(ctx: Context) -> None:
    """With pts_step, child i gets parent.pts + i * pts_step."""
    out = drive_items(ctx.source(batches) | ctx.unbatch(pts_step=10), 2)
    assert [(i.payload, i.metadata.pts) for i in out] == [
        ("a", 100),
        ("b", 110),
        ("c", 120),
        ("d", 200),
        ("e", 210),
    ]


def test_pts_step_on_a_tensor_batch(ctx: Context) -> None:
    """pts_step applies to tensor batches too (source pts 0 and 1, step 3750)."""
    source = ctx.source([torch.zeros(2, 4), torch.ones(3, 4)])
    out = drive_items(source | ctx.unbatch(pts_step=3750), 2)
    assert [i.metadata.pts for i in out] == [0, 3750, 1, 3751, 7501]


def test_statistics_count_batches_in_and_children_out(ctx: Context) -> None:
    """The unbatch stage counts each batch in and each child out."""
    pipeline = ctx.source([[1, 2, 3], [4]]) | ctx.unbatch()
    drive(pipeline, 2)
    stats = pipeline.statistics()["unbatch"]
    assert (stats.items_in, stats.items_out) == (2, 4)


@pytest.mark.parametrize(
    ("payload", "cause"),
    [
        (np.array(5), r"unbatch needs a leading batch dimension, got a 0-d array"),
        (torch.tensor(5), r"unbatch needs a leading batch dimension, got a 0-d array"),
        (5, r"unbatch needs a tensor, an array, a list or a tuple, got int"),
        ("abc", r"unbatch needs a tensor, an array, a list or a tuple, got str"),
    ],
)
def test_payload_without_a_batch_dimension_fails_naming_the_stage(
    ctx: Context, payload: object, cause: str
) -> None:
    """A 0-d array/tensor or a scalar ends the drive with a PipelineError naming the stage."""
    pipeline = ctx.source([[1], payload]) | ctx.unbatch(name="split")
    with pytest.raises(
        PipelineError,
        match=rf"^stage 'split' failed on item pts=1 input_seq=0: TypeError: {cause}$",
    ) as excinfo:
        drive(pipeline, 2)
    error = excinfo.value
    assert (error.stage, error.pts, error.input_seq) == ("split", 1, 0)
    assert isinstance(error.__cause__, TypeError)


@pytest.mark.parametrize("pts_step", ["x", 1.5])
def test_non_int_pts_step_is_rejected_at_build(ctx: Context, pts_step: Any) -> None:
    """ctx.unbatch(pts_step=...) takes an int; anything else is a StageBuildError naming it."""
    with pytest.raises(StageBuildError, match=r"^.*pts_step.*'unbatch'.*$"):
        ctx.unbatch(pts_step=pts_step)


@given(st.lists(st.integers(), min_size=1, max_size=40), st.integers(1, 8))
def test_unbatch_after_count_window_is_identity(values: list[int], k: int) -> None:
    """window(count=k) | unbatch() returns the original sequence."""
    ctx = Context()
    pipeline = ctx.source(values) | ctx.window(count=k) | ctx.unbatch()
    assert drive(pipeline, len(values) + 1) == values  # the last pull ends the source


@given(
    st.lists(st.integers(), max_size=30),
    st.integers(1, 8) | st.none(),
    st.sampled_from([50.0, 120.0, 333.0]),
    st.sampled_from([0.0, 0.04, 0.1, 0.25]),
)
def test_unbatch_after_time_window_is_identity(
    values: list[int], k: int | None, ms: float, interval: float
) -> None:
    """window(count=k, ms=ms) | unbatch() on virtual time returns the original sequence."""
    ctx = Context()
    pipeline = ctx.source(values) | ctx.window(count=k, ms=ms) | ctx.unbatch()
    assert drive(pipeline, len(values), interval=interval) == values
