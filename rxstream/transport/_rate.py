"""Rate control: the encoder's bitrate follows one page's link.

:class:`RateController` is pure (no I/O, no clock of its own): the web transport hands it a
:class:`LinkState` (the per-page estimate from the page's own acknowledgements) now and then,
applies the :class:`RateDecision` it returns to that page's encoder (:func:`apply_rate`) and
tells the page (:func:`rate_message`).

The link is congested when frames were dropped for it (more than :data:`DROP_SHARE` of a
window's), when the round trip rose :data:`QUEUE_FRAMES` frames' time above its minimum (a
queue is building) or when the page acknowledges a fifth less than was offered; the bitrate
then falls at once to :data:`BACKOFF` of the rate the page was measured receiving (the lower
of the delivery rate and the acknowledged rate: a link that just narrowed shows in the
second first, down to :data:`MOST_CUT` of the bitrate). With room (no drops, the
round trip within :data:`ROOM_FRAMES` of its minimum, about all that was offered delivered)
it probes back up by :data:`PROBE_STEP`, one step per round trip (at least
:data:`PROBE_EVERY_S`), and cautiously near the bitrate where it last found congestion
(:data:`NEAR_CEILING`). Only at its floor, frames still dropping, it lowers the resolution
(:data:`SCALES`), and raises it again after :data:`SCALE_UP_AFTER_S` of room.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rxstream._exceptions import ArgumentError
from rxstream._util import library_logger
from rxstream.transport._codecs import Encoder, H264Fragments, JpegEncoder

__all__ = [
    "BACKOFF",
    "DROP_SHARE",
    "JPEG_QUALITY_RANGE",
    "MOST_CUT",
    "PROBE_EVERY_S",
    "PROBE_STEP",
    "QUEUE_FRAMES",
    "ROOM_FRAMES",
    "SCALES",
    "SCALE_UP_AFTER_S",
    "LinkState",
    "RateChanges",
    "RateController",
    "RateDecision",
    "apply_rate",
    "jpeg_quality",
    "rate_message",
]

_log = library_logger("rxstream")

BACKOFF = 0.85
"""On congestion the bitrate becomes this fraction of the rate the page was measured
receiving (or of the current bitrate, when that is lower or not known)."""

MOST_CUT = 0.5
"""The acknowledged rate counts as what the page received down to this fraction of the
bitrate, no lower: a page that stops acknowledging for a moment (busy, its link fine) reads
as a link that carries nothing, and costs a step to about 0.4, not the floor."""

PROBE_STEP = 1.12
"""With room, the bitrate grows by this factor a step."""

PROBE_EVERY_S = 0.3
"""The shortest time between two steps up (a step is at least a round trip apart), and the
room a step needs first."""

HOLD_AFTER_DOWN_S = 0.5
"""After a step down: no further step down for this long (or two round trips, the longer),
so the cut shows in the link's figures before the next is judged; and no step up for
:data:`HOLD_UP_AFTER_DOWN_S`."""

HOLD_UP_AFTER_DOWN_S = 3.0
"""No step up for this long after a step down: the hysteresis that keeps a link at its
capacity from flapping."""

NEAR_CEILING = 0.9
"""Above this fraction of the bitrate where congestion was last found (and below it),
the bitrate probes cautiously: by :data:`NEAR_CEILING_STEP`, every
:data:`NEAR_CEILING_EVERY_S`. Past it with room, the link has grown: that rate is forgotten
and the probe is fast again."""

NEAR_CEILING_STEP = 1.08

NEAR_CEILING_EVERY_S = 4.0

CEILING_FORGET_S = 20.0
"""The rate where congestion was last found is forgotten after this long."""

SCALES = (1.0, 0.75, 0.5)
"""The resolutions, as a fraction of the frame's own width and height, the last resort
walks down (and back up)."""

SCALE_DOWN_EVERY_S = 1.0
"""At the floor with frames still dropping: the resolution steps down at most this often."""

SCALE_UP_AFTER_S = 3.0
"""The room (no congestion) a lowered resolution needs before it steps back up."""

JPEG_QUALITY_RANGE = (20, 85)
"""The JPEG quality at the floor and at the ceiling of the bitrate range."""

DROP_SHARE = 0.2
"""Congested by drops: more than this share of the last window's frames were not sent for
the link (a 24 fps stream: 4 of 18 in 0.75 s). Below it, drops are the delivery's own pacing
(the frame after a keyframe on a narrow link, an ack that came late): the encoder's rate
fits."""

QUEUE_FRAMES = 1.5
"""Congested: the round trip more than this many frames' time above its minimum. A frame near
the link's rate takes up to about a frame's time to cross it, a keyframe two: a queue is
what rises beyond that."""

ROOM_FRAMES = 1.0
"""Room: the round trip within this many frames' time of its minimum."""

# Delivered against offered is the noisiest signal (the two windows are a round trip apart,
# and a window's first frame counts for the offered rate only): congestion is a shortfall of
# a fifth, room within 15 %; a queue (the round trip) and drops are the prompt signals.
_DELIVERY_SHORT = 0.8  # congested: delivered < this fraction of what was offered
_DELIVERY_FULL = 0.85  # room: delivered >= this fraction of what was offered


def jpeg_quality(kbps: float, min_kbps: float, max_kbps: float) -> int:
    """The JPEG quality of ``kbps`` in ``[min_kbps, max_kbps]``: from the low end of
    :data:`JPEG_QUALITY_RANGE` at the floor to its high end at the ceiling, linear in the
    bitrate's logarithm; monotone, never below 1 nor above 95."""
    low, high = JPEG_QUALITY_RANGE
    if max_kbps <= min_kbps:
        return high
    kbps = min(max(kbps, min_kbps), max_kbps)
    share = math.log(kbps / min_kbps) / math.log(max_kbps / min_kbps)
    return max(1, min(95, round(low + (high - low) * share)))


@dataclass(frozen=True)
class LinkState:
    """One page's link as the server estimates it from the page's acknowledgements."""

    now_s: float
    """``time.monotonic()`` seconds when the estimate was taken."""
    delivery_bps: float | None
    """Bits/s the page acknowledged lately (``None``: not known yet)."""
    rtt_ms: float | None
    """The smoothed send-to-acknowledgement round trip (``None``: not known yet)."""
    min_rtt_ms: float | None
    """The lowest round trip of the last ~10 s (``None``: not known yet)."""
    inflight_bytes: int
    """Bytes sent to the page and not yet acknowledged."""
    sent_bps: float
    """Bits/s offered to this page lately (with :attr:`acked_bps`: over the window a round
    trip before the acks' own, the frames whose acks are due by now)."""
    dropped: int
    """Frames not sent to this page for the link since the last state."""
    acked_bps: float | None = None
    """Bits/s the page acknowledged over the last window, to set against :attr:`sent_bps`
    (``None``: the delivery rate is, a lower bound on a link that is not kept full)."""
    dropped_share: float | None = None
    """The share of the last window's frames not sent for the link (``None``: not known;
    then any frame dropped is congestion)."""


@dataclass(frozen=True)
class RateDecision:
    """What the encoder of one page should do now."""

    bitrate_kbps: float
    """The video bitrate, kbit/s, within the controller's ``[min_kbps, max_kbps]``."""
    jpeg_quality: int
    """The JPEG quality (1-95) the fallback page's frames get at that bitrate."""
    scale: float
    """The frame's width and height are multiplied by this (one of :data:`SCALES`)."""
    reason: str
    """Why it changed: ``drops``, ``queue`` (the round trip rose), ``delivery`` (the page
    received less than was offered), ``probe`` (a step up), ``floor`` (the resolution fell,
    the bitrate at its floor), ``room`` (the resolution rose), or ``start``."""


@dataclass(frozen=True)
class RateChanges:
    """How often a :class:`RateController` changed its decision, by direction."""

    down: int
    """Steps down of the bitrate."""
    up: int
    """Steps up of the bitrate."""
    scale_down: int
    """Steps down of the resolution."""
    scale_up: int
    """Steps up of the resolution."""

    @property
    def total(self) -> int:
        """Every change."""
        return self.down + self.up + self.scale_down + self.scale_up


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentError(f"rate control: {name} must be a number > 0, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"rate control: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def _known(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _dropping(link: LinkState) -> bool:
    """Frames dropped for the link as congestion: some since the last state, and (when the
    estimate knows it) more than :data:`DROP_SHARE` of the window's frames — a keyframe's
    burst or a late ack holds a frame back now and then on a link with room to spare."""
    if link.dropped <= 0:
        return False
    return link.dropped_share is None or link.dropped_share > DROP_SHARE


def _got(link: LinkState, delivery: float | None) -> float | None:
    """What the page took, to set against what was offered: the acknowledged rate when the
    estimate has it (a delivery-rate sample of frames further apart than the round trip reads
    only a frame per round trip: on a 40 ms link at 24 fps, a shortfall that is not there)."""
    acked = _known(link.acked_bps)
    return acked if acked is not None else delivery


def _received(link: LinkState, delivery: float | None, bitrate_kbps: float) -> float | None:
    """What the page was measured receiving on a congested link: the lower of the delivery
    rate (the highest sample of its window, which lags a link that just narrowed by up to the
    window) and the acknowledged rate (a congested link is kept full: what the page took over
    the window is what the link carries now, or more), that one no lower than
    :data:`MOST_CUT` of ``bitrate_kbps``."""
    acked = _known(link.acked_bps)
    if acked is None:
        return delivery
    acked = max(acked, MOST_CUT * bitrate_kbps * 1000)
    return acked if delivery is None else min(delivery, acked)


class RateController:
    """The bitrate (and, last, the resolution) of one page's stream, following its link.

    ``start_kbps`` is the bitrate before the link is known, ``min_kbps``/``max_kbps`` its
    floor and ceiling, ``fps`` the stream's frame rate (the round trip's rise above its
    minimum is judged in frames' time: :data:`QUEUE_FRAMES`, :data:`ROOM_FRAMES`).
    :meth:`update` takes each new :class:`LinkState` and returns a :class:`RateDecision` when
    it changes, else ``None``; :attr:`current` is the decision in force. Each change is
    counted (:attr:`changes`) and logged once (``rate_changed``: ``stream``, ``from_kbps``,
    ``to_kbps``, ``scale``, ``reason``).
    """

    def __init__(
        self,
        *,
        start_kbps: float,
        min_kbps: float,
        max_kbps: float,
        fps: float,
        stream: str | None = None,
    ) -> None:
        self._min = _positive("min_kbps", min_kbps)
        self._max = _positive("max_kbps", max_kbps)
        start = _positive("start_kbps", start_kbps)
        self._frame_ms = 1000.0 / _positive("fps", fps)
        if self._max < self._min:
            raise ArgumentError(
                f"rate control: max_kbps must be >= min_kbps ({min_kbps!r}), got {max_kbps!r}"
            )
        if not self._min <= start <= self._max:
            raise ArgumentError(
                f"rate control: start_kbps must be within min_kbps..max_kbps "
                f"({min_kbps!r}..{max_kbps!r}), got {start_kbps!r}"
            )
        self.stream = stream
        """The stream named in the log lines (``None``: none named)."""
        self._kbps = start
        self._scale_index = 0
        self._down = self._up = self._scale_down = self._scale_up = 0
        self._last_down_s = -math.inf
        self._last_up_s = -math.inf
        self._last_scale_s = -math.inf
        self._room_since: float | None = None
        self._ceiling: float | None = None
        self._ceiling_s = -math.inf
        self._current = self._decision("start")

    @property
    def current(self) -> RateDecision:
        """The decision in force (``reason`` ``start`` before the first change)."""
        return self._current

    @property
    def changes(self) -> RateChanges:
        """How many times the decision changed, by direction."""
        return RateChanges(self._down, self._up, self._scale_down, self._scale_up)

    def update(self, link: LinkState) -> RateDecision | None:
        """Judge ``link``; the new decision when it changes, ``None`` when it stands."""
        now = link.now_s
        delivery = _known(link.delivery_bps)
        rtt, min_rtt = _known(link.rtt_ms), _known(link.min_rtt_ms)
        congestion = self._congestion(link, delivery, rtt, min_rtt)
        if congestion is not None:
            self._room_since = None
            return self._step_down(
                now, _received(link, delivery, self._kbps), rtt, congestion, _dropping(link)
            )
        if not self._has_room(link, delivery, rtt, min_rtt):
            self._room_since = None
            return None
        if self._room_since is None:
            self._room_since = now
        return self._step_up(now, rtt)

    # --- the signals ------------------------------------------------------------------------

    def _congestion(
        self, link: LinkState, delivery: float | None, rtt: float | None, min_rtt: float | None
    ) -> str | None:
        if _dropping(link):
            return "drops"
        if (
            rtt is not None
            and min_rtt is not None
            and rtt - min_rtt > QUEUE_FRAMES * self._frame_ms
        ):
            return "queue"
        got = _got(link, delivery)
        if got is not None and got < _DELIVERY_SHORT * link.sent_bps:
            return "delivery"
        return None

    def _has_room(
        self, link: LinkState, delivery: float | None, rtt: float | None, min_rtt: float | None
    ) -> bool:
        if delivery is None or rtt is None or min_rtt is None or link.dropped > 0:
            return False
        queued = rtt - min_rtt
        got = _got(link, delivery)
        assert got is not None
        return queued <= ROOM_FRAMES * self._frame_ms and got >= _DELIVERY_FULL * link.sent_bps

    # --- the steps --------------------------------------------------------------------------

    def _step_down(
        self, now: float, delivery: float | None, rtt: float | None, reason: str, dropping: bool
    ) -> RateDecision | None:
        hold = max(HOLD_AFTER_DOWN_S, 2 * (rtt or 0.0) / 1000)
        if now - self._last_down_s < hold:
            return None
        if self._kbps <= self._min:
            if not dropping or self._scale_index == len(SCALES) - 1:
                return None
            if now - max(self._last_scale_s, self._last_down_s) < SCALE_DOWN_EVERY_S:
                return None
            self._scale_index += 1
            self._scale_down += 1
            self._last_scale_s = now
            return self._change("floor")
        measured = self._kbps if delivery is None else min(self._kbps, delivery / 1000)
        self._ceiling, self._ceiling_s = self._kbps, now
        self._kbps = max(self._min, BACKOFF * measured)
        self._down += 1
        self._last_down_s = now
        return self._change(reason)

    def _step_up(self, now: float, rtt: float | None) -> RateDecision | None:
        assert self._room_since is not None
        if now - self._last_down_s < HOLD_UP_AFTER_DOWN_S:
            return None
        if self._scale_index > 0:
            if now - max(self._room_since, self._last_scale_s) < SCALE_UP_AFTER_S:
                return None
            self._scale_index -= 1
            self._scale_up += 1
            self._last_scale_s = now
            return self._change("room")
        if self._kbps >= self._max:
            return None
        every, step = max(PROBE_EVERY_S, (rtt or 0.0) / 1000), PROBE_STEP
        if now - self._ceiling_s > CEILING_FORGET_S or (
            self._ceiling is not None and self._kbps >= self._ceiling
        ):
            self._ceiling = None
        if self._ceiling is not None and self._kbps * step > NEAR_CEILING * self._ceiling:
            every, step = max(every, NEAR_CEILING_EVERY_S), NEAR_CEILING_STEP
        if now - max(self._room_since, self._last_up_s) < every:
            return None
        self._kbps = min(self._max, self._kbps * step)
        self._up += 1
        self._last_up_s = now
        return self._change("probe")

    def _decision(self, reason: str) -> RateDecision:
        kbps = min(self._max, max(self._min, self._kbps))
        return RateDecision(
            bitrate_kbps=kbps,
            jpeg_quality=jpeg_quality(kbps, self._min, self._max),
            scale=SCALES[self._scale_index],
            reason=reason,
        )

    def _change(self, reason: str) -> RateDecision:
        before, self._current = self._current, self._decision(reason)
        _log.info(
            "rate_changed",
            stream=self.stream,
            from_kbps=round(before.bitrate_kbps, 1),
            to_kbps=round(self._current.bitrate_kbps, 1),
            scale=self._current.scale,
            reason=reason,
        )
        return self._current


def rate_message(stream: str, decision: RateDecision) -> dict[str, object]:
    """The page-bound ``rate`` message of ``stream``'s decision: ``type``, ``stream``,
    ``kbps`` (rounded to 0.1), ``scale`` and ``reason``."""
    return {
        "type": "rate",
        "stream": stream,
        "kbps": round(decision.bitrate_kbps, 1),
        "scale": decision.scale,
        "reason": decision.reason,
    }


def apply_rate(encoder: Encoder, decision: RateDecision) -> None:
    """Apply ``decision`` to ``encoder``: an h264 encoder's bitrate and scale (the bitrate
    from its next frame, a higher one and the scale from its next IDR frame), a JPEG
    encoder's quality and scale; a raw encoder has no rate to follow."""
    if isinstance(encoder, H264Fragments):
        encoder.set_bitrate(decision.bitrate_kbps)
        encoder.set_scale(decision.scale)
    elif isinstance(encoder, JpegEncoder):
        encoder.quality = decision.jpeg_quality
        encoder.scale = decision.scale
