"""Rate control: the encoder's bitrate follows one page's link.

:class:`RateController` is pure (no I/O, no clock of its own): the web transport hands it a
:class:`LinkState` (the per-page estimate from the page's own acknowledgements) now and then,
and applies the :class:`RateDecision` it returns to that page's encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LinkState"]


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
    """Bits/s offered to this page lately."""
    dropped: int
    """Frames not sent to this page for the link since the last state."""
