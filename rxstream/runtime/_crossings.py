"""What a run needs of a rank boundary, and of whoever makes them (:mod:`rxstream.ranks`).

A :class:`~rxstream.runtime._run.Run` wires a boundary wherever consecutive stages sit on
different ranks, but it does not know rings, ``torch.distributed`` or CUDA: it asks its
:class:`BoundaryFactory` for the edge by name and uses the :class:`RankBoundary` it gets.
``rxstream.ranks`` makes the factories (``RingBoundaries``, ``LinkBoundaries``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from reactivex import abc

from rxstream._kernel._generations import Generations
from rxstream._kernel._stats import StageCounters
from rxstream.typing import ItemStream

__all__ = ["BoundaryFactory", "RankBoundary"]


class _Closes(Protocol):
    def close(self) -> None: ...


class RankBoundary(Protocol):
    """One edge across ranks as this process sees it: a writer, a reader, or both."""

    @property
    def ring(self) -> _Closes:
        """The channel its items cross; closing it wakes both sides (a halting run does)."""
        ...

    def write(
        self,
        upstream: ItemStream,
        counters: StageCounters,
        stage: str,
        fail: Callable[[BaseException], None],
        on_done: Callable[[], None],
        lost: StageCounters | None = None,
        on_closed: Callable[[], None] = ...,
        sole: bool = True,
    ) -> abc.DisposableBase:
        """Put every item of ``upstream`` into the channel; ``on_done`` once it ended."""
        ...

    def read(
        self,
        halted: Callable[[], bool],
        fail: Callable[[BaseException], None],
        counters: StageCounters,
    ) -> ItemStream:
        """The items coming out of the channel, pushed by a reader thread once subscribed."""
        ...

    def close(self, timeout: float) -> bool:
        """Close the channel and join the reader within ``timeout``; whether it ended."""
        ...


class BoundaryFactory(Protocol):
    """Makes a run's boundaries, and lets go of what it made once the run stopped."""

    def __call__(
        self, name: str, *, timing: bool, replicas: Generations | None, cuda: bool = True
    ) -> RankBoundary:
        """The boundary of the edge ``name`` (``upstream>downstream``), made once per run.

        ``timing``: whether it stamps its hops; ``replicas``: this rank's replicated
        generations when another rank steers (its reader then holds newer items until they
        reach them), else ``None``; ``cuda``: whether CUDA tensors may cross it by CUDA IPC
        (``False`` when a stage at either end declares ``device="cpu"``: see
        :func:`rxstream.stage.cuda_path`).
        """
        ...

    def close(self) -> None:
        """Let go of what it made (unlink the rings it owns); after the run stopped."""
        ...
