"""The app's own asyncio tasks (``ctx.spawn``): their failure ends the run, said at once.

A task made with ``asyncio.ensure_future`` that raises dies unseen (at most a "never
retrieved" line when it is collected). :class:`AppTasks` keeps a context's spawned tasks: the
first one that raises is logged (``app_task_failed``) and becomes a
:class:`~rxstream._exceptions.TaskError` that the ``pipeline.run()`` awaiting (or the next one)
raises, ended at once by the listeners it registered; ``pipeline.run()`` cancels the tasks
when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from rxstream._exceptions import ArgumentError, ArgumentTypeError, PipelineStateError, TaskError
from rxstream._util import library_logger

__all__ = ["CANCEL_WAIT_S", "AppTasks"]

_log = library_logger("rxstream")

CANCEL_WAIT_S = 1.0
"""Seconds the end of a run waits for its cancelled tasks to finish their ``finally`` blocks."""


class AppTasks:
    """A context's spawned tasks, its first failure, and who to tell of one (event loop only)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failure: TaskError | None = None
        self._listeners: set[Callable[[], None]] = set()

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
        if cause is None:
            return
        error = TaskError(task.get_name(), cause)
        _log.error(
            "app_task_failed", task=task.get_name(), error=f"{type(cause).__name__}: {cause}"
        )
        if self._failure is None:
            self._failure = error
        for listener in list(self._listeners):
            listener()

    @property
    def failure(self) -> TaskError | None:
        """The first failure not yet raised, ``None`` if none."""
        return self._failure

    def take_failure(self) -> TaskError | None:
        """The first failure not yet raised (``None`` if none), now counted as raised."""
        failure, self._failure = self._failure, None
        return failure

    def on_failure(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` (on the loop) when a task fails; returns what unregisters it."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    async def cancel_all(self) -> None:
        """Cancel every running task and wait (at most :data:`CANCEL_WAIT_S`) for them to end."""
        current = asyncio.current_task()  # a run awaited inside a spawned task: not itself
        tasks = [task for task in self._tasks if not task.done() and task is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)
