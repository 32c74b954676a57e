"""The session's state messages to the pages: ``session`` on attach, and each doc's newest
state after it changed (``doc``), coalesced: a burst of writes reaches each page as one or a
few states, ``DOC_EVERY_S`` apart at most, the last the newest.

:class:`DocStates` is mixed into :class:`~rxstream.transport._web.WebTransport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from rxstream.doc import controls
from rxstream.doc._snapshot import thaw
from rxstream.transport._base import Session
from rxstream.transport._guard import wire
from rxstream.transport._webclient import Client

__all__ = ["DOC_EVERY_S", "DocStates"]

DOC_EVERY_S = 0.05
"""Doc states go to the pages at most this often (the newest state; a burst of writes is one
message per page)."""


class DocStates:
    """The state messages of ``WebTransport``: what they read of it."""

    _session: Session
    _loop: asyncio.AbstractEventLoop | None
    _lock: threading.Lock
    _clients: set[Client]
    _dirty_docs: set[str]
    _docs_due: bool
    _docs_sent_at: float

    def _session_message(self) -> str:
        session = self._session
        return wire(
            {
                "type": "session",
                "streams": dict(session.streams),
                "inputs": list(session.inputs),
                "docs": {
                    name: {
                        "version": doc.version,
                        "desired": thaw(doc.snapshot()),
                        "controls": [c.to_json() for c in controls(doc)],
                    }
                    for name, doc in session.docs.items()
                },
            },
        )

    def _doc_listener(self, name: str) -> Callable[[Any], None]:
        return lambda _snapshot: self._doc_changed(name)

    def _doc_changed(self, name: str) -> None:
        """A doc changed (any thread): its newest state goes to every page, DOC_EVERY_S apart
        at most, so a burst of writes costs one message per page, not one per write."""
        loop = self._loop
        if loop is None:
            return
        with self._lock:
            self._dirty_docs.add(name)
            if self._docs_due:
                return
            self._docs_due = True
        with contextlib.suppress(RuntimeError):  # the loop closed: no page to tell
            loop.call_soon_threadsafe(self._schedule_docs)

    def _schedule_docs(self) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_later(
                max(0.0, self._docs_sent_at + DOC_EVERY_S - time.monotonic()), self._send_docs
            )

    def _send_docs(self) -> None:
        with self._lock:
            names, self._dirty_docs = self._dirty_docs, set()
            self._docs_due = False
            clients = tuple(self._clients)
        self._docs_sent_at = time.monotonic()
        for name in sorted(names):
            doc = self._session.docs[name]
            text = wire(
                {
                    "type": "doc",
                    "name": name,
                    "version": doc.version,
                    "desired": thaw(doc.snapshot()),
                }
            )
            for client in clients:
                client.push_text(text, "doc", None, name)
