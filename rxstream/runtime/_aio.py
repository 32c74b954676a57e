"""Running ``async def`` stage functions from stage threads on one event loop.

Under ``await pipeline.run()`` that loop is the one ``run()`` awaits in; otherwise (``start()``,
``drive()``) the bridge starts a private loop thread on first use and ends it on close.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
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
                self._own = asyncio.new_event_loop()
                # a bridge dropped while paused (a driven session never reset) still closes it
                weakref.finalize(self, _retire, self._own).atexit = False
            if self._thread is None:
                thread = threading.Thread(
                    target=self._own.run_forever, name="rxstream:asyncio", daemon=True
                )
                thread.start()
                self._thread = thread
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

    def pause(self) -> None:
        """End the private loop's thread and keep the loop (what it runs waits): the next
        :meth:`call` runs it again. Between two drives no thread runs."""
        with self._lock:
            own, thread = self._own, self._thread
            self._thread = None
        if own is not None and thread is not None:
            own.call_soon_threadsafe(own.stop)
            thread.join()

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
        elif own is not None:  # paused: no thread runs it
            _retire(own)


def _retire(loop: asyncio.AbstractEventLoop) -> None:
    """Close a private loop that no thread runs, its async generators first; on a thread of
    its own, as the calling thread may be running a loop (a notebook's)."""
    if loop.is_closed() or loop.is_running():
        return

    def shutdown() -> None:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    thread = threading.Thread(target=shutdown, name="rxstream:asyncio", daemon=True)
    thread.start()
    thread.join(1.0)
