"""An in-memory page link for the page protocol's tests: what the protocol sends to one page
is kept in lists, and the bytes it would find unsent are the test's to say."""

from __future__ import annotations

import json
import struct
from typing import Any

from rxstream.transport._guard import ClientGuard, SessionLimits
from rxstream.transport._linkestimate import LinkEstimate
from rxstream.transport._page import Page


class MemoryLink:
    """A page's link held in memory: frames and texts in lists, ``unsent`` set by the test."""

    def __init__(self, peer: str = "memory:1", frames: int = 1 << 20) -> None:
        self._peer = peer
        self.max_frames = frames
        self.frames: list[bytes] = []
        self.texts: list[str] = []
        self.unsent = 0
        self.closed = False

    @property
    def peer(self) -> str:
        return self._peer

    def unsent_bytes(self) -> int:
        return self.unsent

    def send_frame(self, stream: str, data: bytes) -> bool:
        if len(self.frames) >= self.max_frames:
            return False
        self.frames.append(data)
        return True

    def send_text(self, text: str, kind: str = "other", ident: Any = None, key: str = "") -> None:
        self.texts.append(text)

    def close(self) -> None:
        self.closed = True

    def messages(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The JSON texts sent so far (of ``kind`` only, when given)."""
        parsed = [json.loads(t) for t in self.texts]
        return [m for m in parsed if kind is None or m["type"] == kind]

    def headers(self) -> list[dict[str, Any]]:
        """The JSON headers of the frames sent so far."""
        out = []
        for data in self.frames:
            (length,) = struct.unpack(">I", data[1:5])
            out.append(json.loads(data[5 : 5 + length]))
        return out


def memory_page(limits: SessionLimits | None = None) -> Page:
    """A page on a MemoryLink, outside any protocol (a handler's unit tests)."""
    limits = SessionLimits() if limits is None else limits
    return Page(MemoryLink(), ClientGuard(limits, "memory:1", {}), LinkEstimate())
