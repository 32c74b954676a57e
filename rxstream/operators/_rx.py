"""``ctx.rx(op)``: lift any reactivex operator into a stage.

By default ``op`` sees payloads. What it emits gets metadata back by causality: a value
emitted while an input is being pushed through (``filter``, ``map``, ``scan``, ``distinct``,
``throttle_first``, ``buffer_with_count``…) gets that input's metadata; a value emitted later,
from a timer (``debounce``, ``delay``…), gets the metadata of the recent input it is (by
identity), else of the latest input. With ``items=True`` the operator works on
:class:`~rxstream.item.PipelineItem` s and keeps full control. Time-based operators run on the
stage's scheduler (its thread, or the drive's virtual clock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from reactivex import Observable, abc

from rxstream._kernel._kind import StageKind
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, now
from rxstream.operators._core import one_input
from rxstream.typing import ItemStream, Operator

__all__ = ["RX_KIND", "rx_operator"]

RX_KIND = StageKind("rx", "free")
"""``ctx.rx``: a reactivex operator, any count."""

_REMEMBERED = 64
"""Recent inputs remembered for re-attaching metadata to what a timer lets through."""


def rx_operator(
    op: Callable[[Observable[Any]], Observable[Any]], *, items: bool = False
) -> Callable[[StageShell], Operator]:
    """A stage running ``op`` over payloads (or items), metadata re-attached on the way out."""

    def build(shell: StageShell) -> Operator:
        counters = shell.counters

        def subscribe(
            source: ItemStream,
            observer: abc.ObserverBase[PipelineItem],
            scheduler: abc.SchedulerBase | None,
        ) -> abc.DisposableBase:
            seen: OrderedDict[int, tuple[PipelineItem, float]] = OrderedDict()
            latest: list[tuple[PipelineItem, float]] = []
            pushing: list[tuple[PipelineItem, float] | None] = [None]

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
                pushing[0] = entry
                return item.payload

            def on_next(value: Any) -> None:
                if isinstance(value, PipelineItem):
                    origin, started, payload = value, now(), value.payload
                else:
                    cause = pushing[0] or seen.get(id(value)) or latest[0]
                    origin, started = cause
                    payload = value
                observer.on_next(shell.forward(origin, payload, started))

            def on_error(error: Exception) -> None:
                shell.failed(observer, latest[0][0] if latest else None, error)

            def done_pushing(_item: PipelineItem) -> None:
                pushing[0] = None

            lifted = op(source.pipe(_map(remember), _after(done_pushing)))
            return lifted.subscribe(
                on_next, on_error, observer.on_completed, scheduler=shell.scheduler
            )

        return one_input(subscribe)

    return build


def _after(
    fn: Callable[[PipelineItem], None],
) -> Callable[[Observable[Any]], Observable[Any]]:
    """Pass values on, then call ``fn`` once the downstream has handled each one."""

    def operator(source: Observable[Any]) -> Observable[Any]:
        def subscribe(
            observer: abc.ObserverBase[Any], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            def on_next(value: Any) -> None:
                try:
                    observer.on_next(value)
                finally:
                    fn(value)

            return source.subscribe(
                on_next, observer.on_error, observer.on_completed, scheduler=scheduler
            )

        return Observable(subscribe)

    return operator


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
