"""doc.controls: one editable control per leaf, kinds and ranges from values and schema."""

from __future__ import annotations

import dataclasses
from typing import Literal

import rxstream
from rxstream.doc import Control, controls


@dataclasses.dataclass
class Vae:
    model: Literal["smooth", "sharp"] = "smooth"


@dataclasses.dataclass
class World:
    prompt: str = "sea"
    speed: float = dataclasses.field(default=1.0, metadata={"min": 0.5, "max": 4.0, "step": 0.5})
    steps: int = 8
    lit: bool = True
    vae: Vae = dataclasses.field(default_factory=Vae)


def test_schema_kinds_ranges_and_choices() -> None:
    """A dataclass schema gives choices for Literal and ranges from field metadata."""
    doc = rxstream.Context().doc("world", schema=World)
    by_path = {c.path: c for c in controls(doc)}
    assert list(by_path) == ["prompt", "speed", "steps", "lit", "vae.model"]
    assert by_path["prompt"].kind == "text"
    assert by_path["speed"] == Control("speed", "number", 1.0, False, 0.5, 4.0, 0.5)
    assert by_path["steps"].integer
    assert (by_path["steps"].minimum, by_path["steps"].maximum) == (0.0, 16.0)
    assert by_path["lit"].kind == "toggle"
    assert by_path["vae.model"].kind == "choice"
    assert by_path["vae.model"].choices == ("smooth", "sharp")


def test_defaults_only_and_current_values() -> None:
    """Without a schema kinds follow the values, and a control shows the value now."""
    doc = rxstream.Context().doc("control", defaults={"gain": 0.5, "tags": ["a"], "n": -3})
    doc.set(gain=0.25)
    by_path = {c.path: c for c in controls(doc)}
    assert by_path["gain"].value == 0.25
    assert (by_path["gain"].minimum, by_path["gain"].maximum) == (0.0, 1.0)
    assert by_path["tags"].kind == "json"
    assert (by_path["n"].minimum, by_path["n"].maximum) == (-6.0, 6.0)
    assert by_path["gain"].to_json()["min"] == 0.0
