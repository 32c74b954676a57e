"""``ctx.stream(name, …)`` in sink mode: egress to the session transport.

The sink stamps ``<name>.in``/``<name>.out`` around the hand-off to the transport and passes
every item on, so the run can count what egressed and ``drive()`` can return it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reactivex import Observable, abc

from rxstream.item import PipelineItem, _with_stamps, now
from rxstream.runtime._shell import StageShell
from rxstream.transport import Transport
from rxstream.typing import ItemStream, Operator

__all__ = ["sink_operator"]


def sink_operator(
    stream: str, transport: Callable[[], Transport]
) -> Callable[[StageShell], Operator]:
    """Send each item to ``transport()``'s ``stream``; emit it on, stamped."""

    def build(shell: StageShell) -> Operator:
        counters = shell.counters
        in_hop, out_hop = shell.in_hop, shell.out_hop
        send = transport().send

        def operator(ports: Sequence[ItemStream]) -> ItemStream:
            source = ports[0]

            def subscribe(
                observer: abc.ObserverBase[PipelineItem],
                scheduler: abc.SchedulerBase | None = None,
            ) -> abc.DisposableBase:
                def on_next(item: PipelineItem) -> None:
                    started = now()
                    counters.items_in += 1
                    try:
                        send(stream, item)
                    except Exception as exc:
                        shell.failed(observer, item, exc)
                        return
                    md = _with_stamps(item.metadata, ((in_hop, started), (out_hop, now())))
                    observer.on_next(shell.emit(item.payload, md))

                return source.subscribe(
                    on_next, observer.on_error, observer.on_completed, scheduler=scheduler
                )

            return Observable(subscribe)

        return operator

    return build
