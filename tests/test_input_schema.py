"""Client samples checked at the edge: ``ctx.input(schema=…)``, at_ms, item_size, budgets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
from pathlib import Path
from typing import Any, Literal

import _serving
import aiohttp
import numpy as np
import pytest

import rxstream
from rxstream import Field, StageBuildError
from rxstream.topology import (
    ClientStreamLimitExceeded,
    ClientStreamLimits,
    InvalidSample,
    SampleRefused,
)
from rxstream.transport import WebTransport

POINTER = (Field(float, min=0, max=1), Field(float, min=0, max=1))
KEYS = {"key": str, "down": bool}


def drive_input(ctx: rxstream.Context, schema: object, samples: list[Any]) -> list[Any]:
    """Feed ``samples`` (refusals skipped) to an input with ``schema``; what a stage saw."""
    seen: list[Any] = []
    pipeline = ctx.input("pointer", schema=schema) | ctx.tap(seen.append)
    for sample in samples:
        with contextlib.suppress(InvalidSample):
            pipeline.feed("pointer", sample)
    pipeline.drive(frames=len(samples))
    return seen


@pytest.mark.parametrize(
    ("schema", "sample", "message"),
    [
        (POINTER, (0.5, 1.5), r"^sample\[1\] must be <= 1, got 1\.5 for client stream 'pointer'$"),
        (POINTER, (0.5, math.nan), r"^sample\[1\] must be a finite number, got nan for "),
        (POINTER, "hello", r"^sample must be a sequence of 2, got 'hello' for "),
        (POINTER, [0.5], r"^sample must be a sequence of 2, got \[0\.5\] for "),
        (POINTER, {"a": 1}, r"^sample must be a sequence of 2, got \{'a': 1\} for "),
        (POINTER, (True, 0.5), r"^sample\[0\] must be a float, got True for "),
        (
            KEYS,
            {"key": "a"},
            r"^sample\['down'\] is missing for client stream 'pointer'$",
        ),
        (
            KEYS,
            {"key": "a", "down": True, "x": 1},
            r"^sample\['x'\] is not a key of the sample \(keys: 'key', 'down'\) for ",
        ),
        (KEYS, {"key": 1, "down": True}, r"^sample\['key'\] must be a str, got 1 for "),
        (KEYS, {"key": "\ud800", "down": True}, r"^sample\['key'\] must be valid Unicode "),
        (Literal["up", "down"], "left", r"^sample must be one of 'up', 'down', got 'left' for "),
        ([int], [1, 2, "3"], r"^sample\[2\] must be an int, got '3' for "),
        (Field(str, max_len=3), "abcd", r"^sample must be at most 3 long, got 'abcd' for "),
        ((float, None), (0.5, 1), r"^sample\[1\] must be None, got 1 for "),
    ],
)
def test_typed_schema_refuses_a_sample_naming_place_rule_and_value(
    ctx: rxstream.Context, schema: object, sample: Any, message: str
) -> None:
    """A sample that breaks the typed schema is refused, named, and never reaches a stage."""
    pipeline = ctx.input("pointer", schema=schema) | ctx.tap(lambda _: None)
    with pytest.raises(InvalidSample, match=message) as caught:
        pipeline.feed("pointer", sample)
    assert isinstance(caught.value, SampleRefused)
    assert isinstance(caught.value, ValueError)
    assert caught.value.code == "invalid"


def test_valid_samples_pass_and_refused_ones_never_reach_a_stage(
    ctx: rxstream.Context,
) -> None:
    """Only the samples that fit are queued, numbered from 1, and seen by the stage."""
    samples = [(0.5, 0.5), "hello", (0, 1), [0.5], {"a": 1}, [0.25, 0.75]]
    seen = drive_input(ctx, POINTER, samples)
    assert seen == [(0.5, 0.5), (0, 1), [0.25, 0.75]]


def test_refusals_are_counted_on_the_input_stage(ctx: rxstream.Context) -> None:
    """What was offered is what the stage pulled plus what it refused (``invalid``)."""
    seen: list[Any] = []
    pipeline = ctx.input("keys", schema=KEYS) | ctx.tap(seen.append)
    assert pipeline.feed("keys", {"key": "a", "down": True}) == 1
    for bad in ({"key": "a"}, "x", None):
        with pytest.raises(InvalidSample):
            pipeline.feed("keys", bad)
    assert pipeline.feed("keys", {"key": "a", "down": False}) == 2
    pipeline.drive(frames=2)
    stats = pipeline.statistics()["keys"]
    assert stats.items_out == 2
    assert dict(stats.dropped) == {"invalid": 3}


def test_callable_validator_refuses_by_false_or_by_raising(ctx: rxstream.Context) -> None:
    """A validator that returns False, or raises ValueError, refuses the sample with its why."""

    def positive(sample: Any) -> bool:
        if not isinstance(sample, int):
            raise ValueError(f"wants an int, not {type(sample).__name__}")
        return sample > 0

    pipeline = ctx.input("n", schema=positive) | ctx.tap(lambda _: None)
    with pytest.raises(
        InvalidSample,
        match=r"^sample is refused by test_callable_validator_refuses_by_false_or_by_raising"
        r"\.<locals>\.positive, got -1 for client stream 'n'$",
    ):
        pipeline.feed("n", -1)
    with pytest.raises(InvalidSample, match=r"positive: wants an int, not str, got 'x' for "):
        pipeline.feed("n", "x")
    assert pipeline.feed("n", 3) == 1


def test_a_schema_that_is_none_of_the_kinds_is_refused_at_declaration(
    ctx: rxstream.Context,
) -> None:
    """``ctx.input`` refuses a schema it cannot check, naming the input."""
    with pytest.raises(StageBuildError, match=r"^schema must be a type, .* got 3 for input 'n'$"):
        ctx.input("n", schema=(float, 3))


@pytest.mark.parametrize("at_ms", [math.inf, math.nan, -math.inf, True, "12", 2.0**60])
def test_bad_at_ms_is_refused_before_budget_or_input_seq(ctx: rxstream.Context, at_ms: Any) -> None:
    """A sample with a bad ``at_ms`` costs no budget and no ``input_seq``."""
    pipeline = ctx.input("mouse", ClientStreamLimits(max_items=2)) | ctx.tap(lambda _: None)
    for _ in range(2):
        with pytest.raises(InvalidSample, match=r"^at_ms must be a .*for client stream 'mouse'$"):
            pipeline.feed("mouse", 1, at_ms)
    assert pipeline.feed("mouse", 1) == 1
    assert pipeline.feed("mouse", 2, 12.5) == 2
    with pytest.raises(ClientStreamLimitExceeded):
        pipeline.feed("mouse", 3)


def test_the_issue_case_exactly_max_items_accepted_after_bad_samples(
    ctx: rxstream.Context,
) -> None:
    """max_items=10: two bad ``at_ms`` and bad samples first, then 10 of 100 accepted."""
    pipeline = ctx.input(
        "mouse", ClientStreamLimits(max_items=10), schema=(float, float)
    ) | ctx.tap(lambda _: None)
    for bad_at in (math.inf, math.nan):
        with pytest.raises(InvalidSample):
            pipeline.feed("mouse", (0.0, 0.0), bad_at)
    with pytest.raises(InvalidSample):
        pipeline.feed("mouse", "hello")
    accepted = []
    for i in range(100):
        with contextlib.suppress(ClientStreamLimitExceeded):
            accepted.append(pipeline.feed("mouse", (i, i)))
    assert accepted == list(range(1, 11))


def seconds(sample: Any) -> float:
    """A chunk's length in seconds: the sample itself."""
    return sample  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("size", "shown"), [(math.nan, "nan"), (-5.0, "-5.0"), (math.inf, "inf"), ("5", "'5'")]
)
def test_item_size_must_be_finite_and_not_negative(
    ctx: rxstream.Context, size: Any, shown: str
) -> None:
    """A NaN, infinite, negative or non-number ``item_size`` refuses the sample, naming it."""
    limits = ClientStreamLimits(max_items=10, item_size=seconds, unit="seconds")
    pipeline = ctx.input("audio", limits) | ctx.tap(lambda _: None)
    pipeline.feed("audio", 5)
    with pytest.raises(
        InvalidSample,
        match=rf"^item_size\(sample\) must be a finite number >= 0, got {shown} "
        r"for client stream 'audio'$",
    ):
        pipeline.feed("audio", size)
    pipeline.feed("audio", 5)
    with pytest.raises(ClientStreamLimitExceeded, match=r"would bring it to 60 seconds$"):
        pipeline.feed("audio", 50)


def test_item_size_that_raises_refuses_the_sample(ctx: rxstream.Context) -> None:
    """An ``item_size`` that raises refuses that sample only."""
    limits = ClientStreamLimits(max_items=10, item_size=len)
    pipeline = ctx.input("text", limits) | ctx.tap(lambda _: None)
    with pytest.raises(InvalidSample, match=r"^item_size\(sample\) raised TypeError: "):
        pipeline.feed("text", 5)
    assert pipeline.feed("text", "abc") == 1


def test_budgets_are_per_client(ctx: rxstream.Context) -> None:
    """Each client key has its own budget; one client's spending never refuses another."""
    pipeline = ctx.input("mouse", ClientStreamLimits(max_items=2)) | ctx.tap(lambda _: None)
    seqs = []
    for client in ("page-a", "page-b", None):
        seqs += [pipeline.feed("mouse", 1, client=client) for _ in range(2)]
        with pytest.raises(ClientStreamLimitExceeded):
            pipeline.feed("mouse", 3, client=client)
    assert seqs == [1, 2, 3, 4, 5, 6]


def test_budget_resets_on_a_new_start(ctx: rxstream.Context) -> None:
    """A new ``start()`` gives every client a fresh budget."""
    seen: list[Any] = []
    got = threading.Condition()

    def keep(sample: Any) -> None:
        with got:
            seen.append(sample)
            got.notify_all()

    pipeline = ctx.input("mouse", ClientStreamLimits(max_items=2)) | ctx.tap(keep)
    for run in range(2):
        pipeline.start()
        try:
            pipeline.feed("mouse", (run, 1))
            pipeline.feed("mouse", (run, 2))
            with pytest.raises(ClientStreamLimitExceeded):
                pipeline.feed("mouse", (run, 3))
            want = 2 * (run + 1)
            with got:
                assert got.wait_for(lambda: len(seen) == want, timeout=10)  # noqa: B023
        finally:
            pipeline.stop()
        assert dict(pipeline.statistics()["mouse"].dropped) == {"limit": 1}
    assert seen == [(0, 1), (0, 2), (1, 1), (1, 2)]


class Served(_serving.Served):
    """``pipeline.run()`` behind a WebTransport on a free port, on a thread, while in ``with``."""

    def __init__(self, limits: ClientStreamLimits) -> None:
        web = WebTransport(port=0, grace_s=0.1)
        ctx = rxstream.Context(transport=web)
        self.doc = ctx.doc("control", defaults={"prompt": "sea", "gain": 0.5})
        super().__init__(
            web,
            ctx.input("pointer", limits, schema=POINTER)
            | ctx.pipe(lambda s: np.full((4, 4, 3), int(s[0] * 255), np.uint8), name="render")
            | ctx.stream("video"),
        )


async def exchange(ws: Any, texts: list[str]) -> list[dict[str, Any]]:
    """Send ``texts``; the ``ack``/``error`` replies, one per text, in order."""
    for text in texts:
        await ws.send_str(text)
    replies: list[dict[str, Any]] = []
    while len(replies) < len(texts):
        message = await ws.receive(timeout=10)
        if message.type == aiohttp.WSMsgType.TEXT:
            reply = json.loads(message.data)
            if reply["type"] in ("ack", "error"):
                replies.append(reply)
    return replies


def test_web_refuses_bad_samples_and_doc_values_and_goes_on() -> None:
    """Over the socket: a bad sample, a bad at_ms, a lone surrogate and a NaN are answered."""

    async def talk(ws_url: str) -> list[dict[str, Any]]:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(ws_url) as ws,
        ):
            await ws.send_str(json.dumps({"type": "hello", "accept": ["raw"]}))
            return await exchange(
                ws,
                [
                    json.dumps({"type": "input", "stream": "pointer", "sample": "hello", "id": 1}),
                    '{"type": "input", "stream": "pointer", "sample": [0.5, 0.5], "at_ms": 1e400}',
                    json.dumps({"type": "set", "changes": {"prompt": "x\ud800y"}, "id": 3}),
                    '{"type": "set", "changes": {"gain": NaN}, "id": 4}',
                    json.dumps(
                        {"type": "input", "stream": "pointer", "sample": [0.5, 0.2], "id": 5}
                    ),
                ],
            )

    with Served(ClientStreamLimits(max_items=2)) as served:
        replies = asyncio.run(talk(served.web.ws_url))
    assert served.error is None
    codes = [(r.get("id"), r["type"], r.get("code")) for r in replies]
    # the wire's guard refuses what JSON cannot carry faithfully before any handler runs
    # (the doc's own rules, behind it, are pinned in test_doc_values.py)
    assert codes == [
        (1, "error", "invalid"),
        (None, "error", "malformed"),
        (3, "error", "malformed"),
        (None, "error", "malformed"),  # a NaN literal: no id can be read
        (5, "ack", None),
    ]
    assert "sample must be a sequence of 2, got 'hello'" in replies[0]["error"]
    assert "numbers must be finite" in replies[1]["error"]
    assert "surrogate" in replies[2]["error"]
    assert "numbers must be finite" in replies[3]["error"]
    assert replies[4]["input_seq"] == 1
    assert served.doc.snapshot() == {"prompt": "sea", "gain": 0.5}


def test_web_pages_have_a_budget_each() -> None:
    """Two pages on one run: each may feed up to the limit; one past it is refused alone."""

    def sample(i: int) -> str:
        return json.dumps({"type": "input", "stream": "pointer", "sample": [0.1, 0.1], "id": i})

    async def talk(ws_url: str) -> list[list[dict[str, Any]]]:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(ws_url) as a,
            http.ws_connect(ws_url) as b,
        ):
            return [
                await exchange(a, [sample(1), sample(2), sample(3)]),
                await exchange(b, [sample(1), sample(2), sample(3)]),
            ]

    with Served(ClientStreamLimits(max_items=2)) as served:
        first, second = asyncio.run(talk(served.web.ws_url))
    assert served.error is None
    for replies in (first, second):
        assert [r["type"] for r in replies] == ["ack", "ack", "error"]
        assert replies[2]["code"] == "limit"
    assert sorted(r["input_seq"] for r in first[:2] + second[:2]) == [1, 2, 3, 4]


@pytest.mark.parametrize("sample", ["hello", (0.5,), {"a": 1}, (0.5, math.nan), (2.0, 0.5)])
def test_the_demo_refuses_the_samples_that_used_to_end_its_run(sample: Any) -> None:
    """The demo declares its pointer's shape: the issue's samples are refused at feed."""
    from rxstream.launch import load_app

    pipeline = load_app(str(Path(__file__).resolve().parent.parent / "examples" / "demo.py"))(
        rxstream.Context()
    )
    with pytest.raises(InvalidSample, match=r"for client stream 'pointer'$"):
        pipeline.feed("pointer", sample)
    assert pipeline.feed("pointer", (0.5, 0.5)) == 1


def test_huge_ints_are_refused_by_size(ctx: rxstream.Context) -> None:
    """An at_ms, a sample value or an item_size that is a huge int is refused, named by size."""
    limits = ClientStreamLimits(max_items=10, item_size=seconds, unit="seconds")
    pipeline = ctx.input("audio", limits, schema=int) | ctx.tap(lambda _: None)
    with pytest.raises(InvalidSample, match=r"^at_ms must be a finite .*, got <int of 16610 bits>"):
        pipeline.feed("audio", 1, 10**5000)
    with pytest.raises(InvalidSample, match=r"^item_size\(sample\) .*, got <int of 1329 bits> "):
        pipeline.feed("audio", 10**400)
    with_range = ctx.input("n", schema=Field(float, max=1)) | ctx.tap(lambda _: None)
    with pytest.raises(InvalidSample, match=r"^sample must be <= 1, got <int of 1329 bits> for "):
        with_range.feed("n", 10**400)
