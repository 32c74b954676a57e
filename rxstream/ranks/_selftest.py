"""The CPU harness: an app's ``with ctx.self_test():`` block alone (``rxstream test``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import NoReturn

from rxstream.context import Context
from rxstream.pipeline import Pipeline
from rxstream.ranks._app import load_app
from rxstream.ranks._launch import supervise
from rxstream.runtime._aio import AsyncBridge
from rxstream.transport import MemoryTransport

# --- the CPU harness -----------------------------------------------------------------------------


class _SelfTestOver(BaseException):
    """Ends a ``main`` app under the harness where its self test is over: at the end of its
    block, or where it would go live (start a pipeline) without one. A ``BaseException``,
    so that the app's own ``except Exception`` lets it through, as it lets a Ctrl-C."""


class _HarnessContext(Context):
    """A ``main`` app's context under the harness: the app ends with its self test."""

    @contextlib.contextmanager
    def self_test(self) -> Iterator[None]:
        self._launcher = None  # the block's own threaded runs are part of the test
        try:
            with super().self_test():  # a failure raises SelfTestError, as anywhere
                yield
        finally:
            self._launcher = _go_live
        raise _SelfTestOver


def _go_live(pipeline: Pipeline, bridge: AsyncBridge) -> NoReturn:
    """The harness's launcher hook: a pipeline's ``start()``/``run()`` ends the app there."""
    raise _SelfTestOver


def run_self_test(entry: str, *, timeout: float = 60.0) -> bool | None:
    """Run the ``with ctx.self_test():`` block of the app ``entry`` under the CPU harness.

    The app gets ``Context(harness=True)`` with an in-memory transport. A ``build`` app is
    built (its block runs as ``build`` does). A ``main`` app runs up to the end of its block
    and no further: the block's end stops it, and so does a pipeline's ``start()`` or
    ``run()`` before any block (the app goes live without a self test); what it left
    running (its tasks) is cancelled. Returns ``True`` when the block passed, ``None`` when
    the app ran none (``False`` when the app caught its failure). Raises
    :class:`~rxstream.SelfTestError` (the cause attached) when it failed, what the app raised
    outside the block, and ``TimeoutError`` when no block finished in ``timeout`` s.
    """
    app = load_app(entry)
    main = app.main
    if main is None:
        ctx = Context(harness=True, transport=MemoryTransport(keep=8))
        app(ctx)
        return ctx.self_test_passed
    ctx = _HarnessContext(harness=True, transport=MemoryTransport(keep=8))
    ctx._launcher = _go_live  # going live before any block: the app has no self test
    deadline = time.monotonic() + timeout
    try:
        asyncio.run(supervise(main(ctx), should_end=lambda: time.monotonic() > deadline))
    except _SelfTestOver:
        return ctx.self_test_passed
    if ctx.self_test_passed is None and time.monotonic() > deadline:
        raise TimeoutError(f"the app's self test did not finish within {timeout:g} s")
    return ctx.self_test_passed
