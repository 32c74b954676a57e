"""``ctx.rx(op)``: lift any reactivex operator into a stage.

By default ``op`` sees payloads. What it emits gets metadata back: a payload that is one of the
inputs it was given (``filter``, ``distinct``, ``throttle_first``…) gets that input's metadata;
a new value (``map``, ``scan``…) gets the metadata of the latest input. With ``items=True`` the
operator works on :class:`~rxstream.item.PipelineItem` s and keeps full control. Time-based
operators run on the stage's scheduler (its thread, or the drive's virtual clock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from reactivex import Observable, abc

from rxstream.item import PipelineItem, _with_stamps, now
from rxstream.runtime._shell import StageShell
from rxstream.typing import ItemStream, Operator

__all__ = ["rx_operator"]

_REMEMBERED = 1024
"""Inputs remembered for re-attaching metadata to what the operator lets through."""


def rx_operator(
    op: Callable[[Observable[Any]], Observable[Any]], *, items: bool = False
) -> Callable[[StageShell], Operator]:
    """A stage running ``op`` over payloads (or items), metadata re-attached on the way out."""

    def build(shell: StageShell) -> Operator:
        counters = shell.counters
        in_hop, out_hop = shell.in_hop, shell.out_hop

        def operator(ports: Sequence[ItemStream]) -> ItemStream:
            source = ports[0]

            def subscribe(
                observer: abc.ObserverBase[PipelineItem],
                scheduler: abc.SchedulerBase | None = None,
            ) -> abc.DisposableBase:
                seen: OrderedDict[int, tuple[PipelineItem, float]] = OrderedDict()
                latest: list[tuple[PipelineItem, float]] = []

                def remember(item: PipelineItem) -> Any:
                    started = now()
                    counters.items_in += 1
                    entry = (item, started)
                    if items:
                        return item
                    key = id(item.payload)
                    seen[key] = entry
                    seen.move_to_end(key)
                    if len(seen) > _REMEMBERED:
                        seen.popitem(last=False)
                    latest[:] = [entry]
                    return item.payload

                def on_next(value: Any) -> None:
                    if isinstance(value, PipelineItem):
                        origin, started, payload = value, now(), value.payload
                    else:
                        origin, started = seen.get(id(value)) or latest[0]
                        payload = value
                    stamps = ((in_hop, started), (out_hop, now()))
                    observer.on_next(shell.emit(payload, _with_stamps(origin.metadata, stamps)))

                def on_error(error: Exception) -> None:
                    shell.failed(observer, latest[0][0] if latest else None, error)

                lifted = op(source.pipe(_map(remember)))
                return lifted.subscribe(
                    on_next, on_error, observer.on_completed, scheduler=shell.scheduler
                )

            return Observable(subscribe)

        return operator

    return build


def _map(fn: Callable[[PipelineItem], Any]) -> Callable[[ItemStream], Observable[Any]]:
    def operator(source: ItemStream) -> Observable[Any]:
        def subscribe(
            observer: abc.ObserverBase[Any], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            return source.subscribe(
                lambda item: observer.on_next(fn(item)),
                observer.on_error,
                observer.on_completed,
                scheduler=scheduler,
            )

        return Observable(subscribe)

    return operator
