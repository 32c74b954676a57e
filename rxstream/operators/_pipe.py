"""``ctx.pipe`` and ``ctx.tap``: 1:1 stages (Rx ``map`` and ``do_action``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from reactivex import Observable, abc

from rxstream._kernel._generations import Admitted
from rxstream._kernel._kind import StageKind
from rxstream._kernel._options import PipeOptions
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, _base, _forward, now
from rxstream.operators._core import OnNext, attach, per_item
from rxstream.operators._fanin import combine_groups, merged
from rxstream.typing import ItemStream, Operator, StageFn

__all__ = ["PIPE_KIND", "TAP_KIND", "caller", "pipe_operator", "tap_operator"]

PIPE_KIND = StageKind("pipe", "1:1", fan_in="N:1", timed=True, fusable=True, options=PipeOptions)
"""``ctx.pipe``: 1:1, and N:1 under fan-in (the latest of each input)."""

TAP_KIND = StageKind("tap", "1:1", timed=True, passes=True)
"""``ctx.tap``: the item passes on."""


def caller(fn: StageFn, shell: StageShell) -> Callable[..., Any]:
    """``fn`` itself, or for an ``async def`` a call that runs it on the pipeline's loop;
    inside the stage's CUDA events and NVTX range when it has a timer (``shell.gpu``)."""
    call: Callable[..., Any] = fn
    if inspect.iscoroutinefunction(fn):
        call = lambda *args: shell.call_async(fn(*args))  # noqa: E731
    return call if shell.gpu is None else shell.gpu.wrap(call)


def pipe_operator(fn: StageFn, *, items: bool = False) -> Callable[[StageShell], Operator]:
    """``fn(payload) -> payload`` per item; under fan-in, ``fn(*payloads)`` over combine.

    Behind its own stage's port (an :class:`Admitted` input: not through a chunk buffer, not
    under fan-in) the pipe takes the items unchecked and admits each itself, first in its
    ``on_next``: a routine item costs a compare chain, any other goes to ``Admission.admit``.
    """

    def build(shell: StageShell) -> Operator:
        call = caller(fn, shell)
        counters = shell.counters
        forward = shell.forward
        failed = shell.failed
        timing = shell.timing
        in_hop, out_hop = shell.in_hop, shell.out_hop
        timer = shell.gpu  # NVTX names the call's input_seq

        def operator(ports: Sequence[ItemStream]) -> ItemStream:
            if len(ports) > 1:
                return _fan_in_pipe(call, shell, ports)
            source = ports[0]
            # the stage's own port: the pipe admits each item itself, in its on_next
            port = source if isinstance(source, Admitted) and source.stage is shell else None

            def subscribe(
                observer: abc.ObserverBase[PipelineItem],
                scheduler: abc.SchedulerBase | None = None,
            ) -> abc.DisposableBase:
                on_next_down = observer.on_next
                admits = port is not None
                admission = shell.admission()
                admit = admission.admit
                generations = shell.generations
                flushed = admission.flushed

                def on_next(item: PipelineItem) -> None:
                    nonlocal flushed
                    if admits:
                        # Admission.admitting's routine check, written out (one call fewer)
                        base = _base(item)
                        if (
                            base.cutover
                            or base.flush_generation > flushed
                            or base.prompt_generation < generations.drop
                        ):
                            if not admit(base):
                                return
                            flushed = admission.flushed
                    started = now()
                    counters.items_in += 1
                    if timer is not None:
                        timer.input_seq = _base(item).input_seq
                    try:
                        out = call(item if items else item.payload)
                    except Exception as exc:
                        failed(observer, item, exc)
                        return
                    if isinstance(out, PipelineItem):
                        item, out = out, out.payload
                    if timing:  # shell.forward's stamped rule, without its call
                        counters.items_out += 1
                        on_next_down(_forward(item, out, in_hop, started, out_hop, now()))
                    else:
                        on_next_down(forward(item, out, started))

                if port is not None:
                    return port.unadmitted(
                        on_next, observer.on_error, observer.on_completed, scheduler
                    )
                return attach(source, on_next, observer.on_error, observer.on_completed, scheduler)

            return Observable(subscribe)

        return operator

    return build


def _fan_in_pipe(
    call: Callable[..., Any], shell: StageShell, ports: Sequence[ItemStream]
) -> ItemStream:
    """``[a, b] | ctx.pipe(f)``: combine the latest of each input, then ``f(*payloads)``."""
    return merged(combine_groups(ports, shell), shell, lambda payloads: call(*payloads))


def tap_operator(fn: StageFn) -> Callable[[StageShell], Operator]:
    """``fn(payload)`` as a side effect; the item passes on unchanged (plus stamps)."""

    def build(shell: StageShell) -> Operator:
        call = caller(fn, shell)
        counters = shell.counters
        timer = shell.gpu

        def make_on_next(observer: abc.ObserverBase[PipelineItem]) -> OnNext:
            def on_next(item: PipelineItem) -> None:
                started = now()
                counters.items_in += 1
                if timer is not None:
                    timer.input_seq = _base(item).input_seq
                try:
                    call(item.payload)
                except Exception as exc:
                    shell.failed(observer, item, exc)
                    return
                observer.on_next(shell.forward(item, item.payload, started))

            return on_next

        return per_item(make_on_next)

    return build
