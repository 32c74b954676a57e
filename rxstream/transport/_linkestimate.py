"""One page's link as the server sees it from the page's own frame acknowledgements.

Each frame handed to a page's link is recorded (its size and send time); the page answers
each frame it receives with a ``got`` (before decoding it). From those the estimate keeps the
delivery rate, the smoothed and the minimum round trip (send to ack), and the bytes in flight
(sent, not yet acknowledged). Each ack is a delivery-rate sample, as BBR takes them: the bytes
acknowledged while that frame was in flight over its round trip; the rate is the highest
sample of the last :data:`DELIVERY_WINDOW_S` (the samples of a link that is not kept full —
frames a frame-time apart — read low, the highest reads what the link carried).
:meth:`LinkEstimate.admits` is the per-frame decision of latency-first delivery; its
:meth:`LinkEstimate.state` is the rate controller's input (:class:`LinkState`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from rxstream.transport._rate import LinkState

__all__ = [
    "DELIVERY_WINDOW_S",
    "FORGET_S",
    "MAX_INFLIGHT_FRAMES",
    "MIN_RTT_WINDOW_S",
    "UNSENT_SLACK_BYTES",
    "LinkEstimate",
]

DELIVERY_WINDOW_S = 0.75
"""The delivery rate is what the page acknowledged over this long (and the offered rate what
was sent over it)."""

MIN_RTT_WINDOW_S = 10.0
"""The minimum round trip is the lowest of this long."""

FORGET_S = 1.0
"""A frame not acknowledged after this long (or four smoothed round trips, the longer) is
forgotten: no longer in flight (a page that stopped acking is then paced by its socket)."""

MAX_INFLIGHT_FRAMES = 256
"""Frames remembered in flight at most (the oldest is forgotten first)."""

UNSENT_SLACK_BYTES = 16 * 1024
"""A frame is sent while at most this much (or one frame, the larger) waits unsent on the
link: another stream's frame just handed over, the tail of the last one."""


class LinkEstimate:
    """Delivery rate, round trips and bytes in flight of one page, from its ``got`` acks."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._inflight: dict[tuple[str, int], tuple[float, int, int]] = {}
        self.inflight_bytes = 0
        """Bytes sent to the page and not yet acknowledged (nor forgotten)."""
        self._rates: deque[tuple[float, float]] = deque()
        self._delivered = 0
        self._sent: deque[tuple[float, int]] = deque()
        self._acked: deque[tuple[float, int]] = deque()
        self._drops: deque[float] = deque()
        self._rtts: deque[tuple[float, float]] = deque()
        self.rtt_ms: float | None = None
        """The smoothed round trip, send to ack (ms; 1/8 of each new sample)."""
        self.acks = 0
        """Frames acknowledged so far (0: the page does not ack; no in-flight rule)."""
        self.forgotten = 0
        """Frames forgotten unacknowledged (FORGET_S)."""
        self._dropped = 0

    @property
    def min_rtt_ms(self) -> float | None:
        """The lowest round trip of the last MIN_RTT_WINDOW_S (ms)."""
        return min(r for _, r in self._rtts) if self._rtts else None

    @property
    def delivery_bps(self) -> float | None:
        """The highest delivery-rate sample of the last DELIVERY_WINDOW_S (bits/s; None: no
        ack in it)."""
        self._trim(self._clock())
        return max(r for _, r in self._rates) if self._rates else None

    def sent(self, stream: str, seq: int, size: int) -> None:
        """A frame of ``size`` bytes was handed to the link."""
        now = self._clock()
        self._forget(now)
        key = (stream, seq)
        if key in self._inflight:
            return
        if len(self._inflight) >= MAX_INFLIGHT_FRAMES:
            self._drop_oldest()
            self.forgotten += 1
        self._inflight[key] = (now, size, self._delivered)
        self.inflight_bytes += size
        self._sent.append((now, size))

    def acked(self, stream: str, seq: int) -> float | None:
        """The page received frame ``seq`` of ``stream``: its round trip (ms), or None for a
        frame not in flight (forgotten, acked twice, never sent)."""
        entry = self._inflight.pop((stream, seq), None)
        if entry is None:
            return None
        now = self._clock()
        sent_at, size, delivered = entry
        self.inflight_bytes -= size
        self._delivered += size
        self._acked.append((now, size))
        rtt = (now - sent_at) * 1e3
        flight = max(now - sent_at, 1e-4)  # what the page took while this frame flew
        self._rates.append((now, 8.0 * (self._delivered - delivered) / flight))
        self.rtt_ms = rtt if self.rtt_ms is None else self.rtt_ms + (rtt - self.rtt_ms) / 8
        self._rtts.append((now, rtt))
        self.acks += 1
        self._trim(now)
        return rtt

    def dropped(self) -> None:
        """A frame was not sent to this page for the link."""
        self._dropped += 1
        self._drops.append(self._clock())

    def admits(self, size: int, unsent: int) -> bool:
        """Whether a frame of about ``size`` bytes may go now: at most about one frame waits
        unsent on the link, and (once the page acks) the bytes in flight are within what the
        link carries in a minimum round trip (delivery rate x min RTT) plus one frame."""
        if unsent > max(size, UNSENT_SLACK_BYTES):
            return False
        if not self.acks:
            return True
        self._forget(self._clock())
        rate, floor = self.delivery_bps, self.min_rtt_ms
        if rate is None or floor is None:
            return True
        return self.inflight_bytes <= rate / 8 * floor / 1e3 + size

    def state(self) -> LinkState:
        """The estimate now (the rate controller's input); ``dropped`` counts the frames not
        sent for the link since the last state."""
        now = self._clock()
        self._forget(now)
        self._trim(now)
        # the frames offered over a window a round trip back, against the acks of the last
        # window: a link that keeps up acknowledges about all of them, whatever the spacing
        lag = (self.rtt_ms or 0.0) / 1e3
        offered = sum(n for t, n in self._sent if now - lag - DELIVERY_WINDOW_S < t <= now - lag)
        acked = sum(n for _, n in self._acked)
        recent = sum(1 for t, _ in self._sent if t >= now - DELIVERY_WINDOW_S)
        drops = len(self._drops)
        sent_bps = 8.0 * offered / DELIVERY_WINDOW_S
        dropped, self._dropped = self._dropped, 0
        return LinkState(
            now_s=now,
            delivery_bps=self.delivery_bps,
            rtt_ms=self.rtt_ms,
            min_rtt_ms=self.min_rtt_ms,
            inflight_bytes=self.inflight_bytes,
            sent_bps=sent_bps,
            dropped=dropped,
            acked_bps=8.0 * acked / DELIVERY_WINDOW_S if self.acks else None,
            dropped_share=drops / (drops + recent) if drops + recent else 0.0,
        )

    def _trim(self, now: float) -> None:
        sent_horizon = DELIVERY_WINDOW_S + max(FORGET_S, 4e-3 * (self.rtt_ms or 0.0))
        for window, horizon in (
            (self._rates, DELIVERY_WINDOW_S),
            (self._acked, DELIVERY_WINDOW_S),
            (self._sent, sent_horizon),
            (self._rtts, MIN_RTT_WINDOW_S),
        ):
            while window and window[0][0] < now - horizon:
                window.popleft()
        while self._drops and self._drops[0] < now - DELIVERY_WINDOW_S:
            self._drops.popleft()

    def _forget(self, now: float) -> None:
        horizon = max(FORGET_S, 4e-3 * (self.rtt_ms or 0.0))
        while self._inflight:
            sent_at, _, _ = next(iter(self._inflight.values()))
            if sent_at >= now - horizon:
                return
            self._drop_oldest()
            self.forgotten += 1

    def _drop_oldest(self) -> None:
        key = next(iter(self._inflight))
        _, size, _ = self._inflight.pop(key)
        self.inflight_bytes -= size
