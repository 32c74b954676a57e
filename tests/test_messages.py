"""Messages a new user met that read unclearly, each pinned as one line naming the stage or
field, the rule and the value: a rule the pipeline that ``build`` returned breaks (not "build
raised"), an unknown field of a doc, said in one form with a schema or defaults, and every
``--set`` refusal in one form (``refused:``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import rxstream
from rxstream import DocValidationError, cli


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- a rule the built pipeline breaks is not a raise of build -----------------------------------

READS_OFF_RANK_0 = """\
def build(ctx):
    pointer = ctx.input("pointer")
    world = ctx.source(range(3), name="world", reads=pointer, rank=1)
    return world | ctx.stream("video")
"""

REUSED_STAGE = """\
def build(ctx):
    twice = ctx.pipe(abs, name="twice")
    return ctx.source(range(3), name="a") | twice | twice | ctx.stream("video")
"""


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "readr1.py",
            READS_OFF_RANK_0,
            "source 'world' reads input 'pointer', whose samples arrive on rank 0 (the "
            "session's): place the source on rank 0, got rank=1",
        ),
        (
            "reused.py",
            REUSED_STAGE,
            "stage 'twice' (pipe) is used at two places in the pipeline; a stage object is one "
            "node: build another with ctx.pipe(...) (one upstream feeding two downstreams is a "
            "fan-out and needs no copy)",
        ),
    ],
)
def test_a_rule_the_returned_pipeline_breaks_is_said_as_the_rule_not_as_builds_raise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, said: str
) -> None:
    """A pipeline build returned that breaks a rule checked after it: the rule, no "raised"."""
    app = _write(tmp_path / name, text)
    assert cli.main(["run", app, "--ranks", "2", "--frames", "3"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"rxstream run: app {app!r}: {said}"]


# --- an unknown field of a doc: one form, a schema's or the defaults' ---------------------------


@dataclasses.dataclass
class _Prompted:
    prompt: str = "a cat"


@dataclasses.dataclass
class _Sectioned:
    vae: _Prompted = dataclasses.field(default_factory=_Prompted)


@pytest.mark.parametrize(
    ("made", "write", "message"),
    [
        (
            {"schema": _Prompted},
            {"promt": "a storm"},
            r"^control\.promt is not a field of the doc \(fields there: prompt\), got 'a storm'$",
        ),
        (
            {"defaults": {"prompt": "a cat"}},
            {"promt": "a storm"},
            r"^control\.promt is not a field of the doc \(fields there: prompt\), got 'a storm'$",
        ),
        (
            {"schema": _Sectioned},
            {"vae": {"promt": "a storm"}},
            r"^control\.vae\.promt is not a field of the doc \(fields there: prompt\), "
            r"got 'a storm'$",
        ),
    ],
)
def test_an_unknown_field_reads_alike_with_a_schema_or_defaults(
    ctx: rxstream.Context, made: dict[str, Any], write: dict[str, Any], message: str
) -> None:
    """A write to a field the doc has not names its dotted field and the fields there, alike."""
    doc = ctx.doc("control", **made)
    with pytest.raises(DocValidationError, match=message):
        doc.set(write)


# --- every --set refusal in one form ------------------------------------------------------------

FRAMES_APP = str(Path(__file__).resolve().parent / "apps" / "frames_app.py")


@pytest.mark.parametrize(
    ("setting", "line"),
    [
        ("gain=abc", "control.gain must be a number, got 'abc'"),
        ("size.height=7", "control.size: height and width must be even and >= 2, got 7x48"),
    ],
)
def test_a_set_that_cannot_be_typed_reads_as_one_the_doc_refuses(
    setting: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An untypable ``--set`` value says ``refused:`` as the doc's refusals do, exit 2."""
    assert cli.main(["run", FRAMES_APP, "--frames", "1", "--set", setting]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rxstream run: --set {setting}: refused: {line}"
    ]
