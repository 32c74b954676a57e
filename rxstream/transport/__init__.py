"""Session transports: where egress goes and what keeps a session alive."""

from typing import TYPE_CHECKING

from rxstream._exceptions import CodecError
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
from rxstream.transport._tee import Tee

if TYPE_CHECKING:
    from rxstream.transport._web import WebTransport

__all__ = [
    "CODECS",
    "CodecError",
    "Encoder",
    "FileTransport",
    "H264Fragments",
    "JpegEncoder",
    "MemoryTransport",
    "Rate",
    "RawEncoder",
    "Session",
    "SessionLimits",
    "Tee",
    "Transport",
    "WebTransport",
    "decode_raw",
    "encoder",
    "to_rgb24",
]

for _name in (
    "CodecError",
    "Encoder",
    "FileTransport",
    "H264Fragments",
    "JpegEncoder",
    "MemoryTransport",
    "Rate",
    "RawEncoder",
    "SessionLimits",
    "Tee",
    "Transport",
    "decode_raw",
    "encoder",
    "to_rgb24",
):
    globals()[_name].__module__ = __name__


def __getattr__(name: str) -> object:
    """``WebTransport`` loads aiohttp on first use, not with ``import rxstream``."""
    if name == "WebTransport":
        from rxstream.transport._web import WebTransport

        WebTransport.__module__ = __name__
        return WebTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
