"""Helpers for testing apps and pipelines built on rxstream."""

from __future__ import annotations

import threading

from rxstream.transport import MemoryTransport

__all__ = ["MemoryTransport", "live_threads"]


def live_threads() -> list[threading.Thread]:
    """The live threads rxstream started (all are named ``rxstream:<stage>``)."""
    return [t for t in threading.enumerate() if t.name.startswith("rxstream:")]
