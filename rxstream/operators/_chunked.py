"""Chunked connections: the consumer side of a connection that declares a chunk policy.

The items arriving on one input of a stage with ``chunks=`` (or out of a ``ctx.input`` with
``chunks=``) are held in a :class:`~rxstream.topology.StreamBuffer` whose policy, made by the
declared factory for this stream, releases them as chunks before they reach the stage. A
chunk is one item: its payload the list of the items' payloads, its metadata merged N:1
(:func:`~rxstream.item.merge_metadata`). The policy sees the payloads.

On a walk-driving edge every item is a pair ``(walk, payload)`` (see
:mod:`rxstream.operators._walks`): a chunk is then ``(walk, [payloads])`` with the walk of its
last item, the emission that completed the chunk and so triggers the pass. When the input
completes, the buffer is closed and its last chunks go before the completion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reactivex import Observable, abc

from rxstream._exceptions import PipelineError
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, _item, merge_metadata
from rxstream.operators._core import attach
from rxstream.topology._chunks import ChunkPolicyFactory, StreamBuffer
from rxstream.typing import ItemStream

__all__ = ["chunk_operator"]


def chunk_operator(
    factory: ChunkPolicyFactory, stream: str, shell: StageShell, *, tagged: bool
) -> Callable[[ItemStream], ItemStream]:
    """Gate a stream through a buffer and a fresh policy from ``factory`` per subscription.

    ``stream`` names the buffer (the edge); a policy that fails ends the run naming
    ``shell``'s stage (the consuming one). ``tagged``: the items are ``(walk, payload)`` pairs.
    """
    view = _tagged_payload if tagged else _payload
    make = _tagged_chunk if tagged else _chunk

    def chunked(source: ItemStream) -> ItemStream:
        def subscribe(
            observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            buffer: StreamBuffer[PipelineItem] = StreamBuffer(factory(), name=stream, view=view)
            on_next_down = observer.on_next

            def failed(item: PipelineItem | None, exc: Exception) -> None:
                md = None if item is None else item.metadata
                error = PipelineError(
                    shell.name,
                    exc,
                    pts=None if md is None else md.pts,
                    input_seq=None if md is None else md.input_seq,
                )
                shell.crashed(error)
                observer.on_error(error)

            def on_next(item: PipelineItem) -> None:
                try:
                    chunks = buffer.put(item)
                except Exception as exc:  # the policy (a user's is_final) raised
                    failed(item, exc)
                    return
                for chunk in chunks:
                    on_next_down(make(chunk))

            def on_completed() -> None:
                try:
                    chunks = buffer.close()
                except Exception as exc:
                    failed(None, exc)
                    return
                for chunk in chunks:
                    on_next_down(make(chunk))
                observer.on_completed()

            return attach(source, on_next, observer.on_error, on_completed, scheduler)

        return Observable(subscribe)

    return chunked


def _payload(item: PipelineItem) -> Any:
    return item.payload


def _tagged_payload(item: PipelineItem) -> Any:
    return item.payload[1]


def _chunk(items: Sequence[PipelineItem]) -> PipelineItem:
    metadata = merge_metadata([item.metadata for item in items])
    return _item([item.payload for item in items], metadata)


def _tagged_chunk(items: Sequence[PipelineItem]) -> PipelineItem:
    metadata = merge_metadata([item.metadata for item in items])
    return _item((items[-1].payload[0], [item.payload[1] for item in items]), metadata)
