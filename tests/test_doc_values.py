"""Doc values at the edge: valid Unicode, finite floats, an int in a float field is a float."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import rxstream
from rxstream import DocValidationError

DEFAULTS = {"prompt": "a cat", "gain": 1.0, "steps": 4, "vae": {"scale": 0.5}, "tags": ["a"]}


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (
            {"gain": math.nan},
            r"^control\.gain must be a finite number \(declare metadata=\{\"finite\": False\} "
            r"to allow it\), got nan$",
        ),
        ({"gain": math.inf}, r"^control\.gain must be a finite number .*, got inf$"),
        ({"vae": {"scale": -math.inf}}, r"^control\.vae\.scale must be a finite .*, got -inf$"),
        (
            {"prompt": "x\ud800y"},
            r"^control\.prompt must be valid Unicode \(no lone surrogate\), "
            r"got 'x\\ud800y' \(surrogates not allowed at index 1\)$",
        ),
        ({"tags": ["ok", "\udfff"]}, r"^control\.tags\.1 must be valid Unicode .*$"),
    ],
)
def test_schemaless_doc_refuses_nan_inf_and_lone_surrogates(
    ctx: rxstream.Context, write: dict[str, Any], message: str
) -> None:
    """A write of NaN/±Inf or a string with a lone surrogate is refused, naming the field."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    with pytest.raises(DocValidationError, match=message):
        doc.set(write)
    assert doc.version == 0
    assert doc.snapshot()["gain"] == 1.0


def test_keyword_nan_is_refused_and_state_unchanged(ctx: rxstream.Context) -> None:
    """``doc.set(gain=float("nan"))`` raises naming field, rule and value."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    with pytest.raises(DocValidationError, match=r"^control\.gain must be a finite number"):
        doc.set(gain=float("nan"))
    assert doc.desired.gain.value == 1.0


def test_a_doc_without_defaults_refuses_them_too(ctx: rxstream.Context) -> None:
    """With no defaults any key is taken, but its values still obey the value rules."""
    doc = ctx.doc("free")
    doc.set(anything={"x": 1.5})
    with pytest.raises(DocValidationError, match=r"^free\.anything\.x must be a finite number"):
        doc.set(anything={"x": math.nan})
    with pytest.raises(DocValidationError, match=r"^free must be valid Unicode"):
        doc.set({"\ud800": 1})


def test_an_infinite_default_declares_a_field_that_takes_any_float(
    ctx: rxstream.Context,
) -> None:
    """Without a schema, a field whose default is not finite takes NaN and Inf."""
    doc = ctx.doc("control", defaults={"limit": math.inf})
    doc.set(limit=math.nan)
    assert math.isnan(doc.desired.limit.value)


def test_int_written_to_a_float_field_is_stored_as_a_float(ctx: rxstream.Context) -> None:
    """An int written where the default is a float is stored as a float (sections too)."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    doc.set(gain=2, vae={"scale": 1})
    assert type(doc.desired.gain.value) is float
    assert type(doc.desired.vae.scale.value) is float
    doc.set(steps=5)
    assert type(doc.desired.steps.value) is int


@dataclasses.dataclass
class Section:
    """A nested section."""

    scale: float = 0.5


@dataclasses.dataclass
class Control:
    """A schema with a float that may be infinite and one that may not."""

    gain: float = 1.0
    ceiling: float = dataclasses.field(default=math.inf, metadata={"finite": False})
    offset: float | None = None
    prompt: str = "a cat"
    vae: Section = dataclasses.field(default_factory=Section)


def test_dataclass_schema_refuses_nan_unless_the_field_allows_it(
    ctx: rxstream.Context,
) -> None:
    """A dataclass field takes NaN/Inf only with ``metadata={"finite": False}``."""
    doc = ctx.doc("control", schema=Control)
    with pytest.raises(DocValidationError, match=r"^control\.gain must be a finite .*got nan$"):
        doc.set(gain=math.nan)
    with pytest.raises(DocValidationError, match=r"^control\.vae\.scale must be a finite"):
        doc.set(vae={"scale": math.inf})
    with pytest.raises(DocValidationError, match=r"^control\.prompt must be valid Unicode"):
        doc.set(prompt="\ud83d")
    doc.set(ceiling=math.nan)
    assert math.isnan(doc.desired.ceiling.value)


def test_dataclass_float_fields_store_ints_as_floats(ctx: rxstream.Context) -> None:
    """``float`` and ``float | None`` fields store an int as a float; nested sections too."""
    doc = ctx.doc("control", schema=Control)
    doc.set(gain=3, offset=2, vae={"scale": 1})
    snapshot = doc.snapshot()
    assert (type(snapshot["gain"]), type(snapshot["offset"])) == (float, float)
    assert type(snapshot["vae"]["scale"]) is float


def test_callable_schema_docs_obey_the_value_rules(ctx: rxstream.Context) -> None:
    """A callable schema never sees NaN or a lone surrogate: they are refused first."""
    seen: list[dict[str, Any]] = []
    doc = ctx.doc("control", defaults={"gain": 1.0}, schema=seen.append)
    with pytest.raises(DocValidationError, match=r"^control\.gain must be a finite"):
        doc.set(gain=math.inf)
    assert seen == [{"gain": 1.0}]


def test_an_int_no_float_holds_is_refused_by_size(ctx: rxstream.Context) -> None:
    """A huge int for a float field, or of the wrong kind, is refused by its size, not printed."""
    doc = ctx.doc("control", defaults=DEFAULTS)
    with pytest.raises(
        DocValidationError, match=r"^control\.gain must be a number a float holds, got an int "
    ):
        doc.set(gain=10**400)
    with pytest.raises(
        DocValidationError, match=r"^control\.prompt must be a str .*, got <int of 16610 bits>$"
    ):
        doc.set(prompt=10**5000)
    schema_doc = ctx.doc("other", schema=Control)
    with pytest.raises(DocValidationError, match=r"^other\.gain must be a number a float holds"):
        schema_doc.set(gain=10**400)
