"""PipelineItem / PipelineMetadata: the reference's fields, frozenness, evolve and the N:1 merge."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import pickle
import re
import typing
import weakref
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import rxstream
from rxstream import PipelineItem, PipelineMetadata, merge_metadata
from rxstream.item import Timeline, _is_lazy, _newest, _stamped, evolve_metadata
from rxstream.transport import MemoryTransport

REFERENCE_FIELDS: list[tuple[str, Any]] = [
    ("prompt_generation", 0),
    ("flush_generation", 0),
    ("cutover", False),
    ("drop_generation", 0),
    ("pts", 0),
    ("idle", False),
    ("capture_ts", None),
    ("input_seq", 0),
    ("input_at_ms", 0),
    ("timeline", ()),
]

STAMPS = (("merge.in", 10.0), ("merge.out", 11.0))

# Small ranges on purpose: ties between generations and between input times are common.
stamp = st.tuples(
    st.sampled_from(["input.recv", "a.in", "a.out", "b.in", "b.out"]), st.floats(0, 9)
)
metadata = st.builds(
    PipelineMetadata,
    prompt_generation=st.integers(0, 4),
    flush_generation=st.integers(0, 4),
    cutover=st.booleans(),
    drop_generation=st.integers(0, 4),
    pts=st.integers(0, 100),
    idle=st.booleans(),
    capture_ts=st.none() | st.floats(0, 100),
    input_seq=st.integers(0, 3),
    input_at_ms=st.integers(0, 5),
    timeline=st.lists(stamp, max_size=3).map(tuple),
)
metadatas = st.lists(metadata, min_size=1, max_size=6)
stamps = st.lists(stamp, max_size=2).map(tuple)


def newest_index(mds: list[PipelineMetadata]) -> int:
    """Reference model of the newest tick: latest input_at_ms of the carriers, later on ties."""
    carriers = [i for i, md in enumerate(mds) if md.input_seq]
    if not carriers:
        return len(mds) - 1
    return max(carriers, key=lambda i: (mds[i].input_at_ms, i))


# --- the dataclasses ----------------------------------------------------------------------------


def test_metadata_fields_and_defaults_match_the_reference() -> None:
    """PipelineMetadata has exactly the reference's fields, in order, with its defaults."""
    fields = [(f.name, f.default) for f in dataclasses.fields(PipelineMetadata)]
    assert fields == REFERENCE_FIELDS
    assert PipelineMetadata() == PipelineMetadata(**dict(REFERENCE_FIELDS))


def test_item_fields_are_payload_and_metadata_without_defaults() -> None:
    """PipelineItem has exactly the fields payload and metadata, both required."""
    fields = dataclasses.fields(PipelineItem)
    assert [f.name for f in fields] == ["payload", "metadata"]
    assert all(f.default is dataclasses.MISSING for f in fields)
    assert all(f.default_factory is dataclasses.MISSING for f in fields)


def test_field_annotations_resolve_to_the_reference_types() -> None:
    """typing.get_type_hints resolves both dataclasses' annotations to the reference's types."""
    assert typing.get_type_hints(PipelineMetadata) == {
        "prompt_generation": int,
        "flush_generation": int,
        "cutover": bool,
        "drop_generation": int,
        "pts": int,
        "idle": bool,
        "capture_ts": float | None,
        "input_seq": int,
        "input_at_ms": int,
        "timeline": tuple[tuple[str, float], ...],
    }
    assert typing.get_type_hints(PipelineItem) == {
        "payload": Any,
        "metadata": PipelineMetadata,
    }


@pytest.mark.parametrize(("field", "value"), [(name, 1) for name, _ in REFERENCE_FIELDS])
def test_metadata_is_frozen(field: str, value: object) -> None:
    """Assigning any PipelineMetadata field raises FrozenInstanceError."""
    md = PipelineMetadata()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(md, field, value)
    assert md == PipelineMetadata()


@pytest.mark.parametrize("field", ["payload", "metadata"])
def test_item_is_frozen(field: str) -> None:
    """Assigning a PipelineItem field raises FrozenInstanceError."""
    item = PipelineItem(1, PipelineMetadata())
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(item, field, 2)
    assert item == PipelineItem(1, PipelineMetadata())


def _lazy_item() -> PipelineItem:
    """An item as the hot path makes it: a base metadata and a chain of stamps, not built."""
    first = PipelineItem([1, 2], PipelineMetadata(pts=7, timeline=(("src.in", 1.0),)))
    return _stamped(first, [3, 4], ("a.in", 2.0, "a.out", 3.0))


@pytest.mark.parametrize("field", ["payload", "metadata", "_md", "_st", "extra"])
def test_a_lazy_item_is_frozen_too(field: str) -> None:
    """An engine-made item refuses assignment as a constructed one does, and has no dict."""
    item = _lazy_item()
    with pytest.raises(AttributeError):
        setattr(item, field, 2)
    assert not hasattr(item, "__dict__")
    assert item.payload == [3, 4]


@pytest.mark.parametrize(
    "copier", [copy.copy, copy.deepcopy, lambda item: pickle.loads(pickle.dumps(item))]
)
def test_an_item_copies_and_pickles_as_it_is(copier: Any) -> None:
    """copy, deepcopy and pickle give an equal item; a lazy one stays lazy until read."""
    lazy = _lazy_item()
    got = copier(lazy)
    assert _is_lazy(got)
    assert _is_lazy(lazy)
    assert got == lazy
    assert got.metadata.timeline == (("src.in", 1.0), ("a.in", 2.0), ("a.out", 3.0))
    built = PipelineItem(5, PipelineMetadata(pts=2))
    again = copier(built)
    assert again == built
    assert not _is_lazy(again)


@dataclasses.dataclass(frozen=True)
class _Tagged(PipelineItem):
    """A user's item subclass with a field of its own."""

    tag: str = ""


@dataclasses.dataclass(frozen=True)
class _Checked(PipelineItem):
    """A user's item subclass whose own ``__post_init__`` does not call the base's."""

    def __post_init__(self) -> None:
        if self.payload is None:
            raise ValueError("payload")


@pytest.mark.parametrize(
    "copier", [copy.copy, copy.deepcopy, lambda item: pickle.loads(pickle.dumps(item))]
)
def test_an_item_subclass_copies_and_pickles_as_itself(copier: Any) -> None:
    """A subclass's copy is of the subclass, its own fields kept, equal to the original."""
    tagged = _Tagged(1, PipelineMetadata(pts=4), "hello")
    got = copier(tagged)
    assert type(got) is _Tagged
    assert got.tag == "hello"
    assert got == tagged


def test_a_deep_copy_keeps_a_payload_that_refers_to_its_item() -> None:
    """An item whose payload holds the item itself deep-copies to a copy that holds the copy."""
    payload: list[Any] = []
    item = PipelineItem(payload, PipelineMetadata())
    payload.append(item)
    got = copy.deepcopy(item)
    assert got.payload[0] is got


def test_an_item_subclass_without_the_base_post_init_goes_through_a_pipeline() -> None:
    """Items of a subclass whose __post_init__ skips the base's flow through driven and
    threaded runs as items, their metadata read as it was set."""
    for threaded in (False, True):
        ctx = rxstream.Context(transport=MemoryTransport())
        pipeline = (
            ctx.source(range(3), name="src")
            | ctx.pipe(lambda item: _Checked(item.payload + 1, item.metadata), items=True)
            | ctx.stream("out")
        )
        if threaded:
            asyncio.run(pipeline.run())
            assert isinstance(ctx.transport, MemoryTransport)
            got = [item.payload for item in ctx.transport.items("out")]
        else:
            got = pipeline.drive(frames=3)
        assert got == [1, 2, 3]
    assert _Checked(5, PipelineMetadata(pts=2)).metadata.pts == 2


def test_an_item_is_weakly_referenceable() -> None:
    """A weak reference to an item (a user's cache keyed by item) works, lazy or built."""
    lazy, built = _lazy_item(), PipelineItem(1, PipelineMetadata())
    assert weakref.ref(lazy)() is lazy
    assert weakref.ref(built)() is built


def test_a_lazy_items_metadata_is_built_once() -> None:
    """Reading a lazy item's metadata builds it once and keeps it (the same object after)."""
    item = _lazy_item()
    first = item.metadata
    assert not _is_lazy(item)
    assert item.metadata is first
    assert first.pts == 7


def test_metadata_is_hashable_and_compares_by_value() -> None:
    """Equal metadata hash equal (a frozen dataclass, usable as a key)."""
    a = PipelineMetadata(pts=3, timeline=(("a.in", 1.0),))
    b = PipelineMetadata(pts=3, timeline=(("a.in", 1.0),))
    assert a == b
    assert hash(a) == hash(b)
    assert a != PipelineMetadata(pts=4, timeline=(("a.in", 1.0),))


# --- evolve_metadata ----------------------------------------------------------------------------


def test_evolve_returns_a_changed_copy_and_leaves_the_original() -> None:
    """evolve_metadata applies the changes to a copy; the original is unchanged."""
    original = PipelineMetadata(pts=1, input_seq=7, timeline=(("a.in", 1.0),))
    evolved = evolve_metadata(original, pts=5, idle=True)
    assert evolved == PipelineMetadata(pts=5, idle=True, input_seq=7, timeline=(("a.in", 1.0),))
    assert original == PipelineMetadata(pts=1, input_seq=7, timeline=(("a.in", 1.0),))
    assert evolved is not original


def test_evolve_result_is_a_frozen_metadata() -> None:
    """What evolve_metadata returns is a PipelineMetadata, frozen like a constructed one."""
    evolved = evolve_metadata(PipelineMetadata(), pts=2)
    assert type(evolved) is PipelineMetadata
    with pytest.raises(dataclasses.FrozenInstanceError):
        evolved.pts = 3  # type: ignore[misc]
    assert hash(evolved) == hash(PipelineMetadata(pts=2))


def test_evolve_rejects_an_unknown_field() -> None:
    """An unknown field raises TypeError naming it and listing the fields."""
    fields = sorted(name for name, _ in REFERENCE_FIELDS)
    with pytest.raises(
        TypeError, match=r"^PipelineMetadata has no field 'frame'; fields are \["
    ) as e:
        evolve_metadata(PipelineMetadata(), frame=1)
    assert str(e.value) == f"PipelineMetadata has no field 'frame'; fields are {fields}"


@given(metadata, metadata)
def test_evolve_equals_dataclasses_replace(base: PipelineMetadata, other: PipelineMetadata) -> None:
    """evolve_metadata(m, **changes) == dataclasses.replace(m, **changes) for any changes."""
    changes = {f.name: getattr(other, f.name) for f in dataclasses.fields(other)}
    for name in list(changes)[::2]:
        del changes[name]
    assert evolve_metadata(base, **changes) == dataclasses.replace(base, **changes)


# --- merge_metadata: examples -------------------------------------------------------------------


def test_merge_of_nothing_raises() -> None:
    """merge_metadata([]) raises ValueError: an N:1 output has at least one input."""
    with pytest.raises(ValueError, match=r"^merge_metadata needs at least one metadata, got none$"):
        merge_metadata([])


def test_merge_takes_max_generations_any_cutover_and_last_pts() -> None:
    """Highest generations, cutover if any, idle only if all, pts/capture_ts of the last."""
    mds = [
        PipelineMetadata(prompt_generation=3, flush_generation=0, drop_generation=1, cutover=True),
        PipelineMetadata(prompt_generation=1, flush_generation=2, idle=True, capture_ts=1.5),
        PipelineMetadata(drop_generation=4, pts=9, idle=True, capture_ts=2.5),
    ]
    merged = merge_metadata(mds)
    assert merged == PipelineMetadata(
        prompt_generation=3,
        flush_generation=2,
        cutover=True,
        drop_generation=4,
        pts=9,
        idle=False,
        capture_ts=2.5,
    )


def test_merge_correlation_is_the_latest_input_tick() -> None:
    """input_seq/input_at_ms and timeline come from the carrier with the latest input_at_ms."""
    newest = PipelineMetadata(input_seq=4, input_at_ms=400, timeline=(("input.recv", 4.0),))
    mds = [
        PipelineMetadata(input_seq=3, input_at_ms=300, timeline=(("input.recv", 3.0),)),
        newest,
        PipelineMetadata(input_seq=2, input_at_ms=200, timeline=(("input.recv", 2.0),), pts=7),
    ]
    merged = merge_metadata(mds, STAMPS)
    assert (merged.input_seq, merged.input_at_ms, merged.pts) == (4, 400, 7)
    assert merged.timeline == (("input.recv", 4.0), *STAMPS)


def test_merge_ignores_inputs_without_a_correlation() -> None:
    """An input with input_seq=0 never supplies the correlation, whatever its input_at_ms."""
    mds = [
        PipelineMetadata(input_seq=5, input_at_ms=10, timeline=(("input.recv", 1.0),)),
        PipelineMetadata(input_seq=0, input_at_ms=999, timeline=(("src.out", 2.0),)),
    ]
    merged = merge_metadata(mds)
    assert (merged.input_seq, merged.input_at_ms) == (5, 10)
    assert merged.timeline == (("input.recv", 1.0),)


def test_merge_breaks_input_time_ties_by_later_position() -> None:
    """Two carriers with the same input_at_ms: the later one is the newest."""
    mds = [
        PipelineMetadata(input_seq=1, input_at_ms=50, timeline=(("x", 1.0),)),
        PipelineMetadata(input_seq=2, input_at_ms=50, timeline=(("y", 2.0),)),
        PipelineMetadata(input_seq=0, pts=3),
    ]
    merged = merge_metadata(mds)
    assert (merged.input_seq, merged.input_at_ms, merged.timeline) == (2, 50, (("y", 2.0),))


def test_merge_without_any_correlation_follows_the_last_input() -> None:
    """No input carries a correlation: correlation and timeline are the last input's."""
    mds = [
        PipelineMetadata(pts=1, timeline=(("a.out", 1.0),)),
        PipelineMetadata(pts=2, input_at_ms=7, timeline=(("b.out", 2.0),)),
    ]
    merged = merge_metadata(mds, STAMPS)
    assert (merged.input_seq, merged.input_at_ms) == (0, 7)
    assert merged.timeline == (("b.out", 2.0), *STAMPS)


def test_merge_accepts_stamps_from_any_iterable() -> None:
    """stamps may be any iterable (here a generator); they end the timeline in order."""
    merged = merge_metadata([PipelineMetadata()], (pair for pair in STAMPS))
    assert merged.timeline == STAMPS


# --- merge_metadata: properties -----------------------------------------------------------------


@given(metadatas, stamps)
def test_merge_generations_are_the_max(mds: list[PipelineMetadata], extra: Timeline) -> None:
    """Every generation of the merge is the highest among the inputs."""
    merged = merge_metadata(mds, extra)
    assert merged.prompt_generation == max(md.prompt_generation for md in mds)
    assert merged.flush_generation == max(md.flush_generation for md in mds)
    assert merged.drop_generation == max(md.drop_generation for md in mds)


@given(metadatas, stamps)
def test_merge_flags_cutover_any_idle_all(mds: list[PipelineMetadata], extra: Timeline) -> None:
    """cutover is set if any input had it; idle only if every input was idle."""
    merged = merge_metadata(mds, extra)
    assert merged.cutover == any(md.cutover for md in mds)
    assert merged.idle == all(md.idle for md in mds)


@given(metadatas, stamps)
def test_merge_matches_the_newest_tick_model(mds: list[PipelineMetadata], extra: Timeline) -> None:
    """Correlation and timeline+stamps are the newest tick's; pts/capture_ts the last's."""
    merged = merge_metadata(mds, extra)
    newest = mds[newest_index(mds)]
    assert (merged.input_seq, merged.input_at_ms) == (newest.input_seq, newest.input_at_ms)
    assert merged.timeline == newest.timeline + extra
    assert (merged.pts, merged.capture_ts) == (mds[-1].pts, mds[-1].capture_ts)


@given(metadatas)
def test_the_newest_pick_is_the_model(mds: list[PipelineMetadata]) -> None:
    """item._newest (merge_metadata's and window's one pick) is the newest tick's index."""
    assert _newest(mds) == newest_index(mds)


@given(metadatas.flatmap(lambda mds: st.tuples(st.just(mds), st.permutations(mds))), stamps)
def test_merge_order_free_fields_ignore_input_order(
    pair: tuple[list[PipelineMetadata], list[PipelineMetadata]], extra: Timeline
) -> None:
    """Generations, cutover, idle and the newest input_at_ms do not depend on input order."""
    mds, shuffled = pair
    a, b = merge_metadata(mds, extra), merge_metadata(shuffled, extra)
    assert (a.prompt_generation, a.flush_generation, a.drop_generation) == (
        b.prompt_generation,
        b.flush_generation,
        b.drop_generation,
    )
    assert (a.cutover, a.idle) == (b.cutover, b.idle)
    if any(md.input_seq for md in mds):
        assert a.input_at_ms == b.input_at_ms


@given(
    st.lists(metadata, min_size=1, max_size=6, unique_by=lambda md: md.input_at_ms).flatmap(
        lambda mds: st.tuples(st.just(mds), st.permutations(mds))
    ),
    stamps,
)
def test_merge_unique_newest_tick_ignores_input_order(
    pair: tuple[list[PipelineMetadata], list[PipelineMetadata]], extra: Timeline
) -> None:
    """With one newest tick, its correlation and timeline win whatever the input order."""
    mds, shuffled = pair
    assume(any(md.input_seq for md in mds))
    a, b = merge_metadata(mds, extra), merge_metadata(shuffled, extra)
    assert (a.input_seq, a.input_at_ms, a.timeline) == (b.input_seq, b.input_at_ms, b.timeline)


@given(
    metadatas.flatmap(lambda mds: st.tuples(st.just(mds), st.permutations(mds[:-1]))),
    stamps,
)
def test_merge_pts_and_capture_ts_ignore_order_before_the_last(
    pair: tuple[list[PipelineMetadata], list[PipelineMetadata]], extra: Timeline
) -> None:
    """pts and capture_ts follow the last input; the order of the others is irrelevant."""
    mds, head = pair
    a, b = merge_metadata(mds, extra), merge_metadata([*head, mds[-1]], extra)
    assert (a.pts, a.capture_ts) == (b.pts, b.capture_ts)


@given(metadata, stamps)
def test_merge_of_one_is_that_one_plus_stamps(md: PipelineMetadata, extra: Timeline) -> None:
    """A single input merges to itself with the stamps appended to its timeline."""
    assert merge_metadata([md], extra) == dataclasses.replace(md, timeline=md.timeline + extra)


def test_metadata_holds_plain_python_values() -> None:
    """numpy scalars and lists given to the metadata become the plain types its fields declare."""
    import numpy as np

    given: dict[str, Any] = {
        "pts": np.int64(5),
        "cutover": np.bool_(True),
        "capture_ts": np.float32(0.5),
        "input_seq": np.uint8(3),
        "timeline": [("a.in", np.float64(1.25))],
    }
    md = PipelineMetadata(**given)
    assert dataclasses.astuple(md) == (0, 0, True, 0, 5, False, 0.5, 3, 0, (("a.in", 1.25),))
    assert [type(v) for v in md.__dict__.values()] == [
        int, int, bool, int, int, bool, float, int, int, tuple,
    ]  # fmt: skip
    assert type(md.timeline[0][1]) is float
    evolved = evolve_metadata(md, pts=np.int32(9), capture_ts=None)  # evolve takes Any
    assert (type(evolved.pts), evolved.capture_ts) == (int, None)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("pts", 1.5, "an integer"),
        ("input_seq", "3", "an integer"),
        ("cutover", "yes", "a bool"),
        ("capture_ts", "now", "a real number or None"),
        ("timeline", [(1, 2.0)], r"a sequence of \(hop, time\) pairs"),
        ("timeline", [("a.in",)], r"a sequence of \(hop, time\) pairs"),
    ],
)
def test_metadata_value_of_the_wrong_kind_names_field_rule_and_value(
    field: str, value: Any, rule: str
) -> None:
    """A value that is not of its field's kind raises TypeError naming the field, rule, value."""
    pattern = rf"^PipelineMetadata\.{field} must be {rule}.*, got {re.escape(repr(value))} \("
    with pytest.raises(TypeError, match=pattern):
        PipelineMetadata(**{field: value})
    with pytest.raises(TypeError, match=pattern):
        evolve_metadata(PipelineMetadata(), **{field: value})


@pytest.mark.parametrize("metadata", [None, {"pts": 3}, 5])
def test_an_item_needs_pipeline_metadata(metadata: object) -> None:
    """PipelineItem(payload, not-metadata) raises naming the field, the rule and the value."""
    with pytest.raises(TypeError) as caught:
        PipelineItem(1, metadata)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"PipelineItem.metadata must be a PipelineMetadata, got {metadata!r} "
        f"({type(metadata).__name__})"
    )


def test_a_source_yielding_an_item_without_metadata_fails_naming_the_source() -> None:
    """A source's item built with bad metadata ends the run with a PipelineError naming it."""
    ctx = rxstream.Context(transport=MemoryTransport())

    def frames() -> Any:
        yield PipelineItem(1, None)  # type: ignore[arg-type]

    pipeline = ctx.source(frames, name="src") | ctx.stream("out")
    failed = r"stage 'src' failed .*PipelineItem\.metadata"
    with pytest.raises(rxstream.PipelineError, match=failed):
        pipeline.drive(frames=1)
