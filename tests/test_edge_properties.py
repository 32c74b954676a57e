"""Properties at the edge: any JSON a client sends is queued or refused, never a crash, and a
doc never holds what a page's ``JSON.parse`` or UTF-8 would refuse."""

from __future__ import annotations

import json
import math
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

import rxstream
from rxstream import DocValidationError, Field
from rxstream.topology import ClientStreamLimits, SampleRefused

text = st.text(st.characters(codec=None, categories=["Cs", "Ll", "Nd", "Zs"]), max_size=8)
"""Short strings, lone surrogates among them (what ``json.loads`` makes of ``"\\ud800"``)."""
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)

UNIT = Field(float, min=0, max=1)


def input_pipeline() -> rxstream.Pipeline:
    """An input with a typed schema, a budget and a sized limit (what a client feeds)."""
    ctx = rxstream.Context()
    limits = ClientStreamLimits(max_items=10**6, item_size=lambda s: s["w"], unit="w")
    schema = {"xy": (UNIT, UNIT), "w": Field(float, min=0), "keys": [str]}
    return ctx.input("pointer", limits, schema=schema, capacity=4) | ctx.tap(lambda _: None)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=st.lists(st.tuples(json_values, st.one_of(st.none(), numbers, text)), max_size=6))
def test_feed_queues_or_refuses_any_json(samples: list[tuple[Any, Any]]) -> None:
    """``feed`` of any JSON sample and ``at_ms`` returns an ``input_seq`` or raises
    ``SampleRefused``; what was offered is what was accepted plus what was refused."""
    pipeline = input_pipeline()
    accepted = refused = 0
    for sample, at_ms in samples:
        try:
            seq = pipeline.feed("pointer", sample, at_ms)
        except SampleRefused as exc:
            str(exc).encode("utf-8")  # the error reply is sent as text
            refused += 1
        else:
            accepted += 1
            assert seq == accepted
    pipeline.drive(frames=len(samples))
    stats = pipeline.statistics()["pointer"]
    fed_drops = sum(stats.dropped.get(r, 0) for r in ("invalid", "limit"))
    assert (stats.items_out + stats.dropped.get("latest", 0), fed_drops) == (accepted, refused)


def well_formed(state: Any) -> None:
    """What a page can take: JSON without NaN/Infinity, valid UTF-8."""
    json.dumps(state, allow_nan=False, ensure_ascii=False).encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(
    writes=st.lists(
        st.dictionaries(st.sampled_from(["gain", "prompt", "vae", "x"]), json_values, max_size=3),
        max_size=4,
    )
)
@pytest.mark.slow
def test_a_doc_never_holds_what_a_page_cannot_parse(writes: list[dict[str, Any]]) -> None:
    """Any write is stored or refused with ``DocValidationError``; the state stays JSON a page
    parses (no NaN, no ±Infinity, no lone surrogate) and a float field holds floats."""
    ctx = rxstream.Context()
    typed = ctx.doc(
        "control", defaults={"gain": 1.0, "prompt": "sea", "vae": {"scale": 0.5}, "x": None}
    )
    free = ctx.doc("free")
    for write in writes:
        for doc in (typed, free):
            try:
                doc.set(write)
            except DocValidationError as exc:
                str(exc).encode("utf-8")
            well_formed(json.loads(doc.to_json())["state"])
    state = typed.snapshot()
    assert type(state["gain"]) is float
    assert math.isfinite(state["gain"])
