"""``ctx.throttle(ms=…)``: at most one item per ``ms`` milliseconds (Rx ``throttle_first``).

An item passes and opens a quiet span of ``ms``; the items that arrive inside it are dropped,
counted as ``throttled``. The time runs on the stage's scheduler (virtual under ``drive``).
Unlike ``ctx.pace`` it holds nothing and repeats nothing: a bounded rate off a faster stream
(a preview, a status line), the newest item after a quiet span first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from reactivex import abc

from rxstream._kernel._kind import StageKind
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, now
from rxstream.operators._core import OnNext, per_item
from rxstream.typing import Operator

__all__ = ["THROTTLE_KIND", "throttle_operator"]

THROTTLE_KIND = StageKind("throttle", "1:1", passes=True)
"""``ctx.throttle``: what it does not drop passes on as it came (its drops are counted)."""


def throttle_operator(ms: float) -> Callable[[StageShell], Operator]:
    """The first item, then the first after each quiet span of ``ms`` milliseconds."""
    span = ms / 1000.0

    def build(shell: StageShell) -> Operator:
        counters = shell.counters
        clock = shell.scheduler.clock

        def make_on_next(observer: abc.ObserverBase[PipelineItem]) -> OnNext:
            quiet_until = -math.inf

            def on_next(item: PipelineItem) -> None:
                nonlocal quiet_until
                started = now()
                counters.items_in += 1
                at = clock()
                if at < quiet_until:
                    counters.drop("throttled")
                    return
                quiet_until = at + span
                observer.on_next(shell.forward(item, item.payload, started))

            return on_next

        return per_item(make_on_next)

    return build
