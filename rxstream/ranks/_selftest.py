"""The CPU harness: an app's ``with ctx.self_test():`` block alone (``rxstream test``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rxstream.context import Context
from rxstream.ranks._app import load_app
from rxstream.ranks._launch import supervise
from rxstream.transport import MemoryTransport

# --- the CPU harness -----------------------------------------------------------------------------


class _UntilSelfTest(MemoryTransport):
    """The harness's session: attached until the app's self test has finished."""

    def __init__(self, finished: Callable[[], bool]) -> None:
        super().__init__(keep=8)
        self._finished = finished

    @property
    def connected(self) -> bool:
        return super().connected and not self._finished()


def run_self_test(entry: str, *, timeout: float = 60.0) -> bool | None:
    """Run the ``with ctx.self_test():`` block of the app ``entry`` under the CPU harness.

    The app gets ``Context(harness=True)`` with an in-memory transport. A ``build`` app is
    built (its block runs as ``build`` does); a ``main`` app runs until its block finished —
    its transport disconnects then, so a ``run()`` after the block returns at once — and is
    cancelled if it has not returned ``JOIN_S`` later. Returns ``True`` when the block
    passed, ``None`` when the app ran none (``False`` when the app caught its failure).
    Raises :class:`~rxstream.SelfTestError` (the cause attached) when it failed, what the app
    raised outside the block, and ``TimeoutError`` when no block finished in ``timeout`` s.
    """
    app = load_app(entry)
    main = app.main
    if main is None:
        ctx = Context(harness=True, transport=MemoryTransport(keep=8))
        app(ctx)
        return ctx.self_test_passed
    holder: list[Context] = []

    def finished() -> bool:
        return holder[0].self_test_passed is not None

    ctx = Context(harness=True, transport=_UntilSelfTest(finished))
    holder.append(ctx)
    deadline = time.monotonic() + timeout

    def over() -> bool:
        return finished() or time.monotonic() > deadline

    asyncio.run(supervise(main(ctx), should_end=over))
    if ctx.self_test_passed is None and time.monotonic() > deadline:
        raise TimeoutError(f"the app's self test did not finish within {timeout:g} s")
    return ctx.self_test_passed
