"""Rate control in the loop: a real h264 encoder, its decisions applied, over a simulated
link (serialization at the link's rate, a fixed delay, frames held back at the server while
more than a frame waits) on a virtual clock."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from rxstream.transport import H264Fragments, LinkState, RateController, apply_rate

FPS = 24
DELAY_S = 0.02  # each way: a 40 ms round trip
_TEXTURE = np.random.default_rng(11).integers(0, 256, (480, 640, 3), dtype=np.uint8)


def moving(index: int) -> np.ndarray:
    """A noisy texture panning 3 px a frame: it takes all the bits it is given."""
    y, x = index % 240, (3 * index) % 320
    return np.ascontiguousarray(_TEXTURE[y : y + 240, x : x + 320])


class Loop:
    """Frames from the encoder onto a link of ``capacity_kbps``, the estimate from their
    acknowledgements, the controller's decisions back onto the encoder."""

    def __init__(self, capacity_kbps: float) -> None:
        self.capacity_kbps = capacity_kbps
        self.h264 = H264Fragments(fps=FPS, stream="video", bitrate_kbps=1500)
        self.rate = RateController(
            start_kbps=1500, min_kbps=100, max_kbps=3000, fps=FPS, stream="video"
        )
        self.index = 0
        self.link_free_s = 0.0
        self.unacked: deque[tuple[float, float, int]] = deque()  # (ack at, sent at, bytes)
        self.acked: deque[tuple[float, int]] = deque()
        self.sent: deque[tuple[float, int]] = deque()
        self.rtts: deque[tuple[float, float]] = deque()
        self.rtt_ms: float | None = None
        self.dropped = 0
        self.log: list[tuple[float, int | None]] = []  # (time, bytes sent or None: dropped)

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds * FPS)):
            now = self.index / FPS
            if self.link_free_s - now > 1 / FPS:  # more than a frame waits: hold this one
                self.dropped += 1
                self.log.append((now, None))
            else:
                self.h264.encode(moving(self.index))
                size = len(self.h264.access_unit)
                done = max(now, self.link_free_s) + size * 8 / (self.capacity_kbps * 1000)
                self.link_free_s = done
                self.unacked.append((done + 2 * DELAY_S, now, size))
                self.sent.append((now, size))
                self.log.append((now, size))
            self.index += 1
            if self.index % 3 == 0:  # a link state every 125 ms
                decision = self.rate.update(self.state(now))
                if decision is not None:
                    apply_rate(self.h264, decision)

    def state(self, now: float) -> LinkState:
        while self.unacked and self.unacked[0][0] <= now:
            at, sent_at, size = self.unacked.popleft()
            rtt = (at - sent_at) * 1000
            self.rtt_ms = rtt if self.rtt_ms is None else self.rtt_ms + (rtt - self.rtt_ms) / 8
            self.rtts.append((at, rtt))
            self.acked.append((at, size))
        for window, span in ((self.acked, 0.75), (self.sent, 0.75), (self.rtts, 10.0)):
            while window and window[0][0] < now - span:
                window.popleft()
        delivery = None
        if len(self.acked) > 1 and self.acked[-1][0] > self.acked[0][0]:
            acked_bits = 8 * sum(n for _, n in list(self.acked)[1:])
            delivery = acked_bits / (self.acked[-1][0] - self.acked[0][0])
        sent_span = now - self.sent[0][0] if self.sent else 0.0
        sent_bps = 8 * sum(n for _, n in self.sent) / sent_span if sent_span > 0 else 0.0
        dropped, self.dropped = self.dropped, 0
        return LinkState(
            now_s=now,
            delivery_bps=delivery,
            rtt_ms=self.rtt_ms,
            min_rtt_ms=min(r for _, r in self.rtts) if self.rtts else None,
            inflight_bytes=sum(n for _, _, n in self.unacked),
            sent_bps=sent_bps,
            dropped=dropped,
        )

    def last(self, seconds: float) -> tuple[float, float]:
        """Over the last ``seconds``: the kbit/s sent, and the share of frames sent."""
        recent = self.log[-round(seconds * FPS) :]
        sizes = [size for _, size in recent if size is not None]
        return sum(sizes) * 8 / seconds / 1000, len(sizes) / len(recent)


@pytest.mark.slow
def test_the_encoder_follows_a_narrow_link_down_and_a_wide_one_back_up() -> None:
    """Started at 1.5 Mbit/s on a 300 kbit/s link, the encoded rate settles under the link's
    (using a good part of it) and almost every frame is sent; the link widened, it climbs
    back to several times that."""
    loop = Loop(300)
    loop.run(12)
    low_kbps, low_sent = loop.last(6)
    assert 0.4 * 300 <= low_kbps <= 300
    assert low_sent >= 0.8
    assert loop.rate.changes.down >= 1
    loop.capacity_kbps = 5000
    loop.run(20)
    high_kbps, high_sent = loop.last(4)
    assert high_kbps >= 3 * low_kbps
    assert high_sent >= 0.95
    assert loop.rate.current.bitrate_kbps == 3000
    assert loop.rate.changes.up >= 5
