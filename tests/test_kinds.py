"""A stage kind is one declaration (``StageKind``): every builder's stage has one, and the books,
the fuser and the run read it instead of lists of kind names."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from reactivex import operators as ops

import rxstream
from rxstream._exceptions import StageBuildError
from rxstream._kernel._options import PipeOptions
from rxstream.runtime._books import settled, unbalanced
from rxstream.runtime._fuse import fusable_chains
from rxstream.runtime._threaded import ThreadedRun
from rxstream.stage import Stage, StageKind


def _ident(x: Any) -> Any:
    return x


def _doc(ctx: rxstream.Context) -> Any:
    return ctx.docs.get("control") or ctx.doc("control", defaults={"k": 1})


BUILT: dict[str, Callable[[rxstream.Context], Stage]] = {
    "source": lambda ctx: ctx.source(range(3)),
    "input": lambda ctx: ctx.input("mouse"),
    "pipe": lambda ctx: ctx.pipe(_ident),
    "tap": lambda ctx: ctx.tap(_ident),
    "pace": lambda ctx: ctx.pace(24),
    "unbatch": lambda ctx: ctx.unbatch(),
    "window": lambda ctx: ctx.window(count=2),
    "stream": lambda ctx: ctx.stream("out"),
    "merge": lambda ctx: ctx.merge(),
    "zip": lambda ctx: ctx.zip(),
    "combine": lambda ctx: ctx.combine(),
    "bind": lambda ctx: ctx.bind(_doc(ctx), lambda snapshot: _ident, [_doc(ctx).desired.k]),
    "walks": lambda ctx: ctx.walks({"a": ctx.pipe(_ident)}, pick=lambda snapshot: "a"),
    "rx": lambda ctx: ctx.rx(lambda o: o),
    "throttle": lambda ctx: ctx.throttle(ms=100),
}
"""One call of each builder of ``Context`` that makes a stage, by the kind it makes."""


def _stage_builders() -> set[str]:
    """The public methods of ``Context`` annotated to return a ``Stage``."""
    return {
        name
        for name, member in inspect.getmembers(rxstream.Context, inspect.isfunction)
        if not name.startswith("_") and inspect.signature(member).return_annotation == "Stage"
    }


def test_every_builder_is_listed_here() -> None:
    """A new builder of ``Context`` fails this test until its kind is listed in ``BUILT``."""
    assert _stage_builders() == set(BUILT)


@pytest.mark.parametrize("kind", sorted(BUILT))
def test_every_builder_makes_a_declared_kind(ctx: rxstream.Context, kind: str) -> None:
    """Each builder's stage carries its kind's declaration, whose shape fits its inputs."""
    stage = BUILT[kind](ctx)
    assert isinstance(stage.declared, StageKind)
    assert stage.kind == stage.declared.name == kind
    assert stage.is_source == (stage.max_inputs == 0)
    assert stage.is_sink == (kind == "stream")
    assert type(stage.options) is stage.declared.options


def test_a_kind_given_by_name_is_refused(ctx: rxstream.Context) -> None:
    """A ``Stage`` whose kind is a bare name has no shape: refused, naming the kind."""
    with pytest.raises(StageBuildError) as caught:
        Stage(kind="blur", name="b", build=lambda shell: _ident, context=ctx)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    assert "'blur' has no declared shape" in message
    assert "stage 'b'" in message


@dataclass(frozen=True)
class BlurOptions:
    """A test kind's options."""

    radius: int = 3


def test_options_of_another_class_than_the_kinds_are_refused(ctx: rxstream.Context) -> None:
    """A stage's options are an instance of its kind's options class (the default one when
    none are given, typed attributes); a dict or another kind's are refused, naming both."""
    kind = StageKind("blur", "1:1", options=BlurOptions)
    stage = Stage(kind=kind, name="b", build=lambda shell: _ident, context=ctx)
    assert stage.options == BlurOptions(radius=3)
    given = Stage(kind=kind, name="b", build=lambda s: _ident, context=ctx, options=BlurOptions(5))
    assert given.options == BlurOptions(radius=5)
    for wrong in ({"radius": 5}, PipeOptions(fuse=True)):
        with pytest.raises(StageBuildError) as caught:
            Stage(kind=kind, name="b", build=lambda shell: _ident, context=ctx, options=wrong)
        assert str(caught.value) == (
            "stage 'b': options must be a BlurOptions (what a blur stage declares), "
            f"got {type(wrong).__name__}"
        )


def test_a_kind_with_an_unknown_shape_is_refused() -> None:
    """A ``StageKind`` names one of the books' shapes; another is refused, naming it."""
    with pytest.raises(StageBuildError, match=r"stage kind 'blur': shape must be one of .*'2:1'"):
        StageKind("blur", "2:1")  # type: ignore[arg-type]


def test_a_source_shape_takes_no_input(ctx: rxstream.Context) -> None:
    """A kind shaped ``source`` with inputs, or another without, is refused at construction."""
    with pytest.raises(StageBuildError, match="shaped 'source', which takes no input"):
        Stage(kind=StageKind("ticks", "source"), name="t", build=lambda shell: _ident, context=ctx)
    with pytest.raises(StageBuildError, match="shaped '1:1', which takes an input"):
        Stage(
            kind=StageKind("blur", "1:1"),
            name="b",
            build=lambda shell: _ident,
            context=ctx,
            inputs=(0, 0),
        )


def test_the_fuser_reads_the_declaration(ctx: rxstream.Context) -> None:
    """Two consecutive stages of a kind declared ``fusable`` chain; a tap (not fusable) does
    not, though it is 1:1 too."""
    pipes = ctx.source(range(3)) | ctx.pipe(_ident, name="a") | ctx.pipe(_ident, name="b")
    taps = ctx.source(range(3)) | ctx.tap(_ident, name="a") | ctx.tap(_ident, name="b")
    assert [len(chain) for chain in fusable_chains(pipes.plan).values()] == [2]
    assert fusable_chains(taps.plan) == {}


def _run(pipeline: rxstream.Pipeline, runs: list[ThreadedRun]) -> ThreadedRun:
    pipeline.start()
    pipeline.wait(timeout=10)
    pipeline.stop()
    assert len(runs) == 1
    assert settled(runs[0])
    return runs[0]


def test_the_books_read_the_declared_shape(
    ctx: rxstream.Context, balanced_books: list[ThreadedRun]
) -> None:
    """The books hold a stage to the law of the shape its kind declares: an ``rx`` stage that
    doubles each item balances as ``free``, and breaks ``1:1`` once its kind declares that."""
    double = ctx.rx(lambda o: o.pipe(ops.flat_map(lambda x: [x, x])), name="d")
    run = _run(ctx.source(range(4), name="src") | double | ctx.stream("out"), balanced_books)
    assert unbalanced(run) == []
    declared = double.declared
    double.declared = StageKind("rx", "1:1")
    try:
        assert unbalanced(run) == [
            "rx 'd': arrived 4, dropped {}, waiting 0, took 4, emitted 8: "
            "a 1:1 stage emits what it took"
        ]
    finally:
        double.declared = declared


def test_the_books_refuse_held_items_of_a_kind_that_does_not_hold(
    ctx: rxstream.Context, balanced_books: list[ThreadedRun]
) -> None:
    """A stage that says it holds items must be of a kind declared ``holds=True``."""
    run = _run(ctx.source(range(2), name="src") | ctx.pipe(_ident, name="f"), balanced_books)
    counters = next(shell.counters for shell in run.shells.values() if shell.name == "f")
    counters.held = 1
    try:
        assert unbalanced(run) == [
            "pipe 'f': arrived 2, dropped {}, waiting 0, took 2, emitted 2: it holds 1 items, "
            "and its kind does not declare holds=True"
        ]
    finally:
        counters.held = 0
