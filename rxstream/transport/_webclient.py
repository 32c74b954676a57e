"""One attached page of the web session: what it can play, what waits to be sent to it, and
how a frame is packed for it (``b"F"``, a 4-byte big-endian header length, a JSON header, the
encoded frame)."""

from __future__ import annotations

import asyncio
import base64
import struct
from collections import deque
from typing import Any

from aiohttp import web

from rxstream.timing._client import ClockOffset
from rxstream.transport._codecs import H264Fragments
from rxstream.transport._guard import ClientGuard, Outbox, wire

__all__ = ["PAGE_HEADERS", "PINGS_S", "Client", "input_of", "pack", "pack_unit", "peer_port"]

_FRAME = b"F"
PINGS_S = (0.05,) * 8 + (2.0,)
"""The pauses between clock pings: a burst of 8, 50 ms apart, on attach, then one every 2 s
(the estimate keeps the shortest round trip of the last 16)."""


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
        self.clock_jumps = 0
        """``pong``s in a row that contradicted the estimate (see ``CLOCK_JUMPS``)."""
        self.ping_due = False
        self.pings: deque[float] = deque(maxlen=16)
        """The times (server ms) of the pings sent lately: a pong must answer one of them."""
        self.number = 0
        self.transport: asyncio.Transport | None = None
        """The connection under the socket: cut when the page does not take a close frame."""

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
