"""Composition with ``|``: graphs, names, fan-in/fan-out, and build-time misuse errors."""

from __future__ import annotations

import pytest

import rxstream
from rxstream import StageBuildError, StageReuseError


def double(x: int) -> int:
    return x * 2


def inc(x: int) -> int:
    return x + 1


def test_pipe_chain_builds_a_pipeline_without_running(ctx: rxstream.Context) -> None:
    """``a | b | c`` returns a Pipeline whose stages are named after their functions."""
    calls: list[int] = []
    pipeline = ctx.source([1, 2]) | ctx.pipe(double) | ctx.tap(calls.append) | ctx.stream("out")
    assert isinstance(pipeline, rxstream.Pipeline)
    assert list(pipeline.stages) == ["source", "double", "append", "out"]
    assert calls == []


def test_composition_is_immutable(ctx: rxstream.Context) -> None:
    """Composing further leaves the earlier pipeline as it was."""
    head = ctx.source([1, 2, 3]) | ctx.pipe(double)
    longer = head | ctx.pipe(inc)
    assert head.drive(frames=3) == [2, 4, 6]
    assert longer.drive(frames=3) == [3, 5, 7]


def test_segment_splices_into_a_pipeline(ctx: rxstream.Context) -> None:
    """``src | (a | b)`` feeds the segment's open head from the source."""
    segment = ctx.pipe(double) | ctx.pipe(inc)
    assert (ctx.source([1, 2]) | segment).drive(frames=2) == [3, 5]


def test_derived_names_are_made_unique_in_graph_order(ctx: rxstream.Context) -> None:
    """Two stages deriving one name become ``name`` and ``name-2``, upstream first."""
    pipeline = ctx.source([1]) | ctx.pipe(double) | ctx.pipe(double)
    assert list(pipeline.stages) == ["source", "double", "double-2"]


def test_lambda_names_fall_back_to_the_kind(ctx: rxstream.Context) -> None:
    """A lambda has no useful name, so the stage is named after its kind."""
    pipeline = ctx.source([1]) | ctx.pipe(lambda x: x)
    assert list(pipeline.stages) == ["source", "pipe"]


def test_explicit_duplicate_names_are_rejected(ctx: rxstream.Context) -> None:
    """Two stages given the same name is an error naming it."""
    pipeline = ctx.source([1]) | ctx.pipe(double, name="x") | ctx.pipe(inc, name="x")
    with pytest.raises(StageBuildError, match=r"^stage names must be unique in a pipeline, "):
        pipeline.drive()


def test_a_stage_object_used_twice_is_an_error(ctx: rxstream.Context) -> None:
    """The same stage object at two places raises StageReuseError naming the stage."""
    twice = ctx.pipe(double)
    with pytest.raises(StageReuseError, match=r"^stage 'double' \(pipe\) is used at two places"):
        (ctx.source([1]) | twice | twice).drive()


def test_fan_out_shares_the_upstream(ctx: rxstream.Context) -> None:
    """One upstream feeding two downstreams runs once and reaches both."""
    pulled: list[int] = []
    src = ctx.source([1, 2, 3]) | ctx.tap(pulled.append)
    graph = ctx.graph(
        src | ctx.pipe(double) | ctx.stream("a"), src | ctx.pipe(inc) | ctx.stream("b")
    )
    assert graph.drive(frames=3) == {"a": [2, 4, 6], "b": [2, 3, 4]}
    assert pulled == [1, 2, 3]


def test_fan_in_list_head(ctx: rxstream.Context) -> None:
    """``[a, b] | ctx.merge()`` takes both inputs."""
    merged = [ctx.source([1, 2]), ctx.source([10, 20])] | ctx.merge()
    assert sorted(merged.drive(frames=2)) == [1, 2, 10, 20]


def test_nothing_follows_a_sink(ctx: rxstream.Context) -> None:
    """A sink in the middle raises at composition, naming the sink."""
    with pytest.raises(StageBuildError, match=r"^sink 'out' \(ctx.stream\) must end the pipeline"):
        _ = ctx.source([1]) | ctx.stream("out") | ctx.pipe(double)


def test_a_source_takes_no_input(ctx: rxstream.Context) -> None:
    """Piping into a source is an error naming it."""
    with pytest.raises(StageBuildError, match=r"^stage 'source' \(source\) cannot take an input"):
        _ = ctx.pipe(double) | ctx.source([1])


def test_a_pipeline_must_start_with_a_source(ctx: rxstream.Context) -> None:
    """Running a segment with an open head names the stage that has no input."""
    with pytest.raises(StageBuildError, match=r"^stage 'double' \(pipe\) has no input"):
        (ctx.pipe(double) | ctx.pipe(inc)).drive()


def test_single_input_stage_rejects_fan_in(ctx: rxstream.Context) -> None:
    """``[a, b] | ctx.pace(...)`` says pace takes one input."""
    with pytest.raises(StageBuildError, match=r"^stage 'pace' \(pace\) takes 1 input\(s\), got 2$"):
        _ = [ctx.source([1]), ctx.source([2])] | ctx.pace(fps=24)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"policy": "oldest"},
            r"^inbox policy must be one of block, latest, drop_new, got 'oldest' "
            r"for stage 'double'$",
        ),
        ({"capacity": 0}, r"^inbox capacity must be >= 1, got 0 for stage 'double'$"),
        (
            {"on_error": "ignore"},
            r"^on_error must be one of raise, skip, got 'ignore' for stage 'double'$",
        ),
        ({"rank": -1}, r"^rank must be an int >= 0, got -1 for stage 'double'$"),
    ],
)
def test_bad_stage_options_raise_at_build_time(
    ctx: rxstream.Context, kwargs: dict[str, object], message: str
) -> None:
    """Unknown inbox policy, bad capacity, on_error or rank name the stage and the rule."""
    with pytest.raises(StageBuildError, match=message):
        ctx.pipe(double, **kwargs)  # type: ignore[arg-type]


def test_source_must_be_iterable_or_callable(ctx: rxstream.Context) -> None:
    """A source spec that cannot produce items is a StageBuildError naming the stage."""
    with pytest.raises(StageBuildError, match=r"^a source must be .*, got int for stage 'ticks'$"):
        ctx.source(42, name="ticks")


def test_stream_rejects_unknown_codec(ctx: rxstream.Context) -> None:
    """The in-memory transport egresses raw items only; other codecs say so."""
    with pytest.raises(StageBuildError, match=r"codec must be one of .* got 'vp9' for stream 'v'$"):
        ctx.stream("v", codec="vp9")


def test_stages_from_two_contexts_do_not_mix(ctx: rxstream.Context) -> None:
    """A pipeline's stages come from one Context."""
    other = rxstream.Context()
    with pytest.raises(
        StageBuildError, match=r"^stages of one pipeline must come from one Context$"
    ):
        _ = ctx.source([1]) | other.pipe(double)


@pytest.mark.parametrize(
    ("kind", "build"),
    [
        ("source", lambda ctx: ctx.source(range(3), name="")),
        ("pipe", lambda ctx: ctx.pipe(abs, name="")),
        ("tap", lambda ctx: ctx.tap(print, name="")),
        ("pace", lambda ctx: ctx.pace(fps=24, name="")),
        ("window", lambda ctx: ctx.window(2, name="")),
        ("stream", lambda ctx: ctx.stream("")),
    ],
)
def test_an_empty_stage_name_is_refused_by_every_builder(kind: str, build: object) -> None:
    """name="" is refused as ctx.stream("") is, never silently replaced by the default."""
    with pytest.raises(StageBuildError) as caught:
        build(rxstream.Context())  # type: ignore[operator]
    assert str(caught.value) == (
        f"stage name must be a non-empty str without '.', got '' for a {kind} stage"
    )
