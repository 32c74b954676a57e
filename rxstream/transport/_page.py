"""One attached page as the protocol knows it, whatever its wire: what it can play, the h264
streams it decodes, its clock against the server's, its link estimate and the frames it was
not sent (by reason). Its connection is a :class:`~rxstream.transport._link.PageLink`."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from rxstream.timing._client import ClockOffset
from rxstream.transport._guard import ClientGuard
from rxstream.transport._link import PageLink
from rxstream.transport._linkestimate import LinkEstimate
from rxstream.transport._rate import LinkState, RateController

__all__ = ["CLOCK_STEP_MAX_MS", "DROP_REASONS", "Page"]

CLOCK_STEP_MAX_MS = 100.0
"""The coarsest page clock allowed for (Firefox's ``privacy.resistFingerprinting``: 100 ms)."""

DROP_REASONS = ("link", "queue")
"""Why a frame was not sent to a page: ``link`` (it would have queued: more in flight or
unsent than the link carries), ``queue`` (the link's own frame queue was full)."""

_STEP_TOLERANCE_MS = 0.01
"""Differences of page clocks within this are equal (a step below it is a fine clock)."""


def _approximate_gcd(a: float, b: float) -> float:
    """The largest step of which ``a`` and ``b`` are both multiples, to _STEP_TOLERANCE_MS."""
    while b > _STEP_TOLERANCE_MS:
        rest = a % b
        a, b = b, (0.0 if min(rest, b - rest) <= _STEP_TOLERANCE_MS else rest)
    return a


class Page:
    """One attached page: what it can play, its clock, its link, what it missed."""

    def __init__(self, link: PageLink, guard: ClientGuard, estimate: LinkEstimate) -> None:
        self.link = link
        self.guard = guard
        self.estimate = estimate
        """Its link's delivery rate, round trips and bytes in flight (from its ``got``s)."""
        self.lock = threading.Lock()
        """Held around the estimate and the drop counts (the pipeline sends, the wire acks)."""
        self.accept: frozenset[str] = frozenset(("jpeg", "raw"))
        self.drops: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        """Frames not sent to this page, by reason (DROP_REASONS)."""
        self.sizes: dict[tuple[str, str], int] = {}
        """The size of the last frame of each (stream, codec) sent: a frame's size before it
        is encoded."""
        self.rates: dict[str, RateController] = {}
        """This page's rate controller per stream (once it acks its frames)."""
        self.live: set[str] = set()
        """h264 streams this page is decoding: it had the init segment and a keyframe since
        it joined (or since its last dropped fragment)."""
        self.owed_cutover: set[str] = set()
        """Streams whose cutover frame this page missed (dropped, or waiting for a keyframe):
        the next frame it gets of each is marked the cutover."""
        self.clock = ClockOffset()
        """This page's ``performance.now()`` against the server's monotonic clock."""
        self.clock_jumps: list[tuple[float, float]] = []
        """The offsets and round trips of the ``pong``s in a row that contradicted the
        estimate: ``CLOCK_JUMPS`` of them that agree with each other start it over."""
        self.clock_grid = 0.0
        """The grid of this page's clock (ms): the approximate gcd of the differences between
        its pongs' ``c`` (a coarsened ``performance.now()``), 0 until 3 were seen or for a
        fine clock."""
        self.clock_scatter = 0.0
        """The spread of contradicting pongs that did not agree with each other (ms): a
        clock coarsened with jitter off its grid."""
        self._clock_last: float | None = None
        self._clock_gcd: float | None = None
        self._clock_diffs = 0
        self.pongs_unused = 0
        """``pong``s acked but not used for the estimate (a round trip over ``MAX_RTT_MS``
        or a page clock that contradicts it)."""
        self.pings: deque[float] = deque(maxlen=16)
        """The times (server ms) of the pings sent lately: a pong must answer one of them."""
        self.number = 0
        """This page's number in the session (1 for the first attached; reloads count)."""

    @property
    def dropped(self) -> int:
        """Frames not sent to this page, all reasons."""
        return sum(self.drops.values())

    def drop(self, reason: str) -> None:
        """A frame was not sent to this page, for ``reason`` (DROP_REASONS)."""
        with self.lock:
            self.drops[reason] += 1
            if reason == "link":
                self.estimate.dropped()

    def link_state(self) -> LinkState:
        """This page's link now, for the rate controller (its ``dropped`` counts the frames
        not sent for the link since the last call)."""
        with self.lock:
            return self.estimate.state()

    def saw_clock(self, page: float) -> None:
        """A pong's ``c``: refine ``clock_step`` with its difference from the last one."""
        last, self._clock_last = self._clock_last, page
        if last is None or page == last:
            return
        diff = abs(page - last)
        gcd = diff if self._clock_gcd is None else _approximate_gcd(self._clock_gcd, diff)
        self._clock_gcd = gcd
        self._clock_diffs += 1
        if self._clock_diffs >= 2:
            self.clock_grid = gcd if gcd > 5 * _STEP_TOLERANCE_MS else 0.0

    @property
    def clock_step(self) -> float:
        """How far one ``c`` of this page may be off its true clock (ms): its grid or its
        scatter, at most ``CLOCK_STEP_MAX_MS``."""
        return min(max(self.clock_grid, self.clock_scatter), CLOCK_STEP_MAX_MS)

    def push_text(self, text: str, kind: str = "other", ident: Any = None, key: str = "") -> None:
        """Send ``text`` on this page's link."""
        self.link.send_text(text, kind, ident, key)
