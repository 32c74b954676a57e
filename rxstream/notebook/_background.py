"""Pipelines run in the background of a kernel, stopped on interrupt, shutdown or close."""

from __future__ import annotations

import atexit
import sys
import threading
from types import TracebackType
from typing import Any

from IPython import get_ipython

from rxstream._exceptions import ArgumentTypeError
from rxstream._util import library_logger
from rxstream.pipeline import Pipeline, started_pipelines, stream_names

__all__ = ["Background", "background", "stop_all"]

_live: set[Background] = set()
_live_lock = threading.Lock()
_hooked_shells: set[int] = set()
_atexit_registered = False
_log = library_logger("rxstream")


class Background:
    """A pipeline started in the background of a kernel (see :func:`background`)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._holding = False

    @property
    def running(self) -> bool:
        """Whether the pipeline is still running (not completed, failed or stopped)."""
        return self.pipeline.running

    @property
    def state(self) -> str:
        """``"running"``, ``"completed"``, ``"stopped"`` or ``"failed: <the error>"``."""
        state = self.pipeline.state
        return f"failed: {self.pipeline.error}" if state == "failed" else state

    def hold(self, seconds: float | None = None) -> bool:
        """Block the cell while the pipeline runs, ``seconds`` at most (``None``: until it
        ends); whether it ended. An interrupt (``KeyboardInterrupt``) stops it and goes on;
        a stage that failed raises its :class:`~rxstream.PipelineError`."""
        self._holding = True  # a failure raises here: no need to print it too
        try:
            ended = self.pipeline.wait(seconds)
        except KeyboardInterrupt:
            self.stop()
            raise
        except BaseException:
            _forget(self)
            raise
        finally:
            self._holding = False
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
        return f"<Background {self.pipeline!r} {self.state}>"

    def _ended(self) -> None:
        """The run is over (completed, failed or stopped): a failure nobody holds the cell for
        is printed now, into the kernel's output, and logged (``background_failed``)."""
        if self.pipeline.state != "failed" or self._holding:
            return
        error = self.pipeline.error
        _log.error("background_failed", pipeline=repr(self.pipeline), error=str(error))
        print(
            f"rxstream: the background run of {self.pipeline!r} failed: {error}\n"
            "  (bg.stop() ends it; background(pipeline) again starts it afresh)",
            file=sys.stderr,
            flush=True,
        )


def background(pipeline: Pipeline, **config: Any) -> Background:
    """Start ``pipeline`` (``pipeline.start(**config)``) and return at once.

    It runs on its stage threads while you work in other cells, and stops when the handle is
    stopped or closed (``with background(p):``), when any cell is interrupted, and when the
    kernel shuts down. A stage that fails ends it and is printed at once (the handle then
    reads ``failed: …``).

    Running the cell again replaces the previous run: a background run of the same pipeline,
    or of another pipeline of its context that feeds one of its streams, is stopped first.
    """
    if not isinstance(pipeline, Pipeline):
        raise ArgumentTypeError(
            f"pipeline must be an rxstream Pipeline, got {type(pipeline).__name__}"
        )
    _install_hooks()
    for previous in _replaced_by(pipeline):
        _log.info("background_replaced", pipeline=repr(previous.pipeline))
        previous.stop()
    pipeline.start(**config)
    handle = Background(pipeline)
    with _live_lock:
        _live.add(handle)
    pipeline._over.on_done(handle._ended)
    return handle


def _replaced_by(pipeline: Pipeline) -> list[Background]:
    """The live background runs a new one of ``pipeline`` replaces (see :func:`background`)."""
    streams = stream_names(pipeline)
    with _live_lock:
        handles = list(_live)
    return [
        handle
        for handle in handles
        if handle.pipeline is pipeline
        or (handle.pipeline.context is pipeline.context and streams & stream_names(handle.pipeline))
    ]


def stop_all() -> None:
    """Stop every pipeline :func:`background` started that is still running, then every
    pipeline started with ``start()`` and not yet stopped (a cell run again has lost the
    name of the one it started before)."""
    with _live_lock:
        handles = list(_live)
    for handle in handles:
        handle.stop()
    for pipeline in started_pipelines():
        pipeline.stop()


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
