"""Fan-in (merge, zip, combine, ``[a, b] | ctx.pipe(f2)``) and fan-out under drive."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rxstream import Context, Pipeline, PipelineError, PipelineItem, PipelineMetadata
from rxstream.testing import drive, drive_items


def mouse() -> Iterator[PipelineItem]:
    """Input ticks: input_seq 1..3, at 10, 20, 30 ms, generation 0, 1, 2."""
    for index in range(3):
        yield PipelineItem(
            f"m{index}",
            PipelineMetadata(
                input_seq=index + 1,
                input_at_ms=10 * (index + 1),
                prompt_generation=index,
                pts=index,
                timeline=(("input.recv", float(index)),),
            ),
        )


def frames() -> Iterator[PipelineItem]:
    """Frames with no input correlation: generation 5 first, a cutover second, pts 100+."""
    for index in range(3):
        yield PipelineItem(
            f"f{index}",
            PipelineMetadata(
                prompt_generation=5 if index == 0 else 0,
                flush_generation=index,
                cutover=index == 1,
                pts=100 + index,
            ),
        )


# --- merge --------------------------------------------------------------------------------------


def test_merge_passes_every_item_in_arrival_order(ctx: Context) -> None:
    """merge emits every item of every input, interleaved as they arrive."""
    a, b = ctx.source(range(3), name="a"), ctx.source("xyz", name="b")
    assert drive([a, b] | ctx.merge(), 3) == [0, "x", 1, "y", 2, "z"]


def test_merge_lets_one_cutover_through_per_steer(ctx: Context) -> None:
    """Both sources mark their first item after a steer; the merge passes the first mark only.

    (A mark on a later item of an input, say a ``doc.bind`` swap's, is kept: see the next test.)
    """
    doc = ctx.doc("control", defaults={"prompt": "a"})

    def steering() -> Iterator[str]:
        for index in range(4):
            if index == 2:
                doc.steer(prompt="b")
            yield f"a{index}"

    a, b = ctx.source(steering, name="a"), ctx.source("wxyz", name="b")
    out = drive_items([a, b] | ctx.merge(name="mix") | ctx.pipe(str, name="after"), 4)
    assert [(i.payload, i.metadata.prompt_generation, i.metadata.cutover) for i in out] == [
        ("a0", 0, False),
        ("w", 0, False),
        ("a1", 0, False),
        ("x", 0, False),
        ("a2", 1, True),
        ("y", 1, False),  # b's source marked it too: the steer's second mark
        ("a3", 1, False),
        ("z", 1, False),
    ]


def test_merge_follows_virtual_arrival_times(ctx: Context) -> None:
    """A source behind an unbatch delivers its burst at once; merge keeps that order."""
    a = ctx.source([[0, 1, 2], [3]], name="a") | ctx.unbatch()
    b = Pipeline.of(ctx.source(["x", "y"], name="b"))
    assert drive([a, b] | ctx.merge(), 2, interval=0.1) == [0, 1, 2, "x", 3, "y"]


def test_merge_keeps_each_item_metadata(ctx: Context) -> None:
    """merge is 1:1 per item: each output keeps its own input's metadata plus merge stamps."""
    out = drive_items([ctx.source(mouse), ctx.source(frames)] | ctx.merge(name="mix"), 3)
    assert [(i.payload, i.metadata.input_seq, i.metadata.pts, i.metadata.cutover) for i in out] == [
        ("m0", 1, 0, False),
        ("f0", 0, 100, False),
        ("m1", 2, 1, False),
        ("f1", 0, 101, True),
        ("m2", 3, 2, False),
        ("f2", 0, 102, False),
    ]
    assert [hop for hop, _ in out[0].metadata.timeline] == [
        "input.recv",
        "mouse.in",
        "mouse.out",
        "mix.in",
        "mix.out",
    ]


# --- zip ----------------------------------------------------------------------------------------


def test_zip_pairs_inputs_index_by_index(ctx: Context) -> None:
    """zip() emits the tuple of the i-th payload of each input."""
    a, b = ctx.source(range(3), name="a"), ctx.source("xyz", name="b")
    assert drive([a, b] | ctx.zip(), 3) == [(0, "x"), (1, "y"), (2, "z")]


def test_zip_with_fn_calls_it_with_the_payloads_in_list_order(ctx: Context) -> None:
    """zip(fn) calls fn(a_payload, b_payload) in the order of the list head."""
    a, b = ctx.source(range(3), name="a"), ctx.source("xyz", name="b")
    assert drive([a, b] | ctx.zip(lambda n, s: f"{s}{n}"), 3) == ["x0", "y1", "z2"]


def test_zip_of_three_inputs(ctx: Context) -> None:
    """zip takes any number of inputs, one port each."""
    heads = [ctx.source(range(k, k + 2), name=f"s{k}") for k in (0, 10, 20)]
    assert drive(heads | ctx.zip(lambda *xs: sum(xs)), 2) == [30, 33]


def test_zip_merges_metadata_by_the_n_to_1_rule(ctx: Context) -> None:
    """Each zipped pair: newest tick's correlation, max generations, any cutover, last pts."""
    out = drive_items([ctx.source(mouse), ctx.source(frames)] | ctx.zip(name="pair"), 3)
    assert [
        (
            i.payload,
            i.metadata.input_seq,
            i.metadata.input_at_ms,
            i.metadata.prompt_generation,
            i.metadata.flush_generation,
            i.metadata.cutover,
            i.metadata.pts,
        )
        for i in out
    ] == [
        (("m0", "f0"), 1, 10, 5, 0, False, 100),
        (("m1", "f1"), 2, 20, 1, 1, True, 101),
        (("m2", "f2"), 3, 30, 2, 2, False, 102),
    ]
    for index, item in enumerate(out):
        assert item.metadata.timeline[0] == ("input.recv", float(index))
        assert [hop for hop, _ in item.metadata.timeline] == [
            "input.recv",
            "mouse.in",
            "mouse.out",
            "pair.in",
            "pair.out",
        ]


# --- combine ------------------------------------------------------------------------------------


def test_combine_emits_the_latest_of_each_on_every_arrival(ctx: Context) -> None:
    """combine() emits once all inputs have one, then on every arrival with the latest of each."""
    a, b = ctx.source(range(3), name="a"), ctx.source("xyz", name="b")
    assert drive([a, b] | ctx.combine(), 3) == [(0, "x"), (1, "x"), (1, "y"), (2, "y"), (2, "z")]


def test_combine_waits_for_every_input(ctx: Context) -> None:
    """A burst on one input before the other has an item yields only its latest pairing."""
    a = ctx.source([[0, 1, 2]], name="a") | ctx.unbatch()
    b = Pipeline.of(ctx.source(["x"], name="b"))
    assert drive([a, b] | ctx.combine(), 1) == [(2, "x")]


def test_combine_merges_metadata_of_the_latest_pair(ctx: Context) -> None:
    """combine's metadata merges the pair it emitted (newest tick, max generation, cutover)."""
    out = drive_items([ctx.source(mouse), ctx.source(frames)] | ctx.combine(), 3)
    assert [
        (i.payload, i.metadata.input_seq, i.metadata.prompt_generation, i.metadata.cutover)
        for i in out
    ] == [
        (("m0", "f0"), 1, 5, False),
        (("m1", "f0"), 2, 5, False),
        (("m1", "f1"), 2, 1, True),
        (("m2", "f1"), 3, 2, True),
        (("m2", "f2"), 3, 2, False),
    ]


def test_pipe_under_fan_in_combines_and_calls_f2(ctx: Context) -> None:
    """[a, b] | ctx.pipe(f2) combines the latest of each and calls f2(a, b) in list order."""
    calls: list[tuple[int, int]] = []

    def f2(x: int, y: int) -> int:
        calls.append((x, y))
        return 10 * x - y

    a, b = ctx.source(range(3), name="a"), ctx.source(range(5, 8), name="b")
    out = drive([a, b] | ctx.pipe(f2), 3, interval=1.0)
    assert calls == [(0, 5), (1, 5), (1, 6), (2, 6), (2, 7)]
    assert out == [-5, 5, 4, 14, 13]


def test_pipe_under_fan_in_merges_metadata(ctx: Context) -> None:
    """[a, b] | ctx.pipe(f2): the output metadata follows the N:1 rule, like combine."""
    pipeline = [ctx.source(mouse), ctx.source(frames)] | ctx.pipe(lambda m, f: m + f, name="join")
    out = drive_items(pipeline, 3)
    assert [(i.payload, i.metadata.input_seq, i.metadata.cutover) for i in out] == [
        ("m0f0", 1, False),
        ("m1f0", 2, False),
        ("m1f1", 2, True),
        ("m2f1", 3, True),
        ("m2f2", 3, False),
    ]
    assert [hop for hop, _ in out[-1].metadata.timeline][-2:] == ["join.in", "join.out"]


@pytest.mark.parametrize("kind", ["zip", "combine", "pipe"])
def test_fan_in_function_error_names_the_stage(ctx: Context, kind: str) -> None:
    """A raising fan-in function ends the drive with a PipelineError naming the stage."""

    def ratio(x: int, y: int) -> int:
        return x // y

    stage = {
        "zip": lambda: ctx.zip(ratio, name="ratio"),
        "combine": lambda: ctx.combine(ratio, name="ratio"),
        "pipe": lambda: ctx.pipe(ratio, name="ratio"),
    }[kind]()
    pipeline = [ctx.source([4, 6], name="a"), ctx.source([2, 0], name="b")] | stage
    with pytest.raises(PipelineError, match=r"^stage 'ratio' failed on item pts=1 ") as excinfo:
        drive(pipeline, 2)
    assert excinfo.value.stage == "ratio"
    assert isinstance(excinfo.value.__cause__, ZeroDivisionError)


# --- fan-out ------------------------------------------------------------------------------------


def test_fan_out_then_zip_shares_the_upstream(ctx: Context) -> None:
    """One upstream feeding two branches that zip back: each item runs upstream once."""
    calls: list[int] = []

    def double(x: int) -> int:
        calls.append(x)
        return 2 * x

    up = ctx.source(range(4)) | ctx.pipe(double)
    inc = up | ctx.pipe(lambda x: x + 1, name="inc")
    neg = up | ctx.pipe(lambda x: -x, name="neg")
    pipeline = [inc, neg] | ctx.zip()
    assert drive(pipeline, 4) == [(1, 0), (3, -2), (5, -4), (7, -6)]
    assert calls == [0, 1, 2, 3]
    stats = pipeline.statistics()
    assert (stats["double"].items_in, stats["double"].items_out) == (4, 4)


def test_fan_out_then_merge_delivers_each_item_to_both_branches(ctx: Context) -> None:
    """A fanned-out item reaches both branches; merge emits both results in order."""
    up = ctx.source(range(3))
    pipeline = [up | ctx.pipe(lambda x: x, name="left"), up | ctx.pipe(str, name="right")]
    assert drive(pipeline | ctx.merge(), 3) == [0, "0", 1, "1", 2, "2"]


def test_fan_out_to_two_sinks_returns_a_dict_by_sink_name(ctx: Context) -> None:
    """ctx.graph(p1, p2) with two sinks drives both; drive returns {sink name: payloads}."""
    up = ctx.source(range(4)) | ctx.pipe(lambda x: 2 * x, name="double")
    graph = ctx.graph(
        up | ctx.pipe(lambda x: x + 1, name="inc") | ctx.stream("one"),
        up | ctx.stream("two"),
    )
    assert graph.drive(frames=4) == {"one": [1, 3, 5, 7], "two": [0, 2, 4, 6]}
    stats = graph.statistics()
    assert {name: (s.items_in, s.items_out) for name, s in stats.items()} == {
        "source": (4, 4),
        "double": (4, 4),
        "inc": (4, 4),
        "one": (4, 4),
        "two": (4, 4),
    }


def test_fan_out_to_two_sinks_with_items_keeps_metadata(ctx: Context) -> None:
    """items=True on a two-sink graph: each sink's items carry the source's pts."""
    up = ctx.source(range(3))
    graph = ctx.graph(up | ctx.stream("one"), up | ctx.pipe(str, name="s") | ctx.stream("two"))
    out = graph.drive(frames=3, items=True)
    assert sorted(out) == ["one", "two"]
    assert [(i.payload, i.metadata.pts) for i in out["one"]] == [(0, 0), (1, 1), (2, 2)]
    assert [(i.payload, i.metadata.pts) for i in out["two"]] == [("0", 0), ("1", 1), ("2", 2)]


def test_fan_out_to_a_paced_and_a_raw_sink(ctx: Context) -> None:
    """One source into a 10 fps pace sink and a raw sink: idle repeats only on the paced one."""
    up = ctx.source(range(3))
    graph = ctx.graph(up | ctx.pace(fps=10) | ctx.stream("paced"), up | ctx.stream("raw"))
    out = graph.drive(frames=3, items=True, interval=0.25)
    assert [(i.payload, i.metadata.idle) for i in out["paced"]] == [
        (0, False),
        (0, True),
        (0, True),
        (1, False),
        (1, True),
        (2, False),
    ]
    assert [(i.payload, i.metadata.idle) for i in out["raw"]] == [
        (0, False),
        (1, False),
        (2, False),
    ]


def test_combine_counts_values_that_never_join_an_output(ctx: Context) -> None:
    """combine: values replaced before every input had one are dropped as 'unpaired'."""
    pipeline = [ctx.source([1, 2, 3], name="a"), ctx.source([], name="b")] | ctx.combine()
    assert pipeline.drive(frames=3) == []
    stats = pipeline.statistics()["combine"]
    # a1 arrives, then b completes empty: no output can come, combine completes
    assert (stats.items_in, stats.items_out, dict(stats.dropped)) == (1, 0, {"unpaired": 1})


def test_zip_counts_what_is_left_unpaired(ctx: Context) -> None:
    """zip: items left without a partner when it completes are dropped as 'unpaired'."""
    pipeline = [ctx.source([1, 2, 3], name="a"), ctx.source(["x"], name="b")] | ctx.zip()
    assert pipeline.drive(frames=3) == [(1, "x")]
    stats = pipeline.statistics()["zip"]
    # round robin: a1, x, a2 arrive; zip completes with b, before a3 is pulled
    assert (stats.items_in, stats.items_out, dict(stats.dropped)) == (3, 1, {"unpaired": 1})
