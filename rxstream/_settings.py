"""``--set KEY=VALUE``: typed writes to the control doc, made as the app creates the doc.

``KEY`` is a dotted path into the doc (``vae.model=sharp`` writes ``{"vae": {"model":
"sharp"}}``). ``VALUE`` is typed by what the doc declares at that path: the annotation of a
dataclass schema's field when there is one, else the type of the value the doc holds there
now —

- ``bool``: ``true``/``false`` (also ``yes``/``no``, ``on``/``off``, ``1``/``0``);
- ``int`` and ``float``: a number (an int where the doc holds an int);
- ``str`` and ``Literal`` choices: the text as given;
- ``X | None``: ``null`` (or ``none``) for ``None``, else typed as ``X``;
- a section, a list, a dict or a tuple: JSON;
- anything else, or a path the doc does not hold: JSON when it parses, else the text.

All the settings are written at once (one ``doc.set``), so the doc's own rules check them
together; a value that cannot be typed, or a write the doc refuses, is a
:class:`~rxstream.SettingError` naming the setting, the rule and the value, in one form
(``--set gain=abc: refused: control.gain must be a number, got 'abc'``).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from rxstream._exceptions import DocValidationError, SettingError
from rxstream.doc import Doc
from rxstream.doc._snapshot import thaw

__all__ = ["apply_settings", "split_setting", "typed_settings"]

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NULL = ("null", "none")
_MISSING = object()


def split_setting(text: str) -> tuple[tuple[str, ...], str]:
    """The dotted path and the raw value of ``KEY=VALUE``; :class:`SettingError` if malformed."""
    key, sep, value = text.partition("=")
    path = tuple(key.split("."))
    if not sep or not all(part and part.strip() == part for part in path):
        raise SettingError(
            f"--set takes KEY=VALUE with a dotted KEY (like vae.model=sharp), got {text!r}"
        )
    return path, value


def typed_settings(doc: Doc, settings: Sequence[str]) -> dict[str, Any]:
    """The nested write that ``settings`` (``KEY=VALUE`` strings) make, typed against ``doc``."""
    state = thaw(doc.snapshot())
    schema = doc.schema if isinstance(doc.schema, type) else None
    changes: dict[str, Any] = {}
    for text in settings:
        path, raw = split_setting(text)
        hint = _schema_hint(schema, path)
        current = _current(state, path)
        if hint is _MISSING:
            hint = Any if current is _MISSING or current is None else type(current)
        where = ".".join((doc.name, *path))
        value = _typed(raw, hint, lambda rule, where=where, text=text: _refuse(text, where, rule))
        _put(changes, path, value, text, doc.name)
    return changes


def apply_settings(doc: Doc, settings: Sequence[str]) -> int:
    """Write ``settings`` to ``doc`` in one ``set``; the doc's new version."""
    changes = typed_settings(doc, settings)
    try:
        return doc.set(changes)
    except DocValidationError as exc:
        shown = " ".join(f"--set {text}" for text in settings)
        raise SettingError(f"{shown}: refused: {exc}") from None


def _refuse(text: str, where: str, rule: str) -> SettingError:
    raw = text.partition("=")[2]
    return SettingError(f"--set {text}: refused: {where} must be {rule}, got {raw!r}")


def _schema_hint(schema: type | None, path: tuple[str, ...]) -> Any:
    """The annotation of ``path`` in a dataclass schema (``_MISSING`` when it has none)."""
    hint: Any = schema
    for key in path:
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            return _MISSING
        hints = typing.get_type_hints(hint)
        if key not in hints:
            return _MISSING
        hint = hints[key]
    return hint


def _current(state: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = state
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


def _typed(raw: str, hint: Any, refuse: Any) -> Any:
    """``raw`` as ``hint`` asks; ``refuse(rule)`` makes the error when it cannot be."""
    origin = get_origin(hint)
    if hint is Any:
        return _json_or_text(raw)
    if hint is None or hint is type(None):
        if raw.strip().lower() in _NULL:
            return None
        raise refuse("null")
    if origin is Literal:
        choices = get_args(hint)
        if raw in choices:
            return raw
        parsed = _json_or_text(raw)
        if parsed in choices:
            return parsed
        raise refuse("one of " + ", ".join(repr(choice) for choice in choices))
    if origin in (Union, types.UnionType):
        arms = get_args(hint)
        if type(None) in arms and raw.strip().lower() in _NULL:
            return None
        # the text itself is the last resort: `int | str` reads "8" as 8
        ordered = sorted((arm for arm in arms if arm is not type(None)), key=lambda a: a is str)
        for arm in ordered:
            try:
                return _typed(raw, arm, _Unfit)
            except _Unfit:
                continue
        raise refuse(" or ".join(_describe(arm) for arm in arms))
    if hint is bool:
        word = raw.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise refuse("a bool (true or false)")
    if hint is int:
        try:
            return int(raw)
        except ValueError:
            raise refuse("an int") from None
    if hint is float:
        try:
            return float(raw)
        except ValueError:
            raise refuse("a number") from None
    if hint is str:
        return raw
    container = origin or hint
    if isinstance(container, type) and (
        issubclass(container, Mapping | list | tuple) or dataclasses.is_dataclass(container)
    ):
        shape = list if issubclass(container, list | tuple) else dict
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, shape):
            raise refuse(f"JSON ({'an array' if shape is list else 'an object'})")
        return parsed
    return _json_or_text(raw)


class _Unfit(Exception):
    """One arm of a union that does not fit (the next is tried)."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(hint))
    name = getattr(hint, "__name__", None) or str(hint)
    if isinstance(hint, type) and issubclass(hint, Mapping):
        name = "an object"
    return {"int": "an int", "float": "a number", "bool": "a bool", "str": "a str"}.get(name, name)


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _put(changes: dict[str, Any], path: tuple[str, ...], value: Any, text: str, name: str) -> None:
    node = changes
    for depth, key in enumerate(path[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            where = ".".join((name, *path[: depth + 1]))
            raise SettingError(
                f"--set {text}: refused: {where} was set to a value already, so it has no field "
                f"{path[depth + 1]!r}"
            )
        node = child
    last = node.get(path[-1])
    if isinstance(last, dict) and isinstance(value, Mapping):
        last.update(value)
    else:
        node[path[-1]] = value
