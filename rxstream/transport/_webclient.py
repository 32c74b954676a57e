"""What goes to a page, whatever its wire: how a frame is packed for it (``b"F"``, a 4-byte
big-endian header length, a JSON header, the encoded frame). :class:`Outbox` is the bounded
queue of text messages to one page: what does not fit is counted, and reported to the page in
a ``dropped`` message once there is room."""

from __future__ import annotations

import base64
import struct
from collections import deque
from typing import Any

from rxstream.transport._codecs import H264Fragments
from rxstream.transport._guard import wire

__all__ = ["MAX_DROPPED_IDS", "PINGS_S", "Outbox", "input_of", "pack", "pack_unit"]

_FRAME = b"F"
PINGS_S = (0.05,) * 8 + (2.0,)
"""The pauses between clock pings: a burst of 8, 50 ms apart, on attach, then one every 2 s
(the estimate keeps the shortest round trip of the last 16)."""


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


def input_of(timeline: tuple[tuple[str, float], ...]) -> str:
    """The input stream an item's timeline started at (``input.recv``, then ``<name>.in``)."""
    if len(timeline) > 1 and timeline[0][0] == "input.recv":
        return timeline[1][0].removesuffix(".in")
    return ""


def pack(header: dict[str, Any], data: bytes) -> bytes:
    head = wire(header).encode()
    return _FRAME + struct.pack(">I", len(head)) + head + data


def pack_unit(header: dict[str, Any], h264: H264Fragments) -> bytes:
    """A frame for a WebCodecs page: the access unit; a keyframe carries the decoder config.

    ``chain`` numbers the units the encoder made (1, 2, …): a frame the server did not encode
    (no page could take it) leaves no gap in it, so the page sees a missing reference only
    where a unit that was made did not reach it (``seq`` counts the stream's items, encoded or
    not)."""
    unit: dict[str, Any] = {
        **header,
        "codec": "h264",
        "format": "avc",
        "key": h264.keyframe,
        "chain": h264.frames,
    }
    if h264.keyframe:
        unit["config"] = {
            "codec": h264.codec_string,
            "description": base64.b64encode(h264.avcc or b"").decode(),
        }
    return pack(unit, h264.access_unit)
