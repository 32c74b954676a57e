"""Session transports: where egress goes and what keeps a session alive."""

from rxstream.transport._base import CODECS, Session, Transport
from rxstream.transport._memory import MemoryTransport

__all__ = ["CODECS", "MemoryTransport", "Session", "Transport"]

for _name in ("MemoryTransport", "Transport"):
    globals()[_name].__module__ = __name__
