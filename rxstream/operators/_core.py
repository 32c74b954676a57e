"""The one way operators attach to their upstream: without reactivex's per-item wrapper.

``Observable.subscribe`` wraps every observer in an ``AutoDetachObserver`` (a check and a
call per item) and trampolines the subscription. Inside the engine every hop is an operator
of ours subscribing to another operator of ours (or to reactivex's ``share``/``merge``/
``zip``, which wrap their own inner observers), so a stage attaches with
:func:`attach`: the upstream's ``_subscribe_core`` with a plain relay. Measured here it saves
about 0.3 µs per item per stage. User-facing ``subscribe`` calls are untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from reactivex import Observable, abc
from reactivex.disposable import Disposable

__all__ = ["attach"]

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
