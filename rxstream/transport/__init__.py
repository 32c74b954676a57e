"""Session transports: where egress goes and what keeps a session alive."""

from rxstream.transport._memory import MemoryTransport, Transport

__all__ = ["MemoryTransport", "Transport"]

for _name in __all__:
    globals()[_name].__module__ = __name__
