"""Live views in a cell: the newest frame of a stream (`FrameView`, fed by `FrameTransport`
or a tap) and a pipeline's statistics table (`StatsView`)."""

from __future__ import annotations

import html
import io
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, Self

import ipywidgets
import numpy as np

from rxstream._exceptions import ArgumentError, ArgumentTypeError
from rxstream._util import library_logger
from rxstream.item import PipelineItem
from rxstream.pipeline import Pipeline
from rxstream.runtime import StageStatistics
from rxstream.transport import Session, Tee, Transport, to_rgb24

__all__ = [
    "FrameTransport",
    "FrameView",
    "ImageFormat",
    "StatsView",
    "encode_frame",
    "frame_array",
]

_log = library_logger("rxstream")

ImageFormat = Literal["jpeg", "png"]


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


class _Shown(ABC):
    """A live view: shown as its ``widget`` in a cell, closed by ``close()`` or ``with``."""

    widget: Any

    @abstractmethod
    def close(self) -> None:
        """Stop updating the widget; it keeps what it shows."""

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
        state = self.pipeline.state
        if state == "failed":
            state = f"failed: {self.pipeline.error}"
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
