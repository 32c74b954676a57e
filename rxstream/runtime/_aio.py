"""Running ``async def`` stage functions from stage threads on one event loop.

Under ``await pipeline.run()`` that loop is the one ``run()`` awaits in; otherwise (``start()``,
``drive()``) the bridge starts a private loop thread on first use and ends it on close.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any

__all__ = ["AsyncBridge"]


class AsyncBridge:
    """Submits coroutines to a loop and waits for them; cancels them all on close."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._own: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._closed = False

    def _target(self) -> asyncio.AbstractEventLoop:
        if self._loop is not None:
            return self._loop
        with self._lock:
            if self._own is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="rxstream:asyncio", daemon=True
                )
                thread.start()
                self._own, self._thread = loop, thread
            return self._own

    def call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the loop and return its result (raise its exception)."""
        if self._closed:
            coroutine.close()
            raise concurrent.futures.CancelledError("the pipeline is stopping")
        loop = self._target()
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        with self._lock:
            self._pending.add(future)
        try:
            return future.result()
        finally:
            with self._lock:
                self._pending.discard(future)

    def close(self) -> None:
        """Cancel what is pending and end the private loop, if one was started."""
        with self._lock:
            self._closed = True
            pending = list(self._pending)
            own, thread = self._own, self._thread
            self._own = self._thread = None
        for future in pending:
            future.cancel()
        if own is not None and thread is not None:
            own.call_soon_threadsafe(own.stop)
            thread.join(0.2)
            if not thread.is_alive():
                own.close()
