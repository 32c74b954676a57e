"""A schema field's ``metadata`` rules (min, max, step, choices) hold on every write and shape
a slider that never moves the value; a self test's writes leave no trace in the run after it."""

from __future__ import annotations

import asyncio
import decimal
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _serving import Served, texts_until

import rxstream
from rxstream import cli
from rxstream._exceptions import ArgumentError, ArgumentTypeError, DocValidationError, SettingError
from rxstream.doc import controls
from rxstream.doc._validate import on_grid
from rxstream.ranks._app import AppContext
from rxstream.transport import WebTransport

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "rxstream" / "transport" / "static" / "index.html"


@dataclass
class Look:
    """A section with a rule of its own."""

    zoom: int = field(default=2, metadata={"min": 1, "max": 8, "step": 1})


@dataclass
class Rules:
    """A schema whose fields declare rules in their metadata."""

    speed: float = field(default=1.0, metadata={"min": 0, "max": 3})
    gain: float = field(default=1.0, metadata={"min": 0.5, "max": 4.0, "step": 0.5})
    fine: float = field(default=0.3, metadata={"step": 0.1})
    mode: str = field(default="calm", metadata={"choices": ["calm", "storm"]})
    limit: float | None = field(default=None, metadata={"min": 0})
    look: Look = field(default_factory=Look)


def rules_doc(ctx: rxstream.Context | None = None) -> rxstream.Doc:
    """The control doc of ``Rules`` in ``ctx`` (a fresh context by default)."""
    return (ctx or rxstream.Context()).doc("control", schema=Rules)


# --- the rules, on every write ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"speed": 9}, r"control\.speed must be <= 3 \(schema max\), got 9"),
        ({"speed": -0.5}, r"control\.speed must be >= 0 \(schema min\), got -0\.5"),
        (
            {"gain": 0.7},
            r"control\.gain must be 0\.5 plus a whole multiple of 0\.5 \(schema step\), got 0\.7",
        ),
        (
            {"fine": 0.25},
            r"control\.fine must be a whole multiple of 0\.1 \(schema step\), got 0\.25",
        ),
        (
            {"mode": "gale"},
            r"control\.mode must be one of 'calm', 'storm' \(schema choices\), got 'gale'",
        ),
        ({"limit": -1}, r"control\.limit must be >= 0 \(schema min\), got -1"),
        ({"look": {"zoom": 9}}, r"control\.look\.zoom must be <= 8 \(schema max\), got 9"),
    ],
)
def test_set_refuses_what_the_metadata_forbids(changes: dict[str, Any], message: str) -> None:
    """doc.set refuses a value outside min/max, off the step grid or not a choice; no change."""
    doc = rules_doc()
    with pytest.raises(DocValidationError, match=rf"^{message}$"):
        doc.set(changes)
    assert doc.version == 0
    assert doc.desired.speed.value == 1.0


def test_values_on_the_rules_are_taken() -> None:
    """Bounds are inclusive, a float a rounding off the grid is on it, None skips number rules."""
    doc = rules_doc()
    doc.set(speed=3, gain=4.0, fine=0.1 * 3, mode="storm", limit=None, look={"zoom": 8})
    doc.set(speed=0, gain=0.5, fine=-0.2, limit=0.0, look={"zoom": 1})
    assert doc.desired.speed.value == 0.0
    assert doc.version == 2


def test_steer_and_update_refuse_and_start_no_generation() -> None:
    """doc.steer and pipeline.update meet the same rules; a refused one starts no generation."""
    ctx = rxstream.Context()
    doc = rules_doc(ctx)
    pipeline = ctx.source([1]) | ctx.stream("out")
    with pytest.raises(
        DocValidationError, match=r"^control\.speed must be <= 3 \(schema max\), got 4$"
    ):
        doc.steer(speed=4)
    with pytest.raises(
        DocValidationError, match=r"^control\.speed must be <= 3 \(schema max\), got 5$"
    ):
        pipeline.update(speed=5)
    with pytest.raises(
        DocValidationError, match=r"^control\.speed must be <= 3 \(schema max\), got 6$"
    ):
        pipeline.start(speed=6)
    assert ctx.generations.state().prompt == 0
    assert doc.version == 0


def test_nan_is_outside_any_bound() -> None:
    """A field that takes non-finite floats still refuses NaN when it declares a bound."""

    @dataclass
    class Loose:
        x: float = field(default=1.0, metadata={"min": 0, "finite": False})

    doc = rxstream.Context().doc("control", schema=Loose)
    doc.set(x=float("inf"))
    with pytest.raises(
        DocValidationError, match=r"^control\.x must be >= 0 \(schema min\), got nan$"
    ):
        doc.set(x=float("nan"))


@pytest.mark.parametrize(
    ("value", "base", "step", "on"),
    [
        (0.1 * 3, 0, 0.1, True),
        (1e308, 0, 0.5, True),
        (1e12 + 0.1, 0, 0.1, True),
        (1e12 + 0.05, 0, 0.1, False),
        (0.7, 0.5, 0.5, False),
        (7, 1, 3, True),
        (8, 1, 3, False),
        (float("inf"), 0, 1.0, False),
    ],
)
def test_the_step_rule_is_exact_but_for_float_rounding(
    value: float, base: float, step: float, on: bool
) -> None:
    """on_grid allows a float's rounding, near zero and far from it, and nothing more."""
    assert on_grid(value, base, step) is on


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ({"speed": 9.0}, r"control\.speed must be <= 3 \(schema max\), got 9\.0"),
        (
            {"mode": "gale"},
            r"control\.mode must be one of 'calm', 'storm' \(schema choices\), got 'gale'",
        ),
    ],
)
def test_defaults_meet_the_rules_when_the_doc_is_made(
    defaults: dict[str, Any], message: str
) -> None:
    """defaults= (and a dataclass's own defaults) that break a rule refuse to make the doc."""
    with pytest.raises(DocValidationError, match=rf"^{message}$"):
        rxstream.Context().doc("control", defaults=defaults, schema=Rules)


def test_a_dataclass_default_off_its_own_step_is_refused() -> None:
    """A schema whose own default breaks its step rule is refused as the doc is made."""

    @dataclass
    class OffGrid:
        speed: float = field(default=1.0, metadata={"min": 0.25, "step": 0.5})

    with pytest.raises(
        DocValidationError,
        match=r"^control\.speed must be 0\.25 plus a whole multiple of 0\.5 \(schema step\), "
        r"got 1\.0$",
    ):
        rxstream.Context().doc("control", schema=OffGrid)


@pytest.mark.parametrize(
    ("meta", "error", "message"),
    [
        ({"min": "0"}, ArgumentTypeError, r"Bad\.x's metadata min must be a number, got '0'"),
        ({"max": float("inf")}, ArgumentError, r"Bad\.x's metadata max must be finite, got inf"),
        (
            {"min": 2, "max": 1},
            ArgumentError,
            r"Bad\.x's metadata min must be <= max, got min=2 max=1",
        ),
        ({"step": 0}, ArgumentError, r"Bad\.x's metadata step must be > 0, got 0"),
        (
            {"choices": "ab"},
            ArgumentTypeError,
            r"Bad\.x's metadata choices must be a non-empty list of values, got 'ab'",
        ),
    ],
)
def test_metadata_that_cannot_be_a_rule_is_refused(
    meta: dict[str, Any], error: type[Exception], message: str
) -> None:
    """A rule in metadata that makes no sense is refused when the doc is made, naming it."""

    @dataclass
    class Bad:
        x: float = field(default=1.0, metadata=meta)

    with pytest.raises(error, match=rf"^{message} for doc 'control'$"):
        rxstream.Context().doc("control", schema=Bad)


def test_set_on_the_command_line_meets_the_rules() -> None:
    """--set speed=9 is refused naming the setting, the field, the rule and the value."""
    ctx = AppContext(settings=["speed=9"])
    with pytest.raises(
        SettingError,
        match=r"^--set speed=9: refused: control\.speed must be <= 3 \(schema max\), got 9\.0$",
    ):
        rules_doc(ctx)


RULES_APP = """\
from dataclasses import dataclass, field

import rxstream


@dataclass
class Control:
    speed: float = field(default=1.0, metadata={"min": 0, "max": 3})


def build(ctx):
    ctx.doc("control", schema=Control)
    return ctx.source(range(3)) | ctx.stream("out")
"""


def test_run_set_out_of_range_exits_2_naming_the_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rxstream run --set speed=9` on a max-3 field exits 2 with the rule, before anything runs."""
    app = tmp_path / "rules_app.py"
    app.write_text(RULES_APP)
    assert cli.main(["run", str(app), "--frames", "1", "--set", "speed=9"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "rxstream run: --set speed=9: refused: control.speed must be <= 3 (schema max), got 9.0"
    )


class RulesSession(Served):
    """The Rules doc behind a WebTransport on a free port, run by ``run()``."""

    def __init__(self) -> None:
        web = WebTransport(port=0, grace_s=0.1)
        ctx = rxstream.Context(transport=web)
        self.doc = rules_doc(ctx)
        super().__init__(web, ctx.input("pointer") | ctx.stream("out"))


@pytest.fixture
def rules_session() -> Iterator[RulesSession]:
    with RulesSession() as running:
        yield running


def test_a_page_write_meets_the_rules(rules_session: RulesSession) -> None:
    """A page's set past a max is answered with the rule; the doc is unchanged."""
    import aiohttp

    url = rules_session.web.url.replace("http", "ws", 1).replace("/?", "/ws?", 1)

    async def check() -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
            await ws.send_str(json.dumps({"type": "hello", "accept": ["jpeg"]}))
            await texts_until(ws, "session")
            await ws.send_str(json.dumps({"type": "set", "changes": {"speed": 9}, "id": 1}))
            return await texts_until(ws, "error")

    error = asyncio.run(check())
    assert (error["code"], error["error"]) == (
        "schema",
        "control.speed must be <= 3 (schema max), got 9",
    )
    assert rules_session.doc.version == 0


# --- the slider keeps the value -----------------------------------------------------------------


def on_slider_grid(value: float | None, low: float | None, step: float | None) -> bool:
    """Whether a browser's range input keeps ``value`` (it snaps to ``min + k * step`` in
    decimal, reading the numbers as JSON prints them)."""
    assert value is not None
    assert low is not None
    assert step is not None
    offset = decimal.Decimal(repr(float(value))) - decimal.Decimal(repr(float(low)))
    return offset % decimal.Decimal(repr(float(step))) == 0


def test_the_slider_step_keeps_a_default_of_1_in_0_to_3() -> None:
    """min 0, max 3, default 1.0: the step puts 1.0 and 3 on the grid (not 0.03: 0.99)."""
    (speed,) = (c for c in controls(rules_doc()) if c.path == "speed")
    assert (speed.minimum, speed.maximum, speed.step) == (0.0, 3.0, 0.02)
    assert on_slider_grid(speed.value, speed.minimum, speed.step)
    assert on_slider_grid(speed.maximum, speed.minimum, speed.step)


SLIDER_CASES = [
    (value, bounds)
    for value in (1.0, 0.37, 2.5, 7.3, -1.7, 0.05, 123.0, 0.999)
    for bounds in ({}, {"min": 0, "max": 3}, {"min": -2, "max": 200})
    if bounds.get("min", value) <= value <= bounds.get("max", value)
]


@pytest.mark.parametrize(("value", "bounds"), SLIDER_CASES)
def test_the_slider_step_never_moves_the_value(value: float, bounds: dict[str, float]) -> None:
    """Whatever the range, the computed step puts the value on the slider's grid."""
    doc = rxstream.Context().doc("control", schema=_schema(value, bounds))
    (control,) = controls(doc)
    assert control.minimum is not None
    assert control.maximum is not None
    assert control.step is not None
    assert control.step <= (control.maximum - control.minimum) / 100
    assert on_slider_grid(value, control.minimum, control.step)


def _schema(value: float, bounds: dict[str, float]) -> type:
    @dataclass
    class One:
        x: float = field(default=value, metadata=bounds)

    return One


def test_a_declared_step_is_kept_and_an_off_grid_value_gets_any() -> None:
    """A declared step stays; a value no fine step holds gets step "any" on the page."""
    doc = rxstream.Context().doc("control", defaults={"x": 0.123456789})
    (control,) = controls(doc)
    assert control.step is None
    assert control.to_json()["step"] == "any"
    (gain,) = (c for c in controls(rules_doc()) if c.path == "gain")
    assert gain.to_json()["step"] == 0.5


def test_the_page_takes_the_step_as_given() -> None:
    """The page's range input uses the control's min, max and step as sent (no step of its own)."""
    page = PAGE.read_text()
    assert (
        'type: "range", min: control.min, max: control.max, step: control.step, '
        "value: control.value" in page
    )


# --- the self test leaves no trace ------------------------------------------------------------


@dataclass
class Speed:
    """A control doc with one rule-bound field."""

    speed: float = field(default=1.0, metadata={"min": 0, "max": 3})


def test_self_test_writes_do_not_carry_into_the_run() -> None:
    """--set speed=2, then a self test that sets, steers and flushes: the run starts at speed 2,
    at the doc version and the generations it had before the block."""
    ctx = AppContext(settings=["speed=2"])
    doc = ctx.doc("control", schema=Speed)
    pipeline = (
        ctx.source(range(3))
        | ctx.pipe(lambda i: doc.desired.speed.value, name="read")
        | ctx.stream("out")
    )
    before = (doc.version, ctx.generations.state())
    with ctx.self_test():
        doc.set(speed=1)
        pipeline.update(speed=1.5)
        pipeline.flush()
        assert pipeline.drive(frames=1) == [1.5]
        assert ctx.generations.state().prompt == 1
    assert doc.desired.speed.value == 2.0
    assert (doc.version, ctx.generations.state()) == before
    items = pipeline.drive(frames=2, items=True)
    assert [item.payload for item in items] == [2.0, 2.0]
    assert {(i.metadata.prompt_generation, i.metadata.flush_generation) for i in items} == {(0, 0)}


def failing_self_test(ctx: rxstream.Context, doc: rxstream.Doc) -> None:
    """A self test that steers, then fails."""
    with ctx.self_test():
        doc.steer(speed=3)
        raise AssertionError("wrong")


def test_a_failed_self_test_leaves_no_trace_either() -> None:
    """A block that raises still puts the docs and generations back."""
    ctx = rxstream.Context()
    doc = ctx.doc("control", schema=Speed)
    with pytest.raises(rxstream.SelfTestError, match=r"^self test failed: AssertionError: wrong$"):
        failing_self_test(ctx, doc)
    assert (doc.desired.speed.value, doc.version, ctx.generations.state().prompt) == (1.0, 0, 0)


def test_a_rebuild_the_self_test_failed_leaves_no_bind_failure() -> None:
    """A doc.bind rebuild that failed inside the block is the check's: doc.errors is as before."""
    ctx = rxstream.Context()
    doc = ctx.doc("control", defaults={"model": "good"})

    def construct(d: Any) -> rxstream.Stage:
        if d.model.value == "bad":
            raise ValueError("no such model")
        return ctx.pipe(lambda x: x)

    pipeline = ctx.source(range(10)) | doc.bind(construct, [doc.desired.model]) | ctx.stream("s")
    with ctx.self_test():
        pipeline.drive(frames=1)
        doc.set(model="bad")
        pipeline.drive(frames=1)
        assert len(doc.errors) == 1
    assert doc.errors == []


def test_a_doc_made_in_the_self_test_goes_back_to_how_it_was_made() -> None:
    """A doc made inside the block keeps its made state (with --set) after it, not its writes."""
    ctx = AppContext(settings=["speed=2"])
    with ctx.self_test():
        doc = ctx.doc("control", schema=Speed)
        made = doc.version
        doc.set(speed=0.5)
        with ctx.self_test():
            doc.set(speed=0.25)
        assert doc.desired.speed.value == 0.5
    assert (doc.desired.speed.value, doc.version) == (2.0, made)


SELF_TEST_APP = """\
import json
from dataclasses import dataclass, field

import rxstream


@dataclass
class Control:
    speed: float = field(default=1.0, metadata={"min": 0, "max": 3})
    report: str = ""
    split: bool = False


def compose(ctx):
    doc = ctx.doc("control", schema=Control)

    def read(item):
        meta = item.metadata
        if not ctx.self_testing:
            with open(doc.desired.report.value, "a") as out:
                row = [
                    ctx.rank, doc.desired.speed.value, meta.prompt_generation, meta.flush_generation
                ]
                out.write(json.dumps(row) + "\\n")
        return item

    rank = 1 if doc.desired.split.value else 0
    return doc, ctx.source(range(100)) | ctx.pipe(read, items=True, rank=rank) | ctx.stream("out")


def check(ctx, doc, pipeline):
    with ctx.self_test():
        doc.set(speed=1)
        pipeline.update(speed=0.5)
        pipeline.flush()
        pipeline.drive(frames=2)


def build(ctx):
    doc, pipeline = compose(ctx)
    check(ctx, doc, pipeline)
    return pipeline


async def main(ctx):
    doc, pipeline = compose(ctx)
    check(ctx, doc, pipeline)
    await pipeline.run()
"""


@pytest.mark.parametrize("entry", ["build", "main"])
def test_run_after_a_self_test_starts_from_the_set_values(
    entry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rxstream run --set speed=2 --frames 3`, a self test writing speed and steering: every
    item of the run reads speed 2 at generation 0 (a build app and a main app alike)."""
    assert run_self_test_app(tmp_path, entry, capsys) == {(0, 2.0, 0, 0)}


@pytest.mark.slow
def test_a_rank_1_stage_after_a_self_test_starts_from_the_set_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On two ranks (the self test runs on both), the rank 1 stage reads speed 2 at
    generation 0 too."""
    rows = run_self_test_app(tmp_path, "build", capsys, "--ranks", "2", "--set", "split=true")
    assert rows == {(1, 2.0, 0, 0)}


def run_self_test_app(
    tmp_path: Path, entry: str, capsys: pytest.CaptureFixture[str], *flags: str
) -> set[tuple[Any, ...]]:
    """`rxstream run` SELF_TEST_APP's ``entry`` with --frames 3 --set speed=2 and ``flags``;
    the distinct (rank, speed, prompt generation, flush generation) its items read."""
    app = tmp_path / f"self_test_app_{entry}.py"
    app.write_text(SELF_TEST_APP)
    report = tmp_path / "rows.jsonl"
    args = ["run", f"{app}:{entry}", "--frames", "3", "--set", "speed=2"]
    assert cli.main([*args, "--set", f"report={report}", *flags]) == 0, capsys.readouterr().err
    rows = [tuple(json.loads(line)) for line in report.read_text().splitlines()]
    assert len(rows) >= 3
    return set(rows)
