"""One attached page of the web session: what it can play, what waits to be sent to it, and
how a frame is packed for it (``b"F"``, a 4-byte big-endian header length, a JSON header, the
encoded frame). :class:`Outbox` is the bounded queue of text messages to one page: what does
not fit is counted, and reported to the page in a ``dropped`` message once there is room."""

from __future__ import annotations

import asyncio
import base64
import struct
from collections import deque
from typing import Any

from aiohttp import web

from rxstream.timing._client import ClockOffset
from rxstream.transport._codecs import H264Fragments
from rxstream.transport._guard import ClientGuard, wire

__all__ = [
    "CLOCK_STEP_MAX_MS",
    "MAX_DROPPED_IDS",
    "PAGE_HEADERS",
    "PINGS_S",
    "Client",
    "Outbox",
    "input_of",
    "pack",
    "pack_unit",
    "peer_port",
]

_FRAME = b"F"
PINGS_S = (0.05,) * 8 + (2.0,)
"""The pauses between clock pings: a burst of 8, 50 ms apart, on attach, then one every 2 s
(the estimate keeps the shortest round trip of the last 16)."""


CLOCK_STEP_MAX_MS = 100.0
"""The coarsest page clock allowed for (Firefox's ``privacy.resistFingerprinting``: 100 ms)."""

_STEP_TOLERANCE_MS = 0.01
"""Differences of page clocks within this are equal (a step below it is a fine clock)."""


def _approximate_gcd(a: float, b: float) -> float:
    """The largest step of which ``a`` and ``b`` are both multiples, to _STEP_TOLERANCE_MS."""
    while b > _STEP_TOLERANCE_MS:
        rest = a % b
        a, b = b, (0.0 if min(rest, b - rest) <= _STEP_TOLERANCE_MS else rest)
    return a


MAX_DROPPED_IDS = 1024
"""The ids a ``dropped`` report lists at most (the rest are counted)."""


class Outbox:
    """The text messages waiting for one page: at most ``capacity`` of them and ``max_bytes``
    in all; none lost unsaid.

    A message that finds the queue full is dropped and counted by its ``type``, with its
    ``id`` when it was an ``ack`` or an ``error``. Once the queue is at most half full again
    (in count and in bytes),
    the next message out is ``{"type": "dropped", "counts": {type: n}, "ids": [...]}``, then
    the newest dropped state of each doc (a ``doc`` message that a later one did not replace).
    ``ids`` holds the first :data:`MAX_DROPPED_IDS` ids; ``ids_omitted`` counts the rest.
    """

    def __init__(self, capacity: int, max_bytes: int = 1 << 20) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0
        """The size of the texts waiting (JSON from ``wire`` is ASCII: a character a byte)."""
        self._texts: deque[str] = deque()
        self._counts: dict[str, int] = {}
        self._ids: list[Any] = []
        self._omitted = 0
        self._stale: dict[str, str] = {}
        self.dropped = 0
        """Text messages dropped on this connection so far."""

    def __len__(self) -> int:
        return len(self._texts) + bool(self._counts)

    def push(self, text: str, kind: str = "other", ident: Any = None, key: str = "") -> bool:
        """Queue ``text``; False (counted) when the queue is full."""
        fits = not self._texts or self.bytes + len(text) <= self.max_bytes
        if len(self._texts) < self.capacity and fits:
            self._texts.append(text)
            self.bytes += len(text)
            if kind == "doc":
                self._stale.pop(key, None)
            return True
        self.dropped += 1
        self._counts[kind] = self._counts.get(kind, 0) + 1
        if ident is not None:
            if len(self._ids) < MAX_DROPPED_IDS:
                self._ids.append(ident)
            else:
                self._omitted += 1
        if kind == "doc":
            self._stale[key] = text
        return False

    def pop(self) -> str | None:
        """The next text to send, or None when nothing waits."""
        if self._counts and self._half_empty():
            report: dict[str, Any] = {"type": "dropped", "counts": self._counts, "ids": self._ids}
            if self._omitted:
                report["ids_omitted"] = self._omitted
            self._counts, self._ids, self._omitted = {}, [], 0
            stale, self._stale = self._stale, {}
            self._texts.extend(stale.values())
            self.bytes += sum(map(len, stale.values()))
            return wire(report)
        if not self._texts:
            return None
        text = self._texts.popleft()
        self.bytes -= len(text)
        return text

    def _half_empty(self) -> bool:
        return len(self._texts) <= self.capacity // 2 and self.bytes <= self.max_bytes // 2


class Client:
    """One attached page: what it can play and what waits to be sent to it."""

    def __init__(self, ws: web.WebSocketResponse, frames: int, guard: ClientGuard) -> None:
        self.ws = ws
        self.guard = guard
        self.accept: frozenset[str] = frozenset(("jpeg", "raw"))
        self.frames: deque[bytes] = deque()
        self.texts = Outbox(guard.limits.queued_texts, guard.limits.queued_text_bytes)
        self.max_frames = frames
        self.ready = asyncio.Event()
        self.dropped = 0
        self.live: set[str] = set()
        """h264 streams this page is decoding: it had the init segment and a keyframe since
        it joined (or since its last dropped fragment)."""
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
        self.ping_due = False
        self.pings: deque[float] = deque(maxlen=16)
        """The times (server ms) of the pings sent lately: a pong must answer one of them."""
        self.number = 0
        self.transport: asyncio.Transport | None = None
        """The connection under the socket: cut when the page does not take a close frame."""

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

    def push_frame(self, stream: str, codec: str, data: bytes) -> None:
        if len(self.frames) >= self.max_frames:
            self.frames.popleft()
            self.dropped += 1
            if codec == "h264":  # a gap in the fragments: wait for the next keyframe
                self.live.discard(stream)
                return
        self.frames.append(data)
        self.ready.set()

    def push_text(self, text: str, kind: str = "other", ident: Any = None, key: str = "") -> None:
        if not self.texts.push(text, kind, ident, key):  # reported to the page once it reads
            self.guard.log.warning("web_texts_dropped", kind=kind, queued=len(self.texts))
        self.ready.set()


def input_of(timeline: tuple[tuple[str, float], ...]) -> str:
    """The input stream an item's timeline started at (``input.recv``, then ``<name>.in``)."""
    if len(timeline) > 1 and timeline[0][0] == "input.recv":
        return timeline[1][0].removesuffix(".in")
    return ""


PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
}
"""The page's URL holds the token: never cached, never sent as a referrer, never framed."""


def peer_port(request: web.Request) -> int | str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return peer[1] if isinstance(peer, tuple) and len(peer) > 1 else "?"


def pack(header: dict[str, Any], data: bytes) -> bytes:
    head = wire(header).encode()
    return _FRAME + struct.pack(">I", len(head)) + head + data


def pack_unit(header: dict[str, Any], h264: H264Fragments) -> bytes:
    """A frame for a WebCodecs page: the access unit; a keyframe carries the decoder config."""
    unit: dict[str, Any] = {**header, "codec": "h264", "format": "avc", "key": h264.keyframe}
    if h264.keyframe:
        unit["config"] = {
            "codec": h264.codec_string,
            "description": base64.b64encode(h264.avcc or b"").decode(),
        }
    return pack(unit, h264.access_unit)
