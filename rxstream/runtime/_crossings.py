"""What a run needs of a rank boundary, and of whoever makes them (:mod:`rxstream.ranks`).

A :class:`~rxstream.runtime._run.Run` wires a boundary wherever consecutive stages sit on
different ranks, but it does not know rings, ``torch.distributed`` or CUDA: it asks its
:class:`BoundaryFactory` for the edge by name and uses the :class:`RankBoundary` it gets.
``rxstream.ranks`` makes the factories (``RingBoundaries``, ``LinkBoundaries``).

The layers above the runtime that start runs (``Pipeline.start()``) and serve a stage's
``ctx.lease`` must not import ``rxstream.ranks``, which imports them (its launches make a
``Context`` and run its ``Pipeline``). So the ranks package *provides* what they need here, once,
when it is imported (``rxstream/ranks/__init__.py``, which ``import rxstream`` always runs):
:func:`provide` takes the in-process boundary factory and the lease, and
:func:`in_process_boundaries` and :func:`lease` hand them on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from reactivex import abc

from rxstream._exceptions import PipelineStateError
from rxstream._kernel._generations import Generations
from rxstream._kernel._stats import StageCounters
from rxstream.typing import ItemStream

__all__ = [
    "BoundaryFactory",
    "InProcessBoundaries",
    "Lease",
    "RankBoundary",
    "in_process_boundaries",
    "lease",
    "provide",
]


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


class InProcessBoundaries(Protocol):
    """Makes the boundary factory of a run whose ranks all run in this process."""

    def __call__(self, *, cuda_api: Any, spec: Any) -> BoundaryFactory:
        """A factory for ``Pipeline.start()``: ``cuda_api`` and the ring ``spec`` of its
        context (``Environment.cuda_api``, ``Environment.ring_spec``)."""
        ...


class Lease(Protocol):
    """``ctx.lease``: an empty buffer (a tensor, an array) for the calling stage's output."""

    def __call__(self, shape: Sequence[int], dtype: Any, device: Any = None) -> Any:
        """A view of a free slot of the boundary the stage's output crosses, else a new buffer
        (see ``Environment.lease``)."""
        ...


class _Provided:
    """What :mod:`rxstream.ranks` provided (``None``: nothing yet)."""

    boundaries: InProcessBoundaries | None = None
    lease: Lease | None = None


def provide(*, boundaries: InProcessBoundaries, lease: Lease) -> None:
    """Register the ranks' in-process boundary factory and lease (``rxstream.ranks`` does, at
    import; a second call replaces them)."""
    _Provided.boundaries = boundaries
    _Provided.lease = lease


def _missing(what: str) -> PipelineStateError:
    return PipelineStateError(
        f"no {what} was provided: rxstream.ranks provides it when imported, and it was not "
        "(import rxstream imports it)"
    )


def in_process_boundaries(*, cuda_api: Any, spec: Any) -> BoundaryFactory:
    """The boundary factory of a run whose ranks all run in this process."""
    make = _Provided.boundaries
    if make is None:
        raise _missing("boundary factory for a run")
    return make(cuda_api=cuda_api, spec=spec)


def lease(shape: Sequence[int], dtype: Any, device: Any = None) -> Any:
    """``ctx.lease``: an empty buffer for the calling stage's output (see :class:`Lease`)."""
    provided = _Provided.lease
    if provided is None:
        raise _missing("ctx.lease")
    return provided(shape, dtype, device)
