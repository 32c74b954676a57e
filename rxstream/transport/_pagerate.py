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

__all__ = ["RATE_MAX_KBPS", "RATE_MIN_KBPS", "RATE_START_KBPS", "SharedRates"]

RATE_START_KBPS = 1500.0
"""A page's bitrate before its link is known: a shared h264 encoder is opened bounded at it
(with rate control on), so that a cut takes effect from the next frame."""

RATE_MIN_KBPS = 150.0
"""The floor of a page's bitrate (below it, the controller lowers the resolution)."""

RATE_MAX_KBPS = 4000.0
"""The ceiling of a page's bitrate."""


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
                control = page.rates[stream] = RateController(
                    start_kbps=RATE_START_KBPS,
                    min_kbps=RATE_MIN_KBPS,
                    max_kbps=RATE_MAX_KBPS,
                    fps=self.fps,
                    stream=stream,
                )
            control.update(page.link_state())
            if control.current.reason != "start":  # it moved: the link is known
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
