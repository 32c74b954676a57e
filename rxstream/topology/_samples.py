"""What a client stream's samples must look like: ``ctx.input(name, schema=…)``.

A schema is checked at ``feed``, before the sample is charged to a limit or given an
``input_seq``; a sample that fails is refused with :class:`InvalidSample` naming the stream, the
place in the sample, the rule and the value, and never reaches a stage. A schema is one of:

- a type: ``float`` (an ``int`` too, never a ``bool``; finite), ``int`` (not a ``bool``),
  ``bool``, ``str`` (valid Unicode), ``bytes``, ``None``, or any class (``isinstance``);
- a :class:`Field`: a type with bounds (``Field(float, min=0, max=1)``; ``finite=False`` lets
  NaN and ±Infinity through; ``max_len`` bounds a ``str``, ``bytes``, ``list`` or ``tuple``);
- ``Literal["a", "b"]``: one of the choices;
- a tuple of schemas: a sequence (tuple or list) of exactly that length, each item checked;
- a dict of key to schema: a mapping with exactly those keys, each value checked;
- a one-item list ``[schema]``: a list or tuple of any length, each item checked;
- any other callable: a validator, ``validator(sample)``; returning ``False`` or raising
  ``ValueError``/``TypeError`` refuses the sample (the exception's text says why).

The schema is compiled once into a checker; the per-sample path makes no decisions about the
schema's shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from rxstream._exceptions import StageBuildError, shown
from rxstream._util import lone_surrogate
from rxstream.topology._limits import NO_VALUE, InvalidSample

__all__ = ["Field", "SampleCheck", "check_sample", "compile_schema"]

SampleCheck = Callable[[Any], None]
"""A compiled schema: raises :class:`_Bad` for a sample that does not fit."""


@dataclass(frozen=True, kw_only=True)
class Field:
    """A typed value of a sample, with bounds; ``None`` is unbounded.

    ``min``/``max`` bound a number (inclusive); ``finite`` refuses NaN and ±Infinity for a
    ``float`` (the default); ``max_len`` bounds the length of a ``str``, ``bytes``, ``list`` or
    ``tuple``.
    """

    type: type = field(default=float, kw_only=False)
    min: float | None = None
    max: float | None = None
    finite: bool = True
    max_len: int | None = None


class _Bad(Exception):
    """A sample that does not fit: where (a path of indexes and keys), the rule, the value
    (``NO_VALUE`` for a rule about a key)."""

    def __init__(self, path: tuple[Any, ...], rule: str, value: Any) -> None:
        super().__init__(rule)
        self.path = path
        self.rule = rule
        self.value = value


def check_sample(stream: str, check: SampleCheck, sample: Any) -> None:
    """Run ``check`` over ``sample``; :class:`InvalidSample` naming ``stream`` if it fails."""
    try:
        check(sample)
    except _Bad as bad:
        where = "sample" + "".join(f"[{shown(step)}]" for step in bad.path)
        raise InvalidSample(stream, where, bad.rule, bad.value) from None


def compile_schema(schema: object, stream: str) -> SampleCheck:
    """The checker for ``schema`` (see the module docstring); a :class:`StageBuildError`
    naming the stream for a schema that is none of those."""
    if schema is None or schema is type(None):
        return _field_check(Field(type(None)))
    if isinstance(schema, Field):
        return _field_check(schema)
    if isinstance(schema, type):
        return _field_check(Field(schema))
    if get_origin(schema) is Literal:
        return _choice_check(get_args(schema))
    if isinstance(schema, tuple):
        return _tuple_check([compile_schema(s, stream) for s in schema])
    if isinstance(schema, dict):
        return _dict_check({key: compile_schema(s, stream) for key, s in schema.items()})
    if isinstance(schema, list) and len(schema) == 1:
        return _list_check(compile_schema(schema[0], stream))
    if callable(schema):
        return _validator_check(schema)
    raise StageBuildError(
        "schema must be a type, a Field, a Literal, a tuple, a dict, a one-item list or a "
        f"callable validator, got {schema!r} for input {stream!r}"
    )


def _inside(step: Any, check: SampleCheck, value: Any) -> None:
    """``check(value)`` for the item at ``step`` of a container: a failure names the step."""
    try:
        check(value)
    except _Bad as bad:
        bad.path = (step, *bad.path)
        raise


def _field_check(spec: Field) -> SampleCheck:
    kind = spec.type
    rule = "must be None" if kind is type(None) else f"must be {_a(kind.__name__)}"
    numeric = kind in (int, float)
    low, high = spec.min, spec.max
    finite = spec.finite and kind is float
    max_len = spec.max_len

    def check(value: Any) -> None:
        if kind is float:
            fits = isinstance(value, int | float) and not isinstance(value, bool)
        elif kind is int:
            fits = isinstance(value, int) and not isinstance(value, bool)
        else:
            fits = isinstance(value, kind)
        if not fits:
            raise _Bad((), rule, value)
        if finite and isinstance(value, float) and not math.isfinite(value):
            raise _Bad((), "must be a finite number", value)
        if numeric:
            if low is not None and not value >= low:
                raise _Bad((), f"must be >= {low:g}", value)
            if high is not None and not value <= high:
                raise _Bad((), f"must be <= {high:g}", value)
        if isinstance(value, str) and lone_surrogate(value) is not None:
            raise _Bad((), "must be valid Unicode (no lone surrogate)", value)
        if max_len is not None and len(value) > max_len:
            raise _Bad((), f"must be at most {max_len} long", value)

    return check


def _choice_check(choices: tuple[Any, ...]) -> SampleCheck:
    rule = "must be one of " + ", ".join(repr(c) for c in choices)

    def check(value: Any) -> None:
        # a bool is not the choice 1 (nor 0 the choice False)
        if not any(type(value) is type(c) and value == c for c in choices):
            raise _Bad((), rule, value)

    return check


def _tuple_check(items: list[SampleCheck]) -> SampleCheck:
    count = len(items)

    def check(value: Any) -> None:
        if not isinstance(value, tuple | list) or len(value) != count:
            raise _Bad((), f"must be a sequence of {count}", value)
        for index, (item, inner) in enumerate(zip(items, value, strict=True)):
            _inside(index, item, inner)

    return check


def _dict_check(fields: dict[Any, SampleCheck]) -> SampleCheck:
    keys = ", ".join(repr(key) for key in fields)

    def check(value: Any) -> None:
        if not isinstance(value, Mapping):
            raise _Bad((), f"must be a mapping with keys {keys}", value)
        for key in value:
            if key not in fields:
                raise _Bad((key,), f"is not a key of the sample (keys: {keys})", NO_VALUE)
        for key, item in fields.items():
            if key not in value:
                raise _Bad((key,), "is missing", NO_VALUE)
            _inside(key, item, value[key])

    return check


def _list_check(element: SampleCheck) -> SampleCheck:
    def check(value: Any) -> None:
        if not isinstance(value, tuple | list):
            raise _Bad((), "must be a list", value)
        for index, inner in enumerate(value):
            _inside(index, element, inner)

    return check


def _validator_check(validator: Callable[[Any], Any]) -> SampleCheck:
    label = getattr(validator, "__qualname__", None) or repr(validator)

    def check(value: Any) -> None:
        try:
            verdict = validator(value)
        except (ValueError, TypeError) as exc:
            raise _Bad((), f"is refused by {label}: {exc}", value) from None
        if verdict is False:
            raise _Bad((), f"is refused by {label}", value)

    return check


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"
