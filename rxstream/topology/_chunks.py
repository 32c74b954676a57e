"""Chunk policies and stream buffers: how a connection's arriving items become chunks.

A :class:`StreamBuffer` holds the items that arrived on one stream; its :class:`ChunkPolicy`
(one per stream, made by ``Connection.chunk_policy_factory``) decides when the pending items
make a chunk. Each time, the policy answers ``(take, drop)``: release ``pending[:take]`` as a
chunk, then discard the first ``drop`` pending items (``drop < take`` keeps the rest for the
next, overlapping chunk). At the end of the stream (``close()``) the policy is asked again with
``final=True`` so it can release what is left.
"""

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, overload, runtime_checkable

from rxstream._exceptions import StreamBufferClosed, TopologyError

__all__ = [
    "ChunkPolicy",
    "ChunkPolicyFactory",
    "EveryItem",
    "FixedSize",
    "Sliding",
    "StreamBuffer",
    "UntilFinal",
]

T = TypeVar("T")


@runtime_checkable
class ChunkPolicy(Protocol):
    """Decides when a stream's pending items make a chunk."""

    @property
    def overlapping(self) -> bool:
        """Whether one item may be released in two chunks (a producer-triggered walk refuses)."""
        ...

    def ready(self, pending: Sequence[Any], final: bool) -> tuple[int, int] | None:
        """``(take, drop)`` to release ``pending[:take]`` and discard ``drop`` items, or None.

        ``final`` is true once the stream has ended: nothing more will arrive.
        """
        ...


ChunkPolicyFactory: TypeAlias = Callable[[], ChunkPolicy]
"""Makes one :class:`ChunkPolicy` per stream: ``EveryItem``, ``lambda: FixedSize(4)``…"""


class EveryItem:
    """Each item is a chunk of its own, as soon as it arrives."""

    overlapping = False

    def ready(self, pending: Sequence[Any], final: bool) -> tuple[int, int] | None:
        """One item at a time."""
        return (1, 1) if pending else None

    def __repr__(self) -> str:
        return "EveryItem()"


class FixedSize:
    """Chunks of ``n`` items, back to back; at the end, the rest as one shorter chunk."""

    overlapping = False

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TopologyError(f"FixedSize n must be an int >= 1, got {n!r}")
        self.n = n

    def ready(self, pending: Sequence[Any], final: bool) -> tuple[int, int] | None:
        """``n`` items once ``n`` are pending; at the end, whatever is left."""
        if len(pending) >= self.n:
            return (self.n, self.n)
        if final and pending:
            return (len(pending), len(pending))
        return None

    def __repr__(self) -> str:
        return f"FixedSize({self.n})"


class Sliding:
    """Windows of ``size`` items starting every ``step`` items (``step < size`` overlaps).

    Window ``i`` holds items ``i*step … i*step+size-1``, so neighbours share ``size - step``
    items. At the end, the items that no full window reached make one last, shorter window
    (with the overlap before them).
    """

    def __init__(self, size: int, step: int = 1) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise TopologyError(f"Sliding size must be an int >= 1, got {size!r}")
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= size:
            raise TopologyError(f"Sliding step must be an int in 1..size ({size}), got {step!r}")
        self.size = size
        self.step = step
        self._released = 0
        """How many of the pending items the last window already released (its overlap)."""

    @property
    def overlapping(self) -> bool:
        """Whether neighbouring windows share items (``step < size``)."""
        return self.step < self.size

    def ready(self, pending: Sequence[Any], final: bool) -> tuple[int, int] | None:
        """A full window once ``size`` items are pending; at the end, the unreleased rest."""
        if len(pending) >= self.size:
            self._released = self.size - self.step
            return (self.size, self.step)
        if final and len(pending) > self._released:
            self._released = 0
            return (len(pending), len(pending))
        return None

    def __repr__(self) -> str:
        return f"Sliding({self.size}, {self.step})"


class UntilFinal:
    """Gathers items until one that ``is_final(item)`` marks, then releases them all.

    At the end, items after the last final one are released as one chunk.
    """

    overlapping = False

    def __init__(self, is_final: Callable[[Any], bool]) -> None:
        if not callable(is_final):
            raise TopologyError(f"UntilFinal is_final must be callable, got {is_final!r}")
        self.is_final = is_final

    def ready(self, pending: Sequence[Any], final: bool) -> tuple[int, int] | None:
        """Up to and including the first final item; at the end, whatever is left."""
        for index, item in enumerate(pending):
            if self.is_final(item):
                return (index + 1, index + 1)
        if final and pending:
            return (len(pending), len(pending))
        return None

    def __repr__(self) -> str:
        name = getattr(self.is_final, "__name__", repr(self.is_final))
        return f"UntilFinal({name})"


class StreamBuffer(Generic[T]):
    """The items that arrived on one stream, released as chunks by its policy.

    ``put(item)`` returns the chunks the item completed (often none); ``close()`` ends the
    stream and returns what the policy releases of the rest. ``view(item)`` is what the policy
    sees of each held item (default: the item itself; the engine holds items and shows the
    policy their payloads). Not thread-safe: one consumer.
    """

    def __init__(
        self, policy: ChunkPolicy, name: str = "stream", view: Callable[[T], Any] | None = None
    ) -> None:
        self.policy = policy
        self.name = name
        self._pending: list[T] = []
        self._closed = False
        self._shown: Sequence[Any] = self._pending if view is None else _Viewed(self._pending, view)

    @property
    def pending(self) -> tuple[T, ...]:
        """The items held, not yet discarded (some may already be in a released window)."""
        return tuple(self._pending)

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def put(self, item: T) -> list[list[T]]:
        """Hold ``item``; returns the chunks now ready, oldest first."""
        if self._closed:
            raise StreamBufferClosed(f"stream buffer {self.name!r} is closed; cannot put {item!r}")
        self._pending.append(item)
        return self._release(final=False)

    def close(self) -> list[list[T]]:
        """End the stream; returns the last chunks. Items the policy does not take are dropped."""
        if self._closed:
            return []
        self._closed = True
        chunks = self._release(final=True)
        self._pending.clear()
        return chunks

    def _release(self, final: bool) -> list[list[T]]:
        chunks: list[list[T]] = []
        while self._pending:
            answer = self.policy.ready(self._shown, final)
            if answer is None:
                break
            take, drop = answer
            count = len(self._pending)
            if not (1 <= take <= count and 1 <= drop <= count):
                raise TopologyError(
                    f"chunk policy {self.policy!r} must answer 1 <= take, drop <= {count} "
                    f"(the pending items), got take={take}, drop={drop} "
                    f"on stream {self.name!r}"
                )
            chunks.append(self._pending[:take])
            del self._pending[:drop]
        return chunks


class _Viewed(Sequence[Any]):
    """A live, read-only view of a list through ``view`` (what a policy sees of the items)."""

    __slots__ = ("_items", "_view")

    def __init__(self, items: list[Any], view: Callable[[Any], Any]) -> None:
        self._items = items
        self._view = view

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._view(item) for item in self._items[index]]
        return self._view(self._items[index])
