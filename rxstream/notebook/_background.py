"""Pipelines run in the background of a kernel, stopped on interrupt, shutdown or close."""

from __future__ import annotations

import atexit
import threading
from types import TracebackType
from typing import Any

from IPython import get_ipython

from rxstream._exceptions import ArgumentTypeError
from rxstream.pipeline import Pipeline

__all__ = ["Background", "background", "stop_all"]

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
