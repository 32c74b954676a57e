"""The one way operators attach to their upstream: without reactivex's per-item wrapper.

``Observable.subscribe`` wraps every observer in an ``AutoDetachObserver`` (a check and a
call per item) and trampolines the subscription. Inside the engine every hop is an operator
of ours subscribing to another operator of ours (or to reactivex's ``share``/``merge``/
``zip``, which wrap their own inner observers), so a stage attaches with
:func:`attach`: the upstream's ``_subscribe_core`` with a plain relay, which saves a call per
item per stage (docs/performance.md). User-facing ``subscribe`` calls are untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, cast

from reactivex import Observable, abc
from reactivex.disposable import Disposable

from rxstream.item import PipelineItem
from rxstream.typing import ItemStream, Operator

__all__ = ["OnNext", "Subscribe", "attach", "one_input", "per_item"]

_T = TypeVar("_T")


class _Relay(Generic[_T]):
    """An observer that is just its three callables (duck-typed ``ObserverBase``)."""

    __slots__ = ("on_completed", "on_error", "on_next")

    def __init__(
        self,
        on_next: Callable[[_T], None],
        on_error: Callable[[Exception], None],
        on_completed: Callable[[], None],
    ) -> None:
        self.on_next = on_next
        self.on_error = on_error
        self.on_completed = on_completed


def attach(
    source: Observable[_T],
    on_next: Callable[[_T], None],
    on_error: Callable[[Exception], None],
    on_completed: Callable[[], None],
    scheduler: abc.SchedulerBase | None = None,
) -> abc.DisposableBase:
    """Subscribe ``on_next``/``on_error``/``on_completed`` to ``source`` without a wrapper."""
    relay = cast(abc.ObserverBase[_T], _Relay(on_next, on_error, on_completed))
    subscriber: Any = source._subscribe_core(relay, scheduler)
    if isinstance(subscriber, abc.DisposableBase) or hasattr(subscriber, "dispose"):
        return subscriber  # type: ignore[no-any-return]
    return Disposable(subscriber)


OnNext = Callable[[PipelineItem], None]
Subscribe = Callable[
    [ItemStream, abc.ObserverBase[PipelineItem], abc.SchedulerBase | None], abc.DisposableBase
]


def one_input(subscribe: Subscribe) -> Operator:
    """An operator over the stage's one input: ``subscribe(source, observer, scheduler)``."""

    def operator(ports: Sequence[ItemStream]) -> ItemStream:
        source = ports[0]

        def on_subscribe(
            observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            return subscribe(source, observer, scheduler)

        return Observable(on_subscribe)

    return operator


def per_item(make_on_next: Callable[[abc.ObserverBase[PipelineItem]], OnNext]) -> Operator:
    """An operator over the stage's one input whose work is per item.

    ``make_on_next(observer)`` returns the ``on_next`` for one subscription (it emits to
    ``observer``); errors and completion pass through.
    """

    def subscribe(
        source: ItemStream,
        observer: abc.ObserverBase[PipelineItem],
        scheduler: abc.SchedulerBase | None,
    ) -> abc.DisposableBase:
        on_next = make_on_next(observer)
        return attach(source, on_next, observer.on_error, observer.on_completed, scheduler)

    return one_input(subscribe)
