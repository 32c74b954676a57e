"""The partition-topology API (so far: client stream limits, enforced at ``ctx.input``)."""

from rxstream.topology._limits import ClientStreamLimitExceeded, ClientStreamLimits

__all__ = ["ClientStreamLimitExceeded", "ClientStreamLimits"]

for _name in __all__:
    globals()[_name].__module__ = __name__
