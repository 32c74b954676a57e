"""Notebook helpers: doc-bound widgets, a live frame view, a live statistics table, and
pipelines run in the background of a kernel.

Each helper keeps a notebook cell to one line::

    bg = background(pipeline)                  # start; stopped on interrupt, shutdown, close
    view = FrameView("video")                  # ctx = rxstream.Context(transport=view.transport())
    StatsView(pipeline)                        # a table that refreshes itself
    widget(doc, "gain", min=0, max=2)          # a slider two-way bound to doc.desired.gain

It needs the ``notebook`` extra (``pip install 'rxstream[notebook]'``: ipywidgets and
ipykernel); ``import rxstream`` never imports it.
"""

from __future__ import annotations

import atexit
import html
import io
import math
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self

import numpy as np
import structlog

from rxstream._exceptions import ArgumentError, ArgumentTypeError
from rxstream.doc import Doc, Ref, controls
from rxstream.item import PipelineItem
from rxstream.pipeline import Pipeline
from rxstream.runtime import StageStatistics
from rxstream.transport import Session, Tee, Transport, to_rgb24

try:
    import ipywidgets
    from IPython import get_ipython
except ImportError as exc:  # tests/test_notebook_helpers.py hides ipywidgets to check this
    raise ImportError(
        "rxstream.notebook needs ipywidgets, which rxstream does not install by default: "
        "install the notebook extra with pip install 'rxstream[notebook]' "
        f"(missing: {exc.name})"
    ) from exc

__all__ = [
    "Background",
    "FrameTransport",
    "FrameView",
    "StatsView",
    "background",
    "encode_frame",
    "frame_array",
    "stop_all",
    "widget",
]

_log = structlog.get_logger("rxstream")

ImageFormat = Literal["jpeg", "png"]
_MISSING = object()


# --- widgets bound to a doc path -------------------------------------------------------------


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


# --- frames -----------------------------------------------------------------------------------


def frame_array(payload: Any, *, stream: str = "frame") -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A frame payload as a new ``(H, W, 3)`` uint8 RGB array, never a view of the payload.

    Reads payloads as the egress codecs do (:func:`rxstream.transport.to_rgb24`: numpy or
    torch, HW, HWC or CHW, uint8 or float in [0, 1]), and also takes a leading batch axis of 1.
    Errors are :class:`~rxstream.transport.CodecError` naming ``stream``.
    """
    shape: tuple[int, ...] = tuple(getattr(payload, "shape", ()))
    if len(shape) == 4 and shape[0] == 1:
        payload = payload[0]
    rgb = to_rgb24(payload, stream=stream)
    if rgb is payload or not rgb.flags.owndata:  # a view: the payload may be a ring slot's
        rgb = rgb.copy()
    return rgb


def encode_frame(payload: Any, format: ImageFormat = "jpeg", quality: int = 85) -> bytes:
    """A frame payload (see :func:`frame_array`) as JPEG or PNG bytes."""
    from PIL import Image

    _check_format(format, quality)
    image = Image.fromarray(frame_array(payload))
    out = io.BytesIO()
    if format == "jpeg":
        image.save(out, format="JPEG", quality=quality)
    else:
        image.save(out, format="PNG")
    return out.getvalue()


def _check_format(format: str, quality: int) -> None:
    if format not in ("jpeg", "png"):
        raise ArgumentError(f"format must be 'jpeg' or 'png', got {format!r}")
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ArgumentError(f"quality must be an int from 1 to 100, got {quality!r}")


class _Shown:
    """A live view: shown as its ``widget`` in a cell, closed by ``close()`` or ``with``."""

    widget: Any

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


class FrameView(_Shown):
    """A live image (``ipywidgets.Image``) that shows the newest frame, at most ``fps`` a second.

    Feed it from any thread: as the session transport (``Context(transport=view.transport())``,
    which shows the items of ``stream``, every stream when ``None``), or from a tap
    (``ctx.tap(view.update)``). A frame is converted (and copied) by :meth:`update` on the
    caller's thread; a worker thread encodes the newest one and drops those it had no time
    for. Display it by ending a cell with it, or ``display(view)``.
    """

    def __init__(
        self,
        stream: str | None = None,
        *,
        fps: float = 10.0,
        format: ImageFormat = "jpeg",
        quality: int = 85,
        width: int | None = None,
    ) -> None:
        if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps < math.inf:
            raise ArgumentError(f"fps must be a finite number > 0, got {fps!r}")
        _check_format(format, quality)
        if width is not None and (isinstance(width, bool) or not isinstance(width, int)):
            raise ArgumentTypeError(f"width must be a number of pixels (int), got {width!r}")
        self.stream = stream
        """The stream whose items :meth:`transport` shows (``None``: every stream)."""
        self.fps = float(fps)
        self.format: ImageFormat = format
        self.quality = quality
        self.widget = ipywidgets.Image(format=format)
        """The ``ipywidgets.Image`` that shows the frames."""
        if width is not None:
            self.widget.width = width
        self.received = 0
        """Frames handed to :meth:`update`."""
        self.shown = 0
        """Frames encoded into the image (the rest were skipped by the throttle)."""
        self.last: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        """The last frame shown, as :func:`frame_array` made it."""
        self._cond = threading.Condition()
        self._pending: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def update(self, payload: Any) -> None:
        """Offer a frame (any thread); it replaces one that is still waiting to be shown."""
        frame = frame_array(payload, stream=self.stream or "frame")
        with self._cond:
            if self._closed:
                return
            self._pending = frame
            self.received += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="rxstream-notebook:frames", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def _loop(self) -> None:
        period = 1.0 / self.fps
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._closed:
                    return
                frame, self._pending = self._pending, None
            assert frame is not None
            try:
                self.widget.value = encode_frame(frame, self.format, self.quality)
            except Exception as exc:  # keep showing later frames
                _log.warning("notebook_frame_failed", error=repr(exc))
            else:
                with self._cond:
                    self.last = frame
                    self.shown += 1
                    self._cond.notify_all()
            with self._cond:  # the throttle: the next frame waits for its slot
                self._cond.wait_for(lambda: self._closed, timeout=period)

    def wait(self, count: int, timeout: float | None = None) -> bool:
        """Block until ``count`` frames in all have been shown; whether they were in time."""
        with self._cond:
            self._cond.wait_for(lambda: self.shown >= count or self._closed, timeout)
            return self.shown >= count

    def transport(self, inner: Transport | None = None) -> Transport:
        """A session transport that shows this view's stream: a :class:`FrameTransport`, teed
        after ``inner`` when given (``Tee(inner, …)``: ``inner`` gets everything and decides
        ``connected``)."""
        shows = FrameTransport(self)
        return shows if inner is None else Tee(inner, shows)

    def close(self) -> None:
        """Stop the worker thread; the image keeps the last frame."""
        with self._cond:
            self._closed = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    def __repr__(self) -> str:
        return f"<FrameView {self.stream or '*'} shown {self.shown} of {self.received}>"


class FrameTransport(Transport):
    """A session transport that shows the frames of its view's stream in a :class:`FrameView`.

    It is connected until closed; :meth:`FrameView.transport` tees it with another transport.
    """

    def __init__(self, view: FrameView) -> None:
        if not isinstance(view, FrameView):
            raise ArgumentTypeError(f"view must be a FrameView, got {type(view).__name__}")
        self.view = view
        self._closed = False

    @property
    def connected(self) -> bool:
        return not self._closed

    def open(self, session: Session) -> None:
        self._closed = False

    def send(self, stream: str, item: PipelineItem) -> None:
        if self.view.stream is None or stream == self.view.stream:
            self.view.update(item.payload)

    def close(self) -> None:
        self._closed = True


# --- statistics -----------------------------------------------------------------------------


class StatsView(_Shown):
    """A live table of ``pipeline.statistics()`` (``ipywidgets.HTML``), refreshed every
    ``interval`` seconds by a background thread until :meth:`close`."""

    def __init__(self, pipeline: Pipeline, *, interval: float = 0.5) -> None:
        if not isinstance(pipeline, Pipeline):
            raise ArgumentTypeError(
                f"pipeline must be an rxstream Pipeline, got {type(pipeline).__name__}"
            )
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not 0 < interval < math.inf
        ):
            raise ArgumentError(
                f"interval must be a finite number of seconds > 0, got {interval!r}"
            )
        self.pipeline = pipeline
        self.interval = float(interval)
        self.widget = ipywidgets.HTML(value=self.html())
        """The ``ipywidgets.HTML`` that shows the table."""
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="rxstream-notebook:stats", daemon=True
        )
        self._thread.start()

    def html(self) -> str:
        """The table as it is now, as HTML."""
        state = "running" if self.pipeline.running else "not running"
        return _statistics_html(self.pipeline.statistics(), caption=f"{self.pipeline!r}: {state}")

    def refresh(self) -> None:
        """Redraw the table now."""
        self.widget.value = self.html()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception as exc:  # a statistics read must never kill the refresher
                _log.warning("notebook_stats_failed", error=repr(exc))

    def close(self) -> None:
        """Stop refreshing (after one last refresh); the table stays as it was."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self.refresh()


def _statistics_html(stats: Mapping[str, StageStatistics], caption: str = "") -> str:
    """Per-stage statistics as an HTML table (the columns of ``format_statistics``)."""
    head = ("stage", "kind", "in", "out", "cutovers", "dropped", "depth", "wait s", "work s")
    rows = [
        (
            s.name,
            s.kind,
            str(s.items_in),
            str(s.items_out),
            str(s.cutovers),
            ", ".join(f"{k}={v}" for k, v in sorted(s.dropped.items())) or "-",
            f"{s.inbox_depth}/{s.inbox_capacity}" if s.inbox_capacity else "-",
            f"{s.wait_s:.3f}",
            f"{s.work_s:.3f}",
        )
        for s in stats.values()
    ]
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    header = "".join(f"<th>{name}</th>" for name in head)
    body = cells or f'<tr><td colspan="{len(head)}">no run yet</td></tr>'
    return (
        f"<table><caption>{html.escape(caption)}</caption>"
        f"<thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"
    )


# --- background runs ------------------------------------------------------------------------

_live: set[Background] = set()
_live_lock = threading.Lock()
_hooked_shells: set[int] = set()
_atexit_registered = False


class Background:
    """A pipeline started in the background of a kernel (see :func:`background`)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    @property
    def running(self) -> bool:
        """Whether the pipeline is still running."""
        return self.pipeline.running

    def hold(self, seconds: float | None = None) -> bool:
        """Block the cell while the pipeline runs, ``seconds`` at most (``None``: until it
        ends); whether it ended. An interrupt (``KeyboardInterrupt``) stops it and goes on;
        a stage that failed raises its :class:`~rxstream.PipelineError`."""
        try:
            ended = self.pipeline.wait(seconds)
        except KeyboardInterrupt:
            self.stop()
            raise
        except BaseException:
            _forget(self)
            raise
        if ended:
            _forget(self)
        return ended

    def stop(self) -> None:
        """Stop the pipeline (idempotent)."""
        try:
            self.pipeline.stop()
        finally:
            _forget(self)

    def __enter__(self) -> Background:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Background {self.pipeline!r} {'running' if self.running else 'stopped'}>"


def background(pipeline: Pipeline, **config: Any) -> Background:
    """Start ``pipeline`` (``pipeline.start(**config)``) and return at once.

    It runs on its stage threads while you work in other cells, and stops when the handle is
    stopped or closed (``with background(p):``), when any cell is interrupted, and when the
    kernel shuts down.
    """
    if not isinstance(pipeline, Pipeline):
        raise ArgumentTypeError(
            f"pipeline must be an rxstream Pipeline, got {type(pipeline).__name__}"
        )
    _install_hooks()
    pipeline.start(**config)
    handle = Background(pipeline)
    with _live_lock:
        _live.add(handle)
    return handle


def stop_all() -> None:
    """Stop every pipeline :func:`background` started that is still running."""
    with _live_lock:
        handles = list(_live)
    for handle in handles:
        handle.stop()


def _forget(handle: Background) -> None:
    with _live_lock:
        _live.discard(handle)


def _after_cell(result: Any) -> None:
    """IPython's ``post_run_cell``: a cell that was interrupted stops the background runs."""
    if isinstance(getattr(result, "error_in_exec", None), KeyboardInterrupt):
        stop_all()


def _install_hooks() -> None:
    global _atexit_registered
    with _live_lock:
        if not _atexit_registered:
            atexit.register(stop_all)
            _atexit_registered = True
        shell = get_ipython()
        if shell is not None and id(shell) not in _hooked_shells:
            shell.events.register("post_run_cell", _after_cell)
            _hooked_shells.add(id(shell))
