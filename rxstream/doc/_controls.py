"""What a UI needs to edit a doc: one :class:`Control` per leaf of its desired state.

A control's kind follows the leaf's current value and, with a dataclass schema, its
annotation: ``Literal[...]`` → ``choice``, ``bool`` → ``toggle``, ``int``/``float`` →
``number``, ``str`` → ``text``; anything else (lists, ``None``) → ``json``. A number's range
comes from the schema field's ``metadata`` (``field(default=0.5, metadata={"min": 0, "max":
1, "step": 0.05})``) or, without one, from its value: ``[0, 1]`` for a float in ``[0, 1)``,
else ``[0, 2 * value]`` (``[2 * value, -2 * value]`` below 0; an int's at least ``[0, 10]``).

A slider never moves the value it shows: a browser's range input snaps its value to ``min``
plus a whole multiple of ``step`` (in decimal), so the step is one the value lies on. A
declared ``step`` is kept when it does (the doc's rules put every value on it, within a
float's rounding); an int's step is 1; else it is a hundredth of the range, or the largest of
1, 2 or 5 times a power of ten below that, that puts both the value and ``max`` on the grid
(or the value alone), and ``None`` (the page's ``step="any"``) when none down to a millionth
of the range does.
The web page and the notebook widgets both build from this list.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from rxstream.doc._doc import Doc
from rxstream.doc._snapshot import thaw

__all__ = ["Control", "controls"]


@dataclass(frozen=True)
class Control:
    """One editable leaf of a doc."""

    path: str
    """The dotted path (``vae.model``)."""
    kind: Literal["number", "toggle", "choice", "text", "json"]
    """Which widget edits it."""
    value: Any
    """Its value now."""
    integer: bool = False
    """A number that must stay an int."""
    minimum: float | None = None
    """A number's lower bound (for a slider)."""
    maximum: float | None = None
    """A number's upper bound."""
    step: float | None = None
    """A number's slider step, one the value lies on (``None``: any value, ``step="any"``)."""
    choices: tuple[Any, ...] = ()
    """A choice's options."""

    def to_json(self) -> dict[str, Any]:
        """The control as plain JSON-able data."""
        return {
            "path": self.path,
            "kind": self.kind,
            "value": self.value,
            "integer": self.integer,
            "min": self.minimum,
            "max": self.maximum,
            "step": "any" if self.step is None and self.kind == "number" else self.step,
            "choices": list(self.choices),
        }


def controls(doc: Doc) -> list[Control]:
    """The controls of ``doc``'s current state, leaves in document order."""
    schema = doc.schema if isinstance(doc.schema, type) else None
    out: list[Control] = []
    _walk(thaw(doc.snapshot()), (), schema, out)
    return out


def _walk(
    state: Mapping[str, Any], path: tuple[str, ...], schema: type | None, out: list[Control]
) -> None:
    hints: dict[str, Any] = {}
    meta: dict[str, Mapping[str, Any]] = {}
    if schema is not None and dataclasses.is_dataclass(schema):
        hints = typing.get_type_hints(schema)
        meta = {f.name: f.metadata for f in dataclasses.fields(schema)}
    for key, value in state.items():
        here = (*path, key)
        hint = hints.get(key)
        if isinstance(value, Mapping):
            sub = hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None
            _walk(value, here, sub, out)
            continue
        out.append(_control(".".join(here), value, hint, meta.get(key, {})))


def _control(path: str, value: Any, hint: Any, meta: Mapping[str, Any]) -> Control:
    if get_origin(hint) is Literal:
        return Control(path, "choice", value, choices=get_args(hint))
    if "choices" in meta:
        return Control(path, "choice", value, choices=tuple(meta["choices"]))
    if isinstance(value, bool):
        return Control(path, "toggle", value)
    if isinstance(value, int | float):
        integer = isinstance(value, int) and hint is not float
        low, high = _range(float(value), integer)
        low = float(meta.get("min", low))
        high = float(meta.get("max", high))
        return Control(
            path, "number", value, integer, low, high, _step(value, low, high, meta.get("step"))
        )
    if isinstance(value, str):
        return Control(path, "text", value)
    return Control(path, "json", value)


def _step(value: float, low: float, high: float, declared: float | None) -> float | None:
    """A slider step from ``low`` that ``value`` lies on exactly, in a browser's decimal
    arithmetic (see the module docstring); ``None`` for any value."""
    if declared is not None:
        return float(declared) if _on(value, low, declared) else None
    if isinstance(value, int):
        return 1.0 if _on(value, low, 1) else None
    span = high - low
    if not span > 0:
        return None
    exponent = math.floor(math.log10(span / 100))
    candidates = [span / 100] + [
        float(f"{mantissa}e{power}")
        for power in range(exponent, exponent - 6, -1)
        for mantissa in (5, 2, 1)
        if float(f"{mantissa}e{power}") <= span / 100
    ]
    for step in candidates:
        if _on(value, low, step) and _on(high, low, step):
            return step
    return next((step for step in candidates if _on(value, low, step)), None)


def _on(value: float, low: float, step: float) -> bool:
    """Whether ``value`` is ``low`` plus a whole multiple of ``step``, exactly, in decimal
    (how a page's range input reads the numbers JSON gives it)."""
    offset = _decimal(value) - _decimal(low)
    try:
        return offset % _decimal(step) == 0
    except decimal.InvalidOperation:  # more steps than 28 digits count: off any fine grid
        return False


def _decimal(number: float) -> decimal.Decimal:
    """``number`` as the decimal its shortest text says (what JSON and JavaScript print)."""
    return decimal.Decimal(repr(float(number)))


def _range(default: float, integer: bool) -> tuple[float, float]:
    if not integer and 0.0 <= default < 1.0:
        return 0.0, 1.0
    if default < 0:
        return 2 * default, -2 * default
    return 0.0, max(10.0 if integer else 1.0, 2 * default)
