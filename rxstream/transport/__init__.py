"""Session transports: where egress goes and what keeps a session alive."""

from typing import TYPE_CHECKING

from rxstream._exceptions import CodecError, ItemRefused
from rxstream._util import fixup_module_metadata
from rxstream.transport._base import CODECS, Session, Transport
from rxstream.transport._codecs import (
    Encoder,
    H264Fragments,
    JpegEncoder,
    RawEncoder,
    decode_raw,
    encoder,
    to_rgb24,
)
from rxstream.transport._file import FileTransport
from rxstream.transport._guard import Rate, SessionLimits
from rxstream.transport._memory import MemoryTransport
from rxstream.transport._rate import (
    LinkState,
    RateChanges,
    RateController,
    RateDecision,
    apply_rate,
    rate_message,
)
from rxstream.transport._tee import Tee

if TYPE_CHECKING:
    from rxstream.transport._web import WebTransport

__all__ = [
    "CODECS",
    "CodecError",
    "Encoder",
    "FileTransport",
    "H264Fragments",
    "ItemRefused",
    "JpegEncoder",
    "LinkState",
    "MemoryTransport",
    "Rate",
    "RateChanges",
    "RateController",
    "RateDecision",
    "RawEncoder",
    "Session",
    "SessionLimits",
    "Tee",
    "Transport",
    "WebTransport",
    "apply_rate",
    "decode_raw",
    "encoder",
    "rate_message",
    "to_rgb24",
]

fixup_module_metadata(__name__, globals())


def __getattr__(name: str) -> object:
    """``WebTransport`` loads aiohttp on first use, not with ``import rxstream``."""
    if name == "WebTransport":
        from rxstream.transport._web import WebTransport

        fixup_module_metadata(__name__, {"WebTransport": WebTransport}, ["WebTransport"])
        return WebTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
