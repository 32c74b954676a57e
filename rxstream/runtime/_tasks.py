"""The app's own asyncio tasks (``ctx.spawn``): their failure ends the run, said at once.

A task made with ``asyncio.ensure_future`` that raises dies unseen (at most a "never
retrieved" line when it is collected). :class:`AppTasks` keeps a context's spawned tasks and
its active runs (each ``pipeline.run()`` under way registers a :class:`RunWatch`). A task that
raises an ``Exception`` is logged (``app_task_failed``) and becomes a
:class:`~rxstream._exceptions.TaskError` that every active run gets and raises, each ended at
once; with no run active, the first such failure is kept for the next ``pipeline.run()`` (or
``rxstream run``'s supervisor). A task ended by a ``TaskError`` (a run it awaited raised it:
already reported) or by a ``BaseException`` that is no ``Exception`` (cancellation, the self
test's end, Ctrl-C) is no new failure. The tasks are cancelled when the last active run of the
context ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from rxstream._exceptions import ArgumentError, ArgumentTypeError, PipelineStateError, TaskError
from rxstream._util import library_logger

__all__ = ["CANCEL_WAIT_S", "AppTasks", "RunWatch"]

_log = library_logger("rxstream")

CANCEL_WAIT_S = 1.0
"""Seconds the end of a run waits for its cancelled tasks to finish their ``finally`` blocks."""


class RunWatch:
    """One active ``pipeline.run()`` of a context: the task failure it is to raise, and how
    to end it at once (``wake()``, called on the loop)."""

    __slots__ = ("failure", "wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.failure: TaskError | None = None
        self.wake = wake


class AppTasks:
    """A context's spawned tasks, its active runs, and a failure no run saw (event loop only)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failure: TaskError | None = None
        self._runs: list[RunWatch] = []

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str | None) -> asyncio.Task[Any]:
        """Run ``coroutine`` as a task of the running loop, named ``name`` (default: the
        coroutine function's name), watched for failure."""
        if not asyncio.iscoroutine(coroutine):
            what = getattr(coroutine, "__name__", None)
            hint = (
                f"; call it: ctx.spawn({what}(...))"
                if callable(coroutine) and isinstance(what, str)
                else ""
            )
            raise ArgumentTypeError(
                f"ctx.spawn needs a coroutine, got {type(coroutine).__name__} "
                f"{what or repr(coroutine)!s}{hint}"
            )
        if name is None:
            name = getattr(coroutine, "__name__", None) or "task"
        elif not isinstance(name, str) or not name:
            coroutine.close()
            raise ArgumentError(f"ctx.spawn name must be a non-empty str, got {name!r}")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            coroutine.close()
            raise PipelineStateError(
                f"ctx.spawn({name!r}) outside a running event loop: call it from async code "
                "(an app's main(ctx), a notebook cell, a coroutine under asyncio.run)"
            ) from None
        task = loop.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        cause = task.exception()
        if not isinstance(cause, Exception):  # none, or the self test's end, a Ctrl-C
            return
        if isinstance(cause, TaskError):  # a run it awaited raised it: reported already
            return
        error = TaskError(task.get_name(), cause)
        _log.error(
            "app_task_failed", task=task.get_name(), error=f"{type(cause).__name__}: {cause}"
        )
        if not self._runs:  # no run to end: the next one raises it
            if self._failure is None:
                self._failure = error
            return
        for watch in list(self._runs):  # every run under way ends with it
            if watch.failure is None:
                watch.failure = error
            watch.wake()

    @property
    def failure(self) -> TaskError | None:
        """The first failure not yet raised, ``None`` if none."""
        return self._failure

    def take_failure(self) -> TaskError | None:
        """The first failure not yet raised (``None`` if none), now counted as raised."""
        failure, self._failure = self._failure, None
        return failure

    @property
    def running(self) -> bool:
        """Whether a ``pipeline.run()`` of the context is under way."""
        return bool(self._runs)

    def enter_run(self, wake: Callable[[], None]) -> RunWatch:
        """Register a ``pipeline.run()`` now under way: a task failing from now on sets its
        watch's ``failure`` and calls ``wake()`` (on the loop); :meth:`leave_run` ends it."""
        watch = RunWatch(wake)
        self._runs.append(watch)
        return watch

    def leave_run(self, watch: RunWatch) -> TaskError | None:
        """Unregister the run of ``watch``; returns the failure it is to raise (``None``: none)."""
        with contextlib.suppress(ValueError):
            self._runs.remove(watch)
        return watch.failure

    async def cancel_all(self) -> None:
        """Cancel every running task and wait (at most :data:`CANCEL_WAIT_S`) for them to end;
        ``pipeline.run()`` calls it when no other run of the context is under way."""
        current = asyncio.current_task()  # a run awaited inside a spawned task: not itself
        tasks = [task for task in self._tasks if not task.done() and task is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)
