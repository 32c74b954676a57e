"""The page's part of a timing record: from egress to the pixels, and the clock that maps it.

A page reports, for each frame it shows, when the frame arrived, when it was decoded and when
it was presented, on its own clock (``performance.now()``). :class:`ClockOffset` estimates that
clock against the server's (``time.monotonic()``) from ping/pong exchanges, NTP-style: of the
recent exchanges, the one with the shortest round trip gives the offset, since its one-way
delays are the least uncertain. :class:`ClientTiming` holds the client hops of one record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rxstream._exceptions import ArgumentError

__all__ = ["ClientTiming", "ClockOffset"]


class ClockOffset:
    """A peer clock's offset against ours, from the shortest of the last ``window`` round trips.

    Each exchange is :meth:`add`-ed as ``(sent, peer, received)``: our clock when the ping
    left, the peer's clock when it answered, our clock when the answer came back (all in ms).
    Assuming the answer was taken halfway, ``offset = peer - (sent + received) / 2`` with an
    error of at most half the round trip; so the sample with the shortest round trip among the
    last ``window`` ones wins (older ones age out, which follows a drifting clock).
    """

    def __init__(self, window: int = 16) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ArgumentError(f"window must be an int >= 1 (exchanges), got {window!r}")
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._best: tuple[float, float] | None = None

    def add(self, sent: float, peer: float, received: float) -> bool:
        """Take one exchange; ``False`` (and nothing kept) when ``received < sent``."""
        rtt = received - sent
        if rtt < 0:
            return False
        self._samples.append((rtt, peer - (sent + received) / 2))
        self._best = min(self._samples)
        return True

    @property
    def offset_ms(self) -> float | None:
        """Peer clock minus ours, in ms; ``None`` before the first exchange."""
        return None if self._best is None else self._best[1]

    @property
    def rtt_ms(self) -> float | None:
        """The round trip of the winning exchange (the offset is good to half of it)."""
        return None if self._best is None else self._best[0]

    @property
    def samples(self) -> int:
        """Exchanges held now (at most ``window``)."""
        return len(self._samples)

    def to_local(self, peer_ms: float) -> float:
        """A time on the peer's clock as a time on ours (``ValueError`` before any exchange)."""
        if self._best is None:
            raise ValueError("no clock offset yet: add() a ping/pong exchange first")
        return peer_ms - self._best[1]


_FIELDS = ("up_ms", "net_ms", "decode_ms", "present_ms", "photon_ms", "rtt_ms")


@dataclass(frozen=True)
class ClientTiming:
    """The client hops of one record: what happened to the frame after egress, on the page.

    ``photon_ms = up_ms + total_ms + net_ms + decode_ms + present_ms`` (``up_ms`` counted 0
    when unknown), up to the rounding of the log line.
    """

    photon_ms: float
    """Input to pixels: from the page's input event (or ``input.recv`` when that page did not
    feed the input) to the frame's presentation."""
    net_ms: float
    """From egress (the sink's ``.out``) to the page receiving the frame: the socket's queue
    on the server and the transfer."""
    decode_ms: float
    """From the frame's arrival to its decoded picture (WebCodecs output, decoded JPEG; on the
    MSE path, to its presentation: the media buffer is in it)."""
    present_ms: float
    """From the decoded picture to its presentation (the page's next rendering update)."""
    up_ms: float | None = None
    """From the page's input event to ``input.recv`` on the server; ``None`` when the page
    that showed the frame did not feed its input."""
    rtt_ms: float = 0.0
    """The round trip of the clock estimate used: the mapping is good to half of it."""
    video: str = ""
    """The page's video path: ``webcodecs``, ``jpeg`` or ``mse``."""

    def fields(self) -> dict[str, Any]:
        """The flat fields a log line carries, rounded to 3 decimals."""
        flat: dict[str, Any] = {
            name: None if getattr(self, name) is None else round(getattr(self, name), 3)
            for name in _FIELDS
        }
        flat["video"] = self.video
        return flat

    @classmethod
    def from_fields(cls, flat: Mapping[str, Any]) -> ClientTiming:
        """The client hops of a line's fields (``KeyError``/``ValueError`` when malformed)."""
        up = flat.get("up_ms")
        return cls(
            photon_ms=float(flat["photon_ms"]),
            net_ms=float(flat["net_ms"]),
            decode_ms=float(flat["decode_ms"]),
            present_ms=float(flat["present_ms"]),
            up_ms=None if up is None else float(up),
            rtt_ms=float(flat.get("rtt_ms", 0.0)),
            video=str(flat.get("video", "")),
        )
