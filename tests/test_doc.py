"""The doc: refs and inline reads, validated writes, versions, JSON, and the legacy bind."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from typing import Any, Literal

import pytest

import rxstream
from rxstream import DocPathError, DocValidationError
from rxstream._exceptions import ArgumentTypeError

DEFAULTS = {"prompt": "a cat", "vae": {"model": "tiny", "steps": 4}, "scale": 1.0}


def test_inline_read_and_paths(ctx: rxstream.Context) -> None:
    """``doc.desired.a.b.value`` and calling the ref read the current value."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    assert doc.desired.vae.model.value == "tiny"
    assert doc.desired.vae.steps() == 4
    assert doc.desired["vae"]["model"].value == "tiny"
    assert doc.desired.vae.value == {"model": "tiny", "steps": 4}
    assert doc.version == 0


def test_missing_path_names_the_path_and_existing_keys(ctx: rxstream.Context) -> None:
    """A path that does not exist is an error naming it and the keys there."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    with pytest.raises(
        DocPathError,
        match=r"^control\.vae\.modle does not exist; the keys there are: model, steps$",
    ):
        _ = doc.desired.vae.modle.value
    assert doc.desired.vae.modle.get("fallback") == "fallback"


def test_set_deep_merges_into_a_new_version(ctx: rxstream.Context) -> None:
    """A write merges sections, replaces values and bumps the version; old snapshots stay."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    before = doc.snapshot()
    assert doc.set({"vae": {"model": "big"}}) == 1
    assert doc.set(scale=2) == 2
    assert doc.snapshot() == {"prompt": "a cat", "vae": {"model": "big", "steps": 4}, "scale": 2}
    assert before["vae"]["model"] == "tiny"
    with pytest.raises(TypeError):
        before["vae"]["model"] = "x"


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (
            {"vae": {"stepz": 3}},
            r"^control\.vae\.stepz is not a field of the doc \(fields there: model, steps\), "
            r"got 3$",
        ),
        (
            {"vae": {"steps": "ten"}},
            r"^control\.vae\.steps must be an int like its default 4, got 'ten'$",
        ),
        ({"vae": "big"}, r"^control\.vae is a section and takes a mapping, got 'big'$"),
        ({"scale": True}, r"^control\.scale must be a float like its default 1\.0, got True$"),
    ],
)
def test_invalid_write_is_rejected_and_state_unchanged(
    ctx: rxstream.Context, write: dict[str, Any], message: str
) -> None:
    """Without a schema the defaults fix names, sections and types; refusals change nothing."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    before = doc.snapshot()
    with pytest.raises(DocValidationError, match=message):
        doc.set(write)
    assert doc.snapshot() is before
    assert doc.version == 0


@dataclasses.dataclass
class Vae:
    model: Literal["tiny", "big"] = "tiny"
    steps: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.steps <= 50:
            raise ValueError(f"steps must be in 1..50, got {self.steps}")


@dataclasses.dataclass
class Control:
    prompt: str = "a cat"
    vae: Vae = dataclasses.field(default_factory=Vae)
    seed: int | None = None


def test_dataclass_schema_checks_types_literals_and_post_init(ctx: rxstream.Context) -> None:
    """A dataclass schema gives the defaults, checks annotations and runs __post_init__ rules."""
    doc = ctx.doc("control", schema=Control)
    assert doc.desired.vae.model.value == "tiny"
    doc.set(vae={"model": "big"}, seed=7)
    with pytest.raises(
        DocValidationError, match=r"^control\.vae\.model must be one of 'tiny', 'big', got 'huge'$"
    ):
        doc.set(vae={"model": "huge"})
    with pytest.raises(
        DocValidationError, match=r"^control\.vae: steps must be in 1\.\.50, got 99$"
    ):
        doc.set(vae={"steps": 99})
    with pytest.raises(
        DocValidationError, match=r"^control\.seed must be an int or None, got 'x'$"
    ):
        doc.set(seed="x")
    assert doc.snapshot() == {"prompt": "a cat", "vae": {"model": "big", "steps": 4}, "seed": 7}


def test_callable_schema(ctx: rxstream.Context) -> None:
    """A callable validator refuses a write by raising ValueError; its message is kept."""

    def check(state: dict[str, Any]) -> None:
        if state["fps"] > 60:
            raise ValueError(f"fps must be <= 60, got {state['fps']}")

    doc = ctx.doc("control", defaults={"fps": 24}, schema=check)
    doc.set(fps=30)
    with pytest.raises(DocValidationError, match=r"^control: fps must be <= 60, got 120$"):
        doc.set(fps=120)
    assert doc.desired.fps.value == 30


def test_concurrent_writers_lose_no_write(ctx: rxstream.Context) -> None:
    """Writes from 4 threads at once are serialised: every one lands, versions count them."""
    doc = ctx.doc("control", defaults={"w0": 0, "w1": 0, "w2": 0, "w3": 0})
    writes = 500
    versions: list[int] = []
    lock = threading.Lock()

    def writer(index: int) -> None:
        for i in range(1, writes + 1):
            version = doc.set({f"w{index}": i})
            with lock:
                versions.append(version)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert doc.snapshot() == {f"w{i}": writes for i in range(4)}
    assert doc.version == 4 * writes
    assert sorted(versions) == list(range(1, 4 * writes + 1))


def test_changes_emit_distinct_values(ctx: rxstream.Context) -> None:
    """``ref.changes`` emits the current value, then each distinct new one only."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    seen: list[Any] = []
    subscription = doc.desired.vae.model.changes.subscribe(seen.append)
    doc.set(scale=3.0)  # another path: nothing
    doc.set(vae={"model": "big"})
    doc.set(vae={"model": "big"})  # same value: nothing
    doc.set(vae={"model": "tiny"})
    subscription.dispose()
    assert seen == ["tiny", "big", "tiny"]


def test_json_form(ctx: rxstream.Context) -> None:
    """``to_json`` carries the name, the version and the state."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    doc.set(prompt="a dog")
    assert json.loads(doc.to_json()) == {
        "name": "control",
        "version": 1,
        "state": {**DEFAULTS, "prompt": "a dog"},
    }


def test_doc_is_made_once_per_name(ctx: rxstream.Context) -> None:
    """``ctx.doc(name)`` returns the same doc; redefining it is an error."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    assert ctx.doc("control") is doc
    assert ctx.control is doc
    with pytest.raises(ValueError, match=r"^doc 'control' exists already"):
        ctx.doc("control", defaults={})


def test_pipeline_update_is_a_steer_and_config_reads_the_control_doc(
    ctx: rxstream.Context,
) -> None:
    """update() writes the control doc and starts a new generation; config reads it back."""
    pipeline = ctx.source([1]) | ctx.stream("out")
    assert pipeline.update(prompt="a dog") == 1
    assert ctx.generations.prompt == 1
    assert dict(pipeline.config) == {"prompt": "a dog"}
    assert pipeline.flush() == 1


def test_legacy_bind_warns_and_maps_changes_to_update(ctx: rxstream.Context) -> None:
    """pipeline.bind(doc, mapping) warns, then updates the pipeline when a mapped path changes."""
    ui = ctx.doc("ui", defaults={"text": {"prompt": "a cat"}})
    pipeline = ctx.source([1]) | ctx.stream("out")
    with pytest.warns(DeprecationWarning, match=r"doc\.bind\(construct, \[deps\]\)"):
        pipeline.bind(ui, {"text.prompt": "prompt"})
    assert ctx.generations.prompt == 0  # binding applies nothing by itself
    ui.set(text={"prompt": "a dog"})
    assert ctx.control.desired.prompt.value == "a dog"
    assert ctx.generations.prompt == 1


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        (5, "doc 'control': defaults must be a mapping of field names to values, got 5 (int)"),
        ([1], "doc 'control': defaults must be a mapping of field names to values, got [1] (list)"),
        ({1: 2}, "doc 'control': defaults field names must be str, got 1 (int)"),
        (
            {"a": {3: 4}},
            "doc 'control': defaults field names must be str, got 3 (int) in defaults.a",
        ),
    ],
)
def test_defaults_that_are_not_named_fields_are_refused_naming_them(
    defaults: object, message: str
) -> None:
    """defaults= must be a mapping of str field names, at every depth: one clear error."""
    with pytest.raises(ArgumentTypeError) as caught:
        rxstream.Context().doc("control", defaults=defaults)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_a_write_whose_fields_are_not_str_is_refused_and_changes_nothing(
    ctx: rxstream.Context,
) -> None:
    """doc.set({1: 2}) or doc.set(7): a clear error, the state and version unchanged."""
    doc = ctx.doc("control", defaults={"a": 1})
    for changes, rule in (
        ({1: 2}, "field names must be str, got 1 (int)"),
        (7, "must be a mapping"),
    ):
        with pytest.raises(ArgumentTypeError, match=re.escape(rule)):
            doc.set(changes)  # type: ignore[arg-type]
    assert doc.version == 0
    assert doc.desired.a() == 1
