"""``ctx.window(count=…, ms=…, until=…)``: N:1 windows (Rx ``buffer_with_time_or_count``).

A window opens with its first item and is emitted when it holds ``count`` items, ``ms``
milliseconds after it opened, or with an item for which ``until(payload)`` is true (that item
is the window's last), whichever comes first; empty windows are never emitted. ``until`` lets
another stream's ticks close the windows (a clock merged in: one window per tick, no race
between a timer and a tick due at the same instant). The payload is the list of payloads; the
metadata is the N:1 merge, so the newest tick's input correlation travels on. The time runs on
the stage's scheduler (virtual under ``drive``).

The output's stamps are ``window.in`` (the arrival of the item whose timeline the merge keeps:
the newest input), ``window.hold`` (the window closed) and ``window.out``: the time that item
waited for its window to close is its hold, not compute (:mod:`rxstream.operators._hold`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reactivex import abc
from reactivex.disposable import CompositeDisposable, Disposable, SerialDisposable

from rxstream._kernel._kind import StageKind
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, _newest, merge_metadata, now
from rxstream.operators._core import attach, one_input
from rxstream.operators._hold import held_stamps
from rxstream.typing import ItemStream, Operator

__all__ = ["WINDOW_KIND", "window_operator"]

WINDOW_KIND = StageKind("window", "N:1", holds=True)
"""``ctx.window``: it holds the open window."""


def window_operator(
    count: int | None, ms: float | None, until: Callable[[Any], bool] | None = None
) -> Callable[[StageShell], Operator]:
    """Windows of at most ``count`` items, closed ``ms`` after they opened or by ``until``."""
    span = None if ms is None else ms / 1000.0

    def build(shell: StageShell) -> Operator:
        stamps = held_stamps(shell)

        def subscribe(
            source: ItemStream,
            observer: abc.ObserverBase[PipelineItem],
            scheduler: abc.SchedulerBase | None,
        ) -> abc.DisposableBase:
            window: list[PipelineItem] = []
            arrivals: list[float] = []
            timer = SerialDisposable()
            opened = [0]  # which window a timer belongs to

            def flush() -> None:
                if not window:
                    return
                released = now()
                items = list(window)
                metadatas = [item.metadata for item in items]
                arrived = arrivals[_newest(metadatas)]
                window.clear()
                arrivals.clear()
                shell.counters.held = 0
                opened[0] += 1
                timer.disposable = None
                metadata = merge_metadata(metadatas, stamps(arrived, released))
                observer.on_next(shell.emit([item.payload for item in items], metadata))

            def on_timeout(_s: abc.SchedulerBase, which: Any = None) -> None:
                if which == opened[0]:
                    flush()

            def on_next(item: PipelineItem) -> None:
                arrivals.append(now())
                shell.counters.items_in += 1
                window.append(item)
                if span is not None:  # held until the window's timer closes it at the latest
                    shell.counters.held = len(window)
                    if len(window) == 1:
                        timer.disposable = shell.scheduler.schedule_relative(
                            span, on_timeout, opened[0]
                        )
                if count is not None and len(window) >= count:
                    flush()
                elif until is not None:
                    try:
                        closes = until(item.payload)
                    except Exception as exc:  # the user's predicate: the stage's error policy
                        window.pop()
                        arrivals.pop()
                        shell.counters.held = len(window) if span is not None else 0
                        shell.failed(observer, item, exc)
                        return
                    if closes:
                        flush()

            def on_completed() -> None:
                flush()
                observer.on_completed()

            def on_dispose() -> None:
                if window:  # items of an open window when the run ends
                    shell.counters.drop("stopped", len(window))
                    window.clear()
                    shell.counters.held = 0

            upstream = attach(source, on_next, observer.on_error, on_completed, scheduler)
            return CompositeDisposable(upstream, timer, Disposable(on_dispose))

        return one_input(subscribe)

    return build
