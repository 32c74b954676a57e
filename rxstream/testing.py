"""Helpers for testing apps and pipelines built on rxstream."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from rxstream.timing import TimingRecord
from rxstream.timing._emit import listen
from rxstream.transport import MemoryTransport

__all__ = ["MemoryTransport", "capture_timing", "live_threads"]


def live_threads() -> list[threading.Thread]:
    """The live threads rxstream started (all are named ``rxstream:<stage>``)."""
    return [t for t in threading.enumerate() if t.name.startswith("rxstream:")]


@contextlib.contextmanager
def capture_timing() -> Iterator[list[TimingRecord]]:
    """Collect every timing record emitted inside the block, from any pipeline or thread."""
    records: list[TimingRecord] = []
    lock = threading.Lock()

    def keep(record: TimingRecord) -> None:
        with lock:
            records.append(record)

    with listen(keep):
        yield records
