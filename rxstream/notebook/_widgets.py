"""Doc-bound widgets: an ipywidgets control two-way bound to one doc value."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets

from rxstream._exceptions import ArgumentError, ArgumentTypeError
from rxstream._util import library_logger
from rxstream.doc import Doc, Ref, controls

__all__ = ["widget"]

_log = library_logger("rxstream")

_MISSING = object()


def widget(
    doc: Doc,
    path: str | Ref,
    *,
    description: str | None = None,
    min: float | None = None,
    max: float | None = None,
    step: float | None = None,
    choices: Sequence[Any] | None = None,
    steer: bool = False,
    continuous_update: bool | None = None,
) -> Any:
    """An ipywidgets control two-way bound to the doc value at ``path`` (``"a.b"`` or a ref).

    The value's type picks the control: a checkbox for a bool, a slider for an int or a float
    (from ``min`` to ``max``), a text box for a str, and a dropdown of ``choices``. What is not
    given comes from the doc's :func:`~rxstream.doc.controls`, as on the web page: a schema's
    ``Literal`` gives the choices, a schema field's ``metadata`` the range, else the range
    follows the value (see :mod:`rxstream.doc._controls`). Moving the control writes the doc
    (``doc.steer`` with ``steer=True``: a new generation); a write to the doc from anywhere
    moves the control.
    A write the doc refuses puts the control back and raises. ``continuous_update`` defaults to
    true for a slider that sets and false otherwise (a text box writes on Enter or blur).
    """
    ref = _resolve(doc, path)
    where = f"{doc.name}.{ref.dotted}"
    value = ref.value
    if isinstance(value, Mapping):
        keys = ", ".join(sorted(value)) or "none"
        raise ArgumentError(f"{where} is a section, not a value: bind one of its keys ({keys})")
    label = description if description is not None else ref.path[-1]
    number = not isinstance(value, bool) and isinstance(value, int | float)
    spec = next((c for c in controls(doc) if c.path == ref.dotted), None)
    if choices is None and spec is not None and spec.kind == "choice":
        choices = spec.choices
    if choices is None and not number:
        for name, given in (("min", min), ("max", max), ("step", step)):
            if given is not None:
                raise ArgumentTypeError(
                    f"{name}= applies to a number, but {where} is {type(value).__name__} {value!r}"
                )
    control: Any
    if choices is not None:
        options = list(choices)
        if value not in options:
            raise ArgumentError(
                f"choices must include the current value of {where}, got {value!r} "
                f"not in {options!r}"
            )
        control = ipywidgets.Dropdown(options=options, value=value, description=label)
    elif isinstance(value, bool):
        control = ipywidgets.Checkbox(value=value, description=label, indent=False)
    elif number:
        integer = isinstance(value, int)
        if spec is not None and spec.kind == "number":
            min = spec.minimum if min is None else min
            max = spec.maximum if max is None else max
            step = (spec.step if not integer else 1) if step is None else step
        lo, hi, by = _slider_range(where, value, min, max, step, integer)
        slider = ipywidgets.IntSlider if integer else ipywidgets.FloatSlider
        control = slider(
            value=value,
            min=lo,
            max=hi,
            step=by,
            description=label,
            continuous_update=not steer if continuous_update is None else continuous_update,
        )
    elif isinstance(value, str):
        control = ipywidgets.Text(
            value=value,
            description=label,
            continuous_update=bool(continuous_update),
        )
    else:
        raise ArgumentTypeError(
            f"widget binds a bool, int, float or str (or choices=), but {where} is "
            f"{type(value).__name__} {value!r}"
        )
    _Binding(doc, ref, control, steer=steer)
    return control


def _resolve(doc: Doc, path: str | Ref) -> Ref:
    if not isinstance(doc, Doc):
        raise ArgumentTypeError(
            f"doc must be an rxstream Doc (ctx.doc(...)), got {type(doc).__name__}"
        )
    keys = path.path if isinstance(path, Ref) else tuple(str(path).split("."))
    if not keys or not all(keys):
        raise ArgumentError(f"path must name a value like 'a.b', got {path!r} for doc {doc.name!r}")
    ref = doc.desired
    for key in keys:
        ref = ref[key]
    return ref


def _slider_range(
    where: str,
    value: float,
    lo: float | None,
    hi: float | None,
    step: float | None,
    integer: bool,
) -> tuple[float, float, float]:
    """The slider's min, max and step, checked (a missing bound: 0 to twice the value)."""
    for name, given in (("min", lo), ("max", hi), ("step", step)):
        if given is None:
            continue
        if isinstance(given, bool) or not isinstance(given, int | float):
            raise ArgumentTypeError(f"{name} must be a number, got {given!r} for {where}")
        if integer and not float(given).is_integer():
            raise ArgumentTypeError(
                f"{name} must be a whole number for the int {where}, got {given!r}"
            )
        if not math.isfinite(given):
            raise ArgumentError(f"{name} must be finite, got {given!r} for {where}")
    low = lo if lo is not None else min(0, 2 * value)
    high = hi if hi is not None else max(0, 2 * value)
    if low == high and (lo is None or hi is None):  # a value of 0: a unit (or ten-step) range
        high = low + (10 if integer else 1)
    if not low < high:
        raise ArgumentError(f"min must be < max, got min={low!r} max={high!r} for {where}")
    if not low <= value <= high:
        raise ArgumentError(f"{where} is {value!r}, outside the slider's min={low!r} max={high!r}")
    by = step if step is not None else (1 if integer else (high - low) / 100)
    if not by > 0:
        raise ArgumentError(f"step must be > 0, got {by!r} for {where}")
    if integer:
        return int(low), int(high), int(by)
    return float(low), float(high), float(by)


class _Binding:
    """Widget to doc on every change; doc to widget on every distinct value at the path."""

    def __init__(self, doc: Doc, ref: Ref, control: Any, *, steer: bool) -> None:
        self.ref = ref
        self.control = control
        self.write = doc.steer if steer else doc.set
        self.syncing = False
        """Set while the doc moves the control, so that the move is not written back."""
        control.observe(self.on_widget, names="value")
        control.observe(self.on_comm, names="comm")
        self.subscription = ref.changes.subscribe(self.on_doc)

    def on_widget(self, change: Mapping[str, Any]) -> None:
        new = change["new"]
        if self.syncing or self.ref.get(_MISSING) == new:  # the doc moved it, or no change
            return
        nested: Any = new
        for key in reversed(self.ref.path):
            nested = {key: nested}
        try:
            self.write(nested)
        except Exception:
            self.move(self.ref.value)  # the doc refused it: show what the doc holds
            raise

    def on_doc(self, value: Any) -> None:
        try:
            self.move(value)
        except Exception as exc:  # a widget must never fail the doc write that moved it
            _log.warning("notebook_widget_sync_failed", path=self.ref.dotted, error=repr(exc))

    def move(self, value: Any) -> None:
        control = self.control
        self.syncing = True
        try:
            if isinstance(control, ipywidgets.IntSlider | ipywidgets.FloatSlider):
                control.min = min(control.min, value)  # a write past the slider widens it
                control.max = max(control.max, value)
            elif isinstance(control, ipywidgets.Dropdown) and value not in control.options:
                control.options = (*control.options, value)
            control.value = value
        finally:
            self.syncing = False

    def on_comm(self, change: Mapping[str, Any]) -> None:
        if change["new"] is None:  # widget.close(): stop following the doc
            self.subscription.dispose()
