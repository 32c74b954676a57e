"""The session's state messages to the pages: ``session`` on attach, and each doc's newest
state after it changed (``doc``), coalesced: a burst of writes reaches each page as one or a
few states, ``DOC_EVERY_S`` apart at most, the last the newest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rxstream.doc import controls
from rxstream.doc._snapshot import thaw
from rxstream.transport._base import Session
from rxstream.transport._guard import wire
from rxstream.transport._link import Timer
from rxstream.transport._page import Page

__all__ = ["DOC_EVERY_S", "DocStates", "session_message"]

DOC_EVERY_S = 0.05
"""Doc states go to the pages at most this often (the newest state; a burst of writes is one
message per page)."""


def session_message(session: Session) -> str:
    """The ``session`` message: streams, inputs, each doc's state and controls."""
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


class DocStates:
    """Each doc's newest state to every page, DOC_EVERY_S apart at most.

    ``session`` gives the open session, ``pages`` the pages attached now; ``timer`` (set by
    :meth:`start`, None while no wire runs) calls back on the wire's thread.
    """

    def __init__(
        self, *, session: Callable[[], Session], pages: Callable[[], tuple[Page, ...]]
    ) -> None:
        self._session = session
        self._pages = pages
        self._timer: Timer | None = None
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._due = False
        self._sent_at = 0.0

    def start(self, timer: Timer | None) -> None:
        """Send through ``timer`` from now on (None: stop; a state owed is no longer owed)."""
        with self._lock:
            self._timer = timer
            self._dirty.clear()
            self._due = False

    def listener(self, name: str) -> Callable[[Any], None]:
        """The doc ``name``'s snapshot subscriber."""
        return lambda _snapshot: self.changed(name)

    def changed(self, name: str) -> None:
        """A doc changed (any thread): its newest state goes to every page, DOC_EVERY_S apart
        at most, so a burst of writes costs one message per page, not one per write."""
        with self._lock:
            timer = self._timer
            if timer is None:
                return
            self._dirty.add(name)
            if self._due:
                return
            self._due = True
        delay = max(0.0, self._sent_at + DOC_EVERY_S - time.monotonic())
        try:
            timer(delay, self._send)
        except RuntimeError:  # the wire's loop closed: no page to tell
            with self._lock:
                self._due = False

    def _send(self) -> None:
        with self._lock:
            names, self._dirty = self._dirty, set()
            self._due = False
        pages = self._pages()
        self._sent_at = time.monotonic()
        session = self._session()
        for name in sorted(names):
            doc = session.docs[name]
            text = wire(
                {
                    "type": "doc",
                    "name": name,
                    "version": doc.version,
                    "desired": thaw(doc.snapshot()),
                }
            )
            for page in pages:
                page.push_text(text, "doc", None, name)
