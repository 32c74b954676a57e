"""The link a boundary's items cross: one :class:`Channel` Protocol, several transports.

A :class:`~rxstream.ranks._boundary.Boundary` puts items into a channel on the upstream rank
and gets them out on the downstream one. It asks the channel, never its type:

- :class:`~rxstream.ipc.ShmRing` (one host): both ends run the same interpreter, so the
  boundary puts :func:`~rxstream.ranks._boundary.pack`'s form (marshal bytes, or the stamp
  chain as it is) — ``portable`` is false.
- :class:`~rxstream.ranks._distboundary.DistChannel` (``torch.distributed``, across hosts):
  the boundary puts :func:`~rxstream.ranks._boundary.encode`'s plain form, which the reader
  moves into its host's clock — ``portable`` is true.

CUDA tensors cross a ring as IPC references to a pool of device slots
(:class:`~rxstream.ranks._cudaxing.CudaCrossing`, which the boundary factory adds to a ring's
boundary when the process has CUDA), and a ``DistChannel`` inside its own frames (NCCL or host
memory).
"""

from __future__ import annotations

from typing import Any, Protocol

from rxstream.ipc import RingStatistics

__all__ = ["Channel"]


class Channel(Protocol):
    """One side of a single-producer, single-consumer link between two ranks."""

    portable: bool
    """Whether the link leaves the interpreter's host: items cross in ``encode``'s form."""

    @property
    def all_leased(self) -> bool:
        """Whether every slot is held by views of items this side got (the consumer's)."""
        ...

    def put(self, obj: object, timeout: float | None = None) -> int:
        """Send ``obj``; the nanoseconds waited for room. Raises ``RingClosed`` once closed."""
        ...

    def get(self, timeout: float | None = None) -> Any:
        """The next object sent. Raises ``RingClosed`` once closed (which wakes a waiter)."""
        ...

    def close(self) -> None:
        """Let go of this side, waking both sides' waiters; idempotent."""
        ...

    def statistics(self) -> RingStatistics:
        """The link's counters now (items and bytes through it, the waits on either side)."""
        ...
