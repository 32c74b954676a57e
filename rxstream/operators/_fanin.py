"""Fan-in: ``[a, b] | ctx.merge() / ctx.zip() / ctx.combine()`` (Rx merge, zip, combine_latest).

Each output of ``zip``/``combine`` is one group of input items; its metadata follows the N:1
rule (:func:`rxstream.item.merge_metadata`), so the newest input's correlation and timeline
travel on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import reactivex
from reactivex import Observable, abc

from rxstream.item import PipelineItem, merge_metadata, now
from rxstream.runtime._shell import StageShell
from rxstream.typing import ItemStream, Operator

__all__ = ["combine_groups", "combine_operator", "merge_operator", "merged", "zip_operator"]

Group = tuple[PipelineItem, ...]


def combine_groups(ports: Sequence[ItemStream]) -> Observable[Group]:
    """The latest item of every input, each time any input emits (once all have one)."""
    return reactivex.combine_latest(*ports)


def _zip_groups(ports: Sequence[ItemStream]) -> Observable[Group]:
    return reactivex.zip(*ports)


def merged(
    groups: Observable[Group],
    shell: StageShell,
    combine: Callable[[tuple[Any, ...]], Any],
) -> ItemStream:
    """Each group of items as one item: ``combine(payloads)`` with the merged metadata."""
    counters = shell.counters

    def subscribe(
        observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
    ) -> abc.DisposableBase:
        def on_next(group: Group) -> None:
            started = now()
            counters.items_in += 1
            try:
                payload = combine(tuple(item.payload for item in group))
            except Exception as exc:
                shell.failed(observer, group[-1], exc)
                return
            metadata = merge_metadata([item.metadata for item in group], shell.stamps(started))
            observer.on_next(shell.emit(payload, metadata))

        return groups.subscribe(
            on_next, observer.on_error, observer.on_completed, scheduler=scheduler
        )

    return Observable(subscribe)


def _grouping(
    groups: Callable[[Sequence[ItemStream]], Observable[Group]],
    fn: Callable[..., Any] | None,
) -> Callable[[StageShell], Operator]:
    combine: Callable[[tuple[Any, ...]], Any] = (
        (lambda payloads: payloads) if fn is None else (lambda payloads: fn(*payloads))
    )

    def build(shell: StageShell) -> Operator:
        return lambda ports: merged(groups(ports), shell, combine)

    return build


def zip_operator(fn: Callable[..., Any] | None = None) -> Callable[[StageShell], Operator]:
    """Pair the inputs index by index; payload ``fn(*payloads)`` or the tuple of payloads."""
    return _grouping(_zip_groups, fn)


def combine_operator(fn: Callable[..., Any] | None = None) -> Callable[[StageShell], Operator]:
    """The latest of every input on each arrival; ``fn(*payloads)`` or the tuple."""
    return _grouping(combine_groups, fn)


def merge_operator() -> Callable[[StageShell], Operator]:
    """Every item of every input, in arrival order, metadata kept (plus stamps)."""

    def build(shell: StageShell) -> Operator:
        counters = shell.counters

        def operator(ports: Sequence[ItemStream]) -> ItemStream:
            source = reactivex.merge(*ports)

            def subscribe(
                observer: abc.ObserverBase[PipelineItem],
                scheduler: abc.SchedulerBase | None = None,
            ) -> abc.DisposableBase:
                def on_next(item: PipelineItem) -> None:
                    started = now()
                    counters.items_in += 1
                    observer.on_next(shell.forward(item, item.payload, started))

                return source.subscribe(
                    on_next, observer.on_error, observer.on_completed, scheduler=scheduler
                )

            return Observable(subscribe)

        return operator

    return build
