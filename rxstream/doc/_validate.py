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
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from rxstream._exceptions import DocValidationError

__all__ = ["Validator", "defaults_from_schema", "make_validator"]

Validator = Callable[[Mapping[str, Any], Mapping[str, Any]], None]
"""``validate(changes, merged)``: raise :class:`DocValidationError` to refuse a write."""


def make_validator(name: str, defaults: Mapping[str, Any], schema: object) -> Validator:
    """The validator for a doc named ``name`` (see the module docstring)."""
    if schema is None:
        return lambda changes, merged: _check_shape(name, defaults, changes, ())
    if isinstance(schema, type) and dataclasses.is_dataclass(schema):
        return lambda changes, merged: _check_dataclass(name, schema, merged, ())
    if callable(schema):
        return lambda changes, merged: _check_callable(name, schema, merged)
    raise TypeError(
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
        raise TypeError(
            f"a dataclass schema without defaults= needs a default for every field ({exc}) "
            f"for doc {name!r}"
        ) from None
    return dataclasses.asdict(instance)


def _dotted(name: str, path: tuple[str, ...]) -> str:
    return ".".join((name, *path))


def _check_shape(
    name: str, defaults: Mapping[str, Any], changes: Mapping[str, Any], path: tuple[str, ...]
) -> None:
    for key, value in changes.items():
        here = (*path, key)
        if defaults and key not in defaults:
            keys = ", ".join(sorted(defaults))
            raise DocValidationError(
                f"{_dotted(name, here)} is not a field of the doc (fields there: {keys}), "
                f"got {value!r}"
            )
        default = defaults.get(key)
        if isinstance(default, Mapping):
            if not isinstance(value, Mapping):
                raise DocValidationError(
                    f"{_dotted(name, here)} is a section and takes a mapping, got {value!r}"
                )
            _check_shape(name, default, value, here)
        elif key in defaults and default is not None and not _same_kind(value, default):
            raise DocValidationError(
                f"{_dotted(name, here)} must be {_a(type(default).__name__)} like its default "
                f"{default!r}, got {value!r}"
            )


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _check_dataclass(
    name: str, schema: type, state: Mapping[str, Any], path: tuple[str, ...]
) -> Any:
    hints = typing.get_type_hints(schema)
    fields = {field.name: field for field in dataclasses.fields(schema)}
    for key in state:
        if key not in fields:
            raise DocValidationError(
                f"{_dotted(name, (*path, key))} is not a field of {schema.__name__} "
                f"(fields: {', '.join(sorted(fields))}), got {state[key]!r}"
            )
    kwargs = {}
    for key, value in state.items():
        hint = hints.get(key, Any)
        here = (*path, key)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, Mapping):
                raise DocValidationError(
                    f"{_dotted(name, here)} is a section ({hint.__name__}) and takes a mapping, "
                    f"got {value!r}"
                )
            kwargs[key] = _check_dataclass(name, hint, value, here)
            continue
        if not _matches(value, hint):
            raise DocValidationError(
                f"{_dotted(name, here)} must be {_describe(hint)}, got {value!r}"
            )
        kwargs[key] = value
    try:
        return schema(**kwargs)
    except (ValueError, TypeError) as exc:
        raise DocValidationError(f"{_dotted(name, path)}: {exc}") from exc


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
    try:
        schema(dict(state))
    except (ValueError, TypeError) as exc:
        raise DocValidationError(f"{name}: {exc}") from exc
