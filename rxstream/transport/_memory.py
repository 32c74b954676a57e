"""The in-memory session transport: collects what each stream egresses, for tests and scripts."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from rxstream._exceptions import ArgumentError
from rxstream.item import PipelineItem
from rxstream.transport._base import Transport

__all__ = ["MemoryTransport"]


class MemoryTransport(Transport):
    """Keeps the last ``keep`` items of every stream (``None``: all of them).

    It is connected from creation until :meth:`disconnect`.
    """

    def __init__(self, keep: int | None = None) -> None:
        if keep is not None and keep < 1:
            raise ArgumentError(f"keep must be >= 1 or None, got {keep}")
        self._keep = keep
        self._lock = threading.Lock()
        self._streams: dict[str, deque[PipelineItem]] = {}
        self._counts: dict[str, int] = {}
        self._connected = True

    @property
    def connected(self) -> bool:
        return self._connected

    def disconnect(self) -> None:
        """Detach the client: a ``run()`` holding on this transport stops."""
        self._connected = False

    def send(self, stream: str, item: PipelineItem) -> None:
        with self._lock:
            kept = self._streams.get(stream)
            if kept is None:
                kept = self._streams[stream] = deque(maxlen=self._keep)
            kept.append(item)
            self._counts[stream] = self._counts.get(stream, 0) + 1

    def items(self, stream: str) -> list[PipelineItem]:
        """The kept items of ``stream``, oldest first."""
        with self._lock:
            return list(self._streams.get(stream, ()))

    def payloads(self, stream: str) -> list[Any]:
        """The payloads of the kept items of ``stream``, oldest first."""
        return [item.payload for item in self.items(stream)]

    @property
    def counts(self) -> Mapping[str, int]:
        """Items sent per stream since creation (kept or not)."""
        with self._lock:
            return dict(self._counts)
