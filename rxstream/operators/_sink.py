"""``ctx.stream(name, …)`` in sink mode: egress to the session transport, and timing.

The sink stamps ``<name>.in``/``<name>.out`` around the hand-off to the transport and passes
every item on, so the run can count what egressed and ``drive()`` can return it (a drive
returns its items and sends nothing to the transport, which only a threaded run opens). It folds
the timeline of each conditioned window into one :class:`~rxstream.timing.TimingRecord`:
the first frame of every new ``input_seq`` of each input stream, and every cutover (a steer or
a rebuild), never an idle repeat. The record is logged as ``[timing:<name>]`` and given to
``on_timing`` and to the transport's ``on_timing``; it carries the run's id (``run``), read
from the shell when the record is folded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from reactivex import abc

from rxstream._exceptions import ItemRefused
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, PipelineMetadata, _base, now
from rxstream.operators._core import OnNext, per_item
from rxstream.timing._emit import emit
from rxstream.timing._record import TimingRecord, fold
from rxstream.transport import Transport
from rxstream.typing import Operator

__all__ = ["sink_operator"]


def _no_send(stream: str, item: PipelineItem) -> None:
    pass


def _no_timing(record: TimingRecord) -> None:
    pass


def _input_of(timeline: tuple[tuple[str, float], ...]) -> str:
    """The input stream an input's timeline started at: ``input.recv``, then ``<name>.in``."""
    if len(timeline) > 1 and timeline[0][0] == "input.recv":
        return timeline[1][0].removesuffix(".in")
    return ""


def sink_operator(
    stream: str,
    transport: Callable[[], Transport],
    on_timing: Callable[[TimingRecord], None] | None,
    *,
    self_testing: Callable[[], bool] = lambda: False,
) -> Callable[[StageShell], Operator]:
    """Send each item to ``transport()``'s ``stream``; emit it on, stamped; fold timing.

    A record folded while ``self_testing()`` (a ``ctx.self_test()`` block) is tagged
    ``self_test``.
    """

    def build(shell: StageShell) -> Operator:
        counters = shell.counters
        chosen = transport()
        # drive() returns what egressed and never touches the session (it is not open then)
        send = _no_send if shell.driven else chosen.send
        on_transport_timing = _no_timing if shell.driven else chosen.on_timing
        forward = shell.forward
        timing = shell.timing

        def make_on_next(observer: abc.ObserverBase[PipelineItem]) -> OnNext:
            reported: dict[str, int] = {}  # the newest input_seq reported, per input stream
            last: list[Any] = [None, ""]  # the last input seen and its stream (frames repeat it)

            def fresh(item: PipelineItem, md: PipelineMetadata) -> bool:
                """Whether the item's input is newer than what its stream reported so far."""
                seen = (md.input_seq, md.input_at_ms)
                if seen != last[0]:  # find the input stream once per input, not per frame
                    last[0], last[1] = seen, _input_of(item.metadata.timeline)
                return md.input_seq > reported.get(last[1], 0)

            def on_next(item: PipelineItem) -> None:
                started = now()
                counters.items_in += 1
                try:
                    send(stream, item)
                except ItemRefused as refused:  # not sent, on purpose: a drop, not a failure
                    counters.drop(refused.reason)
                    return
                except Exception as exc:
                    shell.failed(observer, item, exc)
                    return
                out = forward(item, item.payload, started)
                md = _base(out)
                if md.idle:  # pace's last frame again: egressed, but no new frame
                    counters.repeats += 1
                seq = md.input_seq
                if timing and not md.idle and (md.cutover or (seq and fresh(out, md))):
                    if seq:
                        reported[last[1]] = max(reported.get(last[1], 0), seq)
                    try:
                        record = fold(stream, out.metadata, time.time() * 1000, shell.run_id)
                        if self_testing():
                            record = replace(record, self_test=True)
                        emit(record, on_timing)
                        on_transport_timing(record)
                    except Exception as exc:  # on_timing raised: the item goes no further
                        counters.items_out -= 1
                        shell.failed(observer, out, exc)
                        return
                observer.on_next(out)

            return on_next

        return per_item(make_on_next)

    return build
