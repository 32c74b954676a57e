"""A page that went silent: the server's side of an outage.

A page answers the server's ``ping`` (every ``PINGS_S[-1]``, 2 s) with a ``pong``, so a page
that sent nothing for longer than :func:`silent_bound` is gone (its link is down, or its TCP
connection is half-open: no FIN ever comes). :class:`Silence` notices that and cuts the
connection, so the page counts as left, the session's grace starts, and a run does not wait
forever on a connection that no longer leads anywhere. A page that comes back within the grace
resumes the same session on a new socket (the page's own reconnect, static/index.html).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from rxstream.transport._guard import ClientGuard
from rxstream.transport._webclient import PINGS_S

__all__ = ["SILENT_MIN_S", "Silence", "resume_fields", "silent_bound"]

SILENT_MIN_S = 2 * PINGS_S[-1] + 1.0
"""The shortest silence that cuts a page (5 s): two pings unanswered and a second to spare,
so a live page on a slow link is never cut between pongs."""


def silent_bound(grace_s: float) -> float:
    """How long a page may send nothing before its connection is cut: the session's grace,
    at least :data:`SILENT_MIN_S`."""
    return max(grace_s, SILENT_MIN_S)


def resume_fields(grace_s: float) -> dict[str, Any]:
    """What the ``session`` message tells the page of an outage: how long the session waits
    for it (``grace_s``) and how long the server waits on a silent link (``silent_s``)."""
    return {"grace_s": grace_s, "silent_s": silent_bound(grace_s)}


class Silence:
    """When one connection last heard from its page; :meth:`watch` cuts it once silent."""

    def __init__(self, bound_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.bound_s = bound_s
        self._clock = clock
        self.heard = clock()
        """The server's monotonic time of the page's last message (or of the attach)."""
        self.cut = False
        """Whether :meth:`watch` cut the connection for its silence."""

    def hear(self) -> None:
        """The page sent something: it is there."""
        self.heard = self._clock()

    @property
    def silent_s(self) -> float:
        return self._clock() - self.heard

    async def watch(self, transport: asyncio.Transport | None, guard: ClientGuard) -> None:
        """Cut ``transport`` (abort: a half-open peer never takes a close frame) once the page
        was silent for longer than the bound; check a few times per bound."""
        step = max(0.05, self.bound_s / 8)
        while True:
            silent = self.silent_s
            if silent > self.bound_s:
                guard.log.warning(
                    "web_page_silent",
                    silent_s=round(silent, 2),
                    bound_s=self.bound_s,
                    action="connection cut: the page sent nothing (not even a pong) past the "
                    "bound; the session waits its grace for the page to reconnect",
                )
                self.cut = True
                if transport is not None:
                    transport.abort()
                return
            await asyncio.sleep(min(step, self.bound_s - silent + 0.01))
