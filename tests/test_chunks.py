"""Chunk policies and stream buffers: when arriving items are released, and as what."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rxstream.topology import (
    ChunkPolicy,
    EveryItem,
    FixedSize,
    Sliding,
    StreamBuffer,
    StreamBufferClosed,
    TopologyError,
    UntilFinal,
)


def feed(policy: ChunkPolicy, items: list[Any]) -> tuple[list[list[Any]], list[list[Any]]]:
    """Chunks released while ``items`` arrived, and those released at the close."""
    buffer: StreamBuffer[Any] = StreamBuffer(policy, name="s")
    during = [chunk for item in items for chunk in buffer.put(item)]
    return during, buffer.close()


def test_every_item_releases_each_item_at_once() -> None:
    """EveryItem makes each item a chunk as it arrives; nothing is left at the close."""
    buffer: StreamBuffer[int] = StreamBuffer(EveryItem())
    assert buffer.put(1) == [[1]]
    assert buffer.put(2) == [[2]]
    assert buffer.pending == ()
    assert buffer.close() == []
    assert not EveryItem().overlapping


def test_fixed_size_releases_full_chunks_then_the_rest_at_the_close() -> None:
    """FixedSize(3) releases every third item's chunk, and the short rest when the stream ends."""
    during, last = feed(FixedSize(3), list(range(8)))
    assert during == [[0, 1, 2], [3, 4, 5]]
    assert last == [[6, 7]]


def test_sliding_windows_overlap_and_the_tail_is_released_at_the_close() -> None:
    """Sliding(4, 2) releases windows starting every 2 items, then the unreleased tail."""
    during, last = feed(Sliding(4, 2), list(range(7)))
    assert during == [[0, 1, 2, 3], [2, 3, 4, 5]]
    assert last == [[4, 5, 6]]
    assert Sliding(4, 2).overlapping
    assert not Sliding(3, 3).overlapping


def test_sliding_releases_nothing_more_when_every_item_was_in_a_window() -> None:
    """At the close, a sliding buffer whose items all were in a full window releases nothing."""
    during, last = feed(Sliding(3, 1), [1, 2, 3, 4])
    assert during == [[1, 2, 3], [2, 3, 4]]
    assert last == []
    assert feed(Sliding(3, 1), [1, 2]) == ([], [[1, 2]])


def test_until_final_gathers_up_to_the_final_item() -> None:
    """UntilFinal releases everything up to and including a final item; the rest at the close."""
    during, last = feed(UntilFinal(lambda x: x == "."), ["a", "b", ".", "c", ".", "d"])
    assert during == [["a", "b", "."], ["c", "."]]
    assert last == [["d"]]


def test_a_view_shows_the_policy_part_of_each_held_item() -> None:
    """With view=, the policy judges what the view shows; the chunks hold the items."""
    seen: list[Any] = []

    def is_final(word: str) -> bool:
        seen.append(word)
        return word.endswith(".")

    buffer: StreamBuffer[tuple[int, str]] = StreamBuffer(
        UntilFinal(is_final), view=lambda pair: pair[1]
    )
    assert buffer.put((1, "hi")) == []
    assert buffer.put((2, "there.")) == [[(1, "hi"), (2, "there.")]]
    assert seen == ["hi", "hi", "there."]


def test_put_after_close_is_refused() -> None:
    """A closed buffer refuses items, naming itself; closing twice releases nothing."""
    buffer: StreamBuffer[int] = StreamBuffer(FixedSize(2), name="mouse")
    buffer.put(1)
    assert buffer.close() == [[1]]
    assert buffer.closed
    assert buffer.close() == []
    with pytest.raises(
        StreamBufferClosed, match=r"^stream buffer 'mouse' is closed; cannot put 2$"
    ):
        buffer.put(2)


def test_a_policy_answer_out_of_range_is_an_error() -> None:
    """A policy that answers more than is pending is refused, naming the answer and the stream."""

    class Greedy:
        overlapping = False

        def ready(self, pending: Any, final: bool) -> tuple[int, int] | None:
            return (len(pending) + 1, 1)

        def __repr__(self) -> str:
            return "Greedy()"

    buffer: StreamBuffer[int] = StreamBuffer(Greedy(), name="s")
    with pytest.raises(
        TopologyError,
        match=r"^chunk policy Greedy\(\) must answer 1 <= take, drop <= 1 \(the pending items\), "
        r"got take=2, drop=1 on stream 's'$",
    ):
        buffer.put(1)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FixedSize(0), r"^FixedSize n must be an int >= 1, got 0$"),
        (lambda: FixedSize(True), r"^FixedSize n must be an int >= 1, got True$"),
        (lambda: Sliding(0), r"^Sliding size must be an int >= 1, got 0$"),
        (lambda: Sliding(3, 4), r"^Sliding step must be an int in 1\.\.size \(3\), got 4$"),
        (lambda: Sliding(3, 0), r"^Sliding step must be an int in 1\.\.size \(3\), got 0$"),
        (lambda: UntilFinal(3), r"^UntilFinal is_final must be callable, got 3$"),  # type: ignore[arg-type]
    ],
)
def test_policy_arguments_are_checked(make: Any, message: str) -> None:
    """Each policy refuses a bad argument, naming it, the rule and the value."""
    with pytest.raises(TopologyError, match=message):
        make()


@given(st.lists(st.integers()), st.integers(1, 6))
def test_fixed_size_chunks_concatenate_to_the_input(items: list[int], n: int) -> None:
    """Fixed-size chunks, concatenated, are the input; all but the last have n items."""
    during, last = feed(FixedSize(n), items)
    chunks = during + last
    assert [x for chunk in chunks for x in chunk] == items
    assert all(len(chunk) == n for chunk in during)
    assert all(0 < len(chunk) <= n for chunk in last)


@given(st.lists(st.integers(), max_size=40), st.integers(1, 6), st.data())
def test_sliding_windows_overlap_by_size_minus_step(
    items: list[int], size: int, data: st.DataObject
) -> None:
    """Full windows start every step items and neighbours share size - step items; every item
    is in some window."""
    step = data.draw(st.integers(1, size))
    during, last = feed(Sliding(size, step), items)
    for index, window in enumerate(during):
        assert window == items[index * step : index * step + size]
    for left, right in itertools.pairwise(during):
        assert left[step:] == right[: size - step]
    seen = {i for i, _ in enumerate(items)}
    covered = {index * step + k for index in range(len(during)) for k in range(size)}
    if last:
        start = len(items) - len(last[0])
        assert last[0] == items[start:]
        covered |= set(range(start, len(items)))
    assert seen <= covered
