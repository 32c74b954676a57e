"""Rate control per page, applied to the shared encoders.

Each page that acknowledges its frames has a :class:`RateController` per stream, fed with its
link (``Page.link_state()``) on every frame of that stream. An encoder is shared by every page
of a stream that plays its codec, so it follows the lowest rate any of those pages asks for
(the narrowest link's: pages on wider links get that rate too); each time that changes the
pages of the encoder get a ``rate`` message.
"""

from __future__ import annotations

from rxstream.transport._codecs import Encoder, H264Fragments, JpegEncoder
from rxstream.transport._guard import wire
from rxstream.transport._page import Page
from rxstream.transport._rate import RateController, RateDecision, apply_rate, rate_message

__all__ = [
    "BITS_PER_PIXEL",
    "RATE_MAX_KBPS",
    "RATE_MIN_KBPS",
    "RATE_START_KBPS",
    "SharedRates",
    "ceiling_kbps",
]


def ceiling_kbps(made: Encoder, fps: float) -> float:
    """The bitrate ceiling of the pages of ``made``: for h264 :data:`BITS_PER_PIXEL` of its
    frames' size at ``fps`` within :data:`RATE_MIN_KBPS`..:data:`RATE_MAX_KBPS`; else (JPEG,
    whose quality spans the range, or a size not known yet) :data:`RATE_MAX_KBPS`."""
    size = made.size if isinstance(made, H264Fragments) else None
    if size is None:
        return RATE_MAX_KBPS
    width, height = size
    return max(RATE_MIN_KBPS, min(RATE_MAX_KBPS, BITS_PER_PIXEL * width * height * fps / 1e3))


RATE_START_KBPS = 1500.0
"""A page's bitrate before its link is known: a shared h264 encoder is opened bounded at it
(with rate control on), so that a cut takes effect from the next frame."""

RATE_MIN_KBPS = 150.0
"""The floor of a page's bitrate (below it, the controller lowers the resolution)."""

RATE_MAX_KBPS = 4000.0
"""The ceiling of a page's bitrate."""

BITS_PER_PIXEL = 1.0
"""An h264 stream's ceiling follows its size: a bit a pixel a frame (885 kbit/s for 256x144
at 24 fps; 720p at 24 fps reaches :data:`RATE_MAX_KBPS`). More bits make no better picture at
that size, only bigger frames, and a bigger frame reaches the page later on a link with a
round trip: TCP paces each burst at its estimate of the rate (BBR's, for a stream that sends a
frame at a time, near the stream's own), and each of its packets may be lost."""


class SharedRates:
    """The rate controllers of the pages and what each shared encoder was last set to."""

    def __init__(self, *, fps: float) -> None:
        self.fps = fps
        self._applied: dict[tuple[str, str], RateDecision] = {}

    def follow(self, stream: str, codec: str, pages: list[Page], made: Encoder) -> None:
        """Update the controllers of ``pages`` (those playing ``stream`` in ``codec`` through
        ``made``) and set ``made`` to the lowest rate they ask for; tell them when it changed."""
        if not isinstance(made, H264Fragments | JpegEncoder):
            return
        decisions = []
        for page in pages:
            if not page.estimate.acks:  # a page that does not ack has no estimate to follow
                continue
            control = page.rates.get(stream)
            if control is None:
                ceiling = ceiling_kbps(made, self.fps)
                control = page.rates[stream] = RateController(
                    start_kbps=min(RATE_START_KBPS, ceiling),
                    min_kbps=RATE_MIN_KBPS,
                    max_kbps=ceiling,
                    fps=self.fps,
                    stream=stream,
                )
            control.update(page.link_state())
            # it moved (the link is known), or it starts below what the encoder was opened at
            if control.current.reason != "start" or _above(made, control.current):
                decisions.append(control.current)
        if not decisions:
            return
        lowest = min(decisions, key=lambda d: (d.bitrate_kbps, d.scale))
        key = (stream, codec)
        if self._applied.get(key) == lowest:
            return
        self._applied[key] = lowest
        apply_rate(made, lowest)
        text = wire(rate_message(stream, lowest))
        for page in pages:
            page.push_text(text, "rate")

    def applied(self, stream: str, codec: str) -> RateDecision | None:
        """What ``stream``'s ``codec`` encoder was last set to (None: never, unbounded)."""
        return self._applied.get((stream, codec))

    def forget(self) -> None:
        """The encoders closed: nothing is set on them."""
        self._applied.clear()


def _above(made: Encoder, decision: RateDecision) -> bool:
    """Whether ``made`` is an h264 encoder set above ``decision``'s bitrate (or unbounded)."""
    if not isinstance(made, H264Fragments):
        return False
    kbps = made.bitrate_kbps
    return kbps is None or kbps > decision.bitrate_kbps
