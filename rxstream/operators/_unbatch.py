"""``ctx.unbatch()``: 1:N (Rx ``flat_map``) over a batch's leading dimension.

A tensor or array yields its slices along dim 0; a list or tuple yields its elements. Each
child carries a copy of the parent's metadata; with ``pts_step`` child ``i`` gets
``pts = parent.pts + i * pts_step``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reactivex import abc

from rxstream._kernel._kind import StageKind
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, _with_stamps, evolve_metadata, now
from rxstream.operators._core import OnNext, per_item
from rxstream.typing import Operator

__all__ = ["UNBATCH_KIND", "split_batch", "unbatch_operator"]

UNBATCH_KIND = StageKind("unbatch", "1:N", passes=True)
"""``ctx.unbatch``: a batch becomes its children."""


def split_batch(payload: Any) -> Sequence[Any]:
    """The children of one batch; ``TypeError`` for what has no leading dimension."""
    if isinstance(payload, list | tuple):
        return payload
    shape = getattr(payload, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            raise TypeError("unbatch needs a leading batch dimension, got a 0-d array")
        return [payload[i] for i in range(shape[0])]
    raise TypeError(
        f"unbatch needs a tensor, an array, a list or a tuple, got {type(payload).__name__}"
    )


def unbatch_operator(pts_step: int | None) -> Callable[[StageShell], Operator]:
    """One item per child of each batch; ``pts`` advances by ``pts_step`` when given."""

    def build(shell: StageShell) -> Operator:
        counters = shell.counters

        def make_on_next(observer: abc.ObserverBase[PipelineItem]) -> OnNext:
            def on_next(item: PipelineItem) -> None:
                started = now()
                counters.items_in += 1
                try:
                    children = split_batch(item.payload)
                except Exception as exc:
                    shell.failed(observer, item, exc)
                    return
                base = item.metadata
                for index, child in enumerate(children):
                    md = base
                    if pts_step is not None:
                        md = evolve_metadata(base, pts=base.pts + index * pts_step)
                    md = _with_stamps(md, shell.stamps(started))
                    observer.on_next(shell.emit(child, md))

            return on_next

        return per_item(make_on_next)

    return build
