"""How a write is checked before it becomes the new state.

Three kinds of rule, chosen once per doc:

- no schema: the defaults fix the shape. A write may only name keys the defaults have
  (when there are defaults), a section stays a section, and a value keeps its default's type
  (an int is accepted where the default is a float; a default of ``None`` takes anything).
- a dataclass schema: the whole merged state must build the dataclass (nested dataclasses
  for sections); each field's annotation is checked (plain types, ``X | None``, ``Literal``,
  ``list``/``dict``/``tuple``), then its ``__post_init__`` runs, where a ``ValueError`` states
  any further rule. Without ``defaults`` the dataclass's defaults are the defaults.
- a callable: ``schema(state)`` gets the merged state as a plain dict and raises
  ``ValueError``/``TypeError`` to refuse it.

Under every kind, two rules hold for each value written (in sections, lists and dicts too):
a string is valid Unicode (no lone surrogate: it must encode to UTF-8), and a float is finite
(no NaN, no ±Infinity) unless its field says otherwise: a dataclass field's
``metadata={"finite": False}``, or without a schema a default that is not finite itself. A
float field stores a float: an int written there is stored as ``float(value)``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Literal, Union, get_args, get_origin

from rxstream._exceptions import ArgumentError, ArgumentTypeError, DocValidationError, shown
from rxstream._util import lone_surrogate

__all__ = ["STEP_TOLERANCE", "Validator", "defaults_from_schema", "make_validator", "on_grid"]

Validator = Callable[[Mapping[str, Any], MutableMapping[str, Any]], None]
"""``validate(changes, merged)``: raise :class:`DocValidationError` to refuse a write.

It stores an int written to a float field as a float, in ``merged`` (the state to be)."""


def make_validator(name: str, defaults: Mapping[str, Any], schema: object) -> Validator:
    """The validator for a doc named ``name`` (see the module docstring)."""
    if schema is None:
        return lambda changes, merged: _check_shape(name, defaults, changes, merged, ())
    if isinstance(schema, type) and dataclasses.is_dataclass(schema):
        _check_rules(name, schema, ())
        return lambda changes, merged: _check_dataclass(name, schema, merged, ())
    if callable(schema):
        return lambda changes, merged: _check_callable(name, schema, merged)
    raise ArgumentTypeError(
        f"schema must be a dataclass or a callable validator, got {type(schema).__name__} "
        f"for doc {name!r}"
    )


def defaults_from_schema(name: str, schema: object) -> dict[str, Any]:
    """The defaults a dataclass schema declares (every field needs one)."""
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return {}
    try:
        instance = schema()
    except TypeError as exc:
        raise ArgumentTypeError(
            f"a dataclass schema without defaults= needs a default for every field ({exc}) "
            f"for doc {name!r}"
        ) from None
    return dataclasses.asdict(instance)


def _dotted(name: str, path: tuple[str, ...]) -> str:
    return ".".join((name, *path))


def check_value(name: str, path: tuple[str, ...], value: Any, *, finite: bool = True) -> None:
    """Refuse a string that is not valid Unicode, or a float that is not finite (unless
    ``finite`` is false), anywhere in ``value`` (sections, lists and dicts included)."""
    if isinstance(value, str):
        at = lone_surrogate(value)
        if at is not None:
            raise DocValidationError(
                f"{_dotted(name, path)} must be valid Unicode (no lone surrogate), "
                f"got {shown(value)} (surrogates not allowed at index {at})"
            )
    elif isinstance(value, float):
        if finite and not math.isfinite(value):
            raise DocValidationError(
                f"{_dotted(name, path)} must be a finite number (declare "
                f'metadata={{"finite": False}} to allow it), got {shown(value)}'
            )
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            check_value(name, path, key, finite=finite)
            check_value(name, (*path, str(key)), inner, finite=finite)
    elif isinstance(value, list | tuple):
        for index, inner in enumerate(value):
            check_value(name, (*path, str(index)), inner, finite=finite)


def _as_float(name: str, path: tuple[str, ...], value: int) -> float:
    """``value`` as the float a float field stores; refused when no float holds it."""
    try:
        return float(value)
    except OverflowError:
        raise DocValidationError(
            f"{_dotted(name, path)} must be a number a float holds, "
            f"got an int of {value.bit_length()} bits"
        ) from None


def _check_shape(
    name: str,
    defaults: Mapping[str, Any],
    changes: Mapping[str, Any],
    merged: MutableMapping[str, Any],
    path: tuple[str, ...],
) -> None:
    for key, value in changes.items():
        here = (*path, key)
        check_value(name, path, key)
        if defaults and key not in defaults:
            keys = ", ".join(sorted(defaults))
            raise DocValidationError(
                f"{_dotted(name, here)} is not a field of the doc (fields there: {keys}), "
                f"got {shown(value)}"
            )
        default = defaults.get(key)
        if isinstance(default, Mapping):
            if not isinstance(value, Mapping):
                raise DocValidationError(
                    f"{_dotted(name, here)} is a section and takes a mapping, got {shown(value)}"
                )
            section = merged.get(key)
            _check_shape(name, default, value, section if isinstance(section, dict) else {}, here)
            continue
        if key in defaults and default is not None and not _same_kind(value, default):
            raise DocValidationError(
                f"{_dotted(name, here)} must be {_a(type(default).__name__)} like its default "
                f"{default!r}, got {shown(value)}"
            )
        # a default that is not finite itself declares a field that takes any float
        finite = not (isinstance(default, float) and not math.isfinite(default))
        check_value(name, here, value, finite=finite)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            merged[key] = _as_float(name, here, value)


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _check_dataclass(
    name: str, schema: type, state: MutableMapping[str, Any], path: tuple[str, ...]
) -> Any:
    hints = typing.get_type_hints(schema)
    fields = {field.name: field for field in dataclasses.fields(schema)}
    for key in state:
        if key not in fields:
            raise DocValidationError(
                f"{_dotted(name, (*path, key))} is not a field of the doc "
                f"(fields there: {', '.join(sorted(fields))}), got {shown(state[key])}"
            )
    kwargs = {}
    for key, value in state.items():
        hint = hints.get(key, Any)
        here = (*path, key)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, Mapping):
                raise DocValidationError(
                    f"{_dotted(name, here)} is a section ({hint.__name__}) and takes a mapping, "
                    f"got {shown(value)}"
                )
            section = value if isinstance(value, MutableMapping) else dict(value)
            kwargs[key] = _check_dataclass(name, hint, section, here)
            continue
        if not _matches(value, hint):
            raise DocValidationError(
                f"{_dotted(name, here)} must be {_describe(hint)}, got {shown(value)}"
            )
        check_value(name, here, value, finite=fields[key].metadata.get("finite", True))
        _check_metadata(name, here, value, fields[key].metadata)
        if _is_float(hint) and isinstance(value, int) and not isinstance(value, bool):
            value = state[key] = _as_float(name, here, value)
        kwargs[key] = value
    try:
        return schema(**kwargs)
    except (ValueError, TypeError) as exc:
        raise DocValidationError(f"{_dotted(name, path)}: {exc}") from exc


_RULES = ("min", "max", "step", "choices")
"""The ``metadata`` keys of a dataclass field that are rules on its value."""

STEP_TOLERANCE = 1e-6
"""How far (in steps) from the grid a float may be and still be on it: ``0.1 * 3`` is."""


def _check_rules(name: str, schema: type, path: tuple[str, ...]) -> None:
    """Refuse a field's ``metadata`` rule that cannot be one (in nested sections too)."""
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        here = (*path, field.name)
        hint = hints.get(field.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            _check_rules(name, hint, here)
            continue
        meta = field.metadata
        where = f"{schema.__name__}.{field.name}'s metadata"
        for key in ("min", "max", "step"):
            bound = meta.get(key)
            if bound is None:
                continue
            if isinstance(bound, bool) or not isinstance(bound, int | float):
                raise ArgumentTypeError(
                    f"{where} {key} must be a number, got {shown(bound)} for doc {name!r}"
                )
            if not math.isfinite(bound):
                raise ArgumentError(
                    f"{where} {key} must be finite, got {shown(bound)} for doc {name!r}"
                )
        low, high, step = meta.get("min"), meta.get("max"), meta.get("step")
        if low is not None and high is not None and low > high:
            raise ArgumentError(
                f"{where} min must be <= max, got min={low!r} max={high!r} for doc {name!r}"
            )
        if step is not None and not step > 0:
            raise ArgumentError(f"{where} step must be > 0, got {step!r} for doc {name!r}")
        choices = meta.get("choices")
        if choices is not None and (not isinstance(choices, list | tuple) or not choices):
            raise ArgumentTypeError(
                f"{where} choices must be a non-empty list of values, got {shown(choices)} "
                f"for doc {name!r}"
            )


def _check_metadata(name: str, path: tuple[str, ...], value: Any, meta: Mapping[str, Any]) -> None:
    """Refuse ``value`` when a rule of its field's ``metadata`` does (min, max, step, choices)."""
    if not any(key in meta for key in _RULES):
        return
    choices = meta.get("choices")
    if choices is not None and not any(_same(value, choice) for choice in choices):
        allowed = ", ".join(shown(choice) for choice in choices)
        raise DocValidationError(
            f"{_dotted(name, path)} must be one of {allowed} (schema choices), got {shown(value)}"
        )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    low, high, step = meta.get("min"), meta.get("max"), meta.get("step")
    if low is not None and not value >= low:  # NaN (a field with "finite": False) too
        raise DocValidationError(
            f"{_dotted(name, path)} must be >= {low!r} (schema min), got {shown(value)}"
        )
    if high is not None and not value <= high:
        raise DocValidationError(
            f"{_dotted(name, path)} must be <= {high!r} (schema max), got {shown(value)}"
        )
    if step is not None and not on_grid(value, low or 0, step):
        start = f"{low!r} plus " if low else ""
        raise DocValidationError(
            f"{_dotted(name, path)} must be {start}a whole multiple of {step!r} (schema step), "
            f"got {shown(value)}"
        )


def on_grid(value: float, base: float, step: float) -> bool:
    """Whether ``value`` is ``base`` plus a whole multiple of ``step`` (a float within
    :data:`STEP_TOLERANCE` steps of it is, or within a float's rounding of a far one)."""
    if all(isinstance(x, int) for x in (value, base, step)):
        return (value - base) % step == 0
    offset = value - base
    if not math.isfinite(offset):
        return False
    # exact: the offset less the nearest whole number of steps (what a binary step's own
    # rounding adds up to over many steps is allowed, about one part in 10**15 of the offset)
    return abs(math.remainder(offset, step)) <= step * STEP_TOLERANCE + abs(offset) * 1e-15


def _same(value: Any, choice: Any) -> bool:
    """Whether ``value`` is the choice ``choice`` (``True`` is not ``1``)."""
    return value == choice and isinstance(value, bool) == isinstance(choice, bool)


def _is_float(hint: Any) -> bool:
    """Whether ``hint`` is ``float`` or ``float | None``: an int written there becomes one."""
    if hint is float:
        return True
    if get_origin(hint) in (Union, types.UnionType):
        arms = [arm for arm in get_args(hint) if arm is not type(None)]
        return arms == [float]
    return False


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = get_origin(hint)
    if origin is Literal:
        return value in get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_matches(value, arm) for arm in get_args(hint))
    if origin is not None:
        return isinstance(value, origin)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in get_args(hint))
    if hint is type(None):
        return "None"
    return _a(getattr(hint, "__name__", str(hint)))


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _check_callable(name: str, schema: Callable[..., Any], state: Mapping[str, Any]) -> None:
    check_value(name, (), state)
    try:
        schema(dict(state))
    except (ValueError, TypeError) as exc:
        raise DocValidationError(f"{name}: {exc}") from exc
