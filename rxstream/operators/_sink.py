"""``ctx.stream(name, …)`` in sink mode: egress to the session transport, and timing.

The sink stamps ``<name>.in``/``<name>.out`` around the hand-off to the transport and passes
every item on, so the run can count what egressed and ``drive()`` can return it (a drive
returns its items and sends nothing to the transport, which only a threaded run opens). It folds
the timeline of each conditioned window into one :class:`~rxstream.timing.TimingRecord`:
the first frame of every new ``input_seq`` of each input stream, and every cutover (a steer or
a rebuild), never an idle repeat. The record is logged as ``[timing:<name>]`` and given to
``on_timing`` and to the transport's ``on_timing``; it carries the run's id (``run``), read
from the shell when the record is folded.

A ``jpeg`` or ``h264`` sink checks each payload before the transport sees it, as its codec
will read it (:class:`~rxstream.transport._codecs.FrameCheck`: type, layout, dtype, a float
frame's value range), in every mode: a drive and a headless run encode nothing, and would
pass a frame the page or the file cannot show. A payload the codec cannot take fails the
sink with a :class:`~rxstream.transport.CodecError` naming the stream, the rule, what it got
and the stage that made it (:func:`producer_of`); so does a codec error of the transport's own
encoder (a ``raw`` stream written to ``--out``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from reactivex import abc

from rxstream._exceptions import CodecError, ItemRefused
from rxstream._kernel._kind import StageKind
from rxstream._kernel._options import StreamOptions
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, PipelineMetadata, _base, now
from rxstream.operators._core import OnNext, per_item
from rxstream.timing._emit import emit
from rxstream.timing._record import TimingRecord, fold
from rxstream.transport import Transport
from rxstream.transport._codecs import RANGE_EVERY, FrameCheck
from rxstream.typing import Operator

__all__ = ["STREAM_KIND", "producer_of", "sink_operator"]

STREAM_KIND = StageKind("stream", "1:1", sink=True, options=StreamOptions)
"""``ctx.stream``: the egress sink."""

_CHECKED = frozenset({"jpeg", "h264"})
"""The codecs whose sinks check their payloads (a ``raw`` sink may carry anything to a memory
transport; a page reading it as a frame says so)."""


def producer_of(
    timeline: tuple[tuple[str, float], ...], kinds: Mapping[str, StageKind]
) -> str | None:
    """The stage that made an item's payload: the last stage with an ``.out`` stamp in
    ``timeline`` whose kind may change a payload (one that does not declare ``passes``: not a
    ``tap``, ``pace``, ``merge``, ``unbatch`` or ``throttle``); boundary stamps are skipped.
    ``None`` when the stamps do not tell (timing off)."""
    for hop, _ in reversed(timeline):
        if hop.endswith(".out"):
            name = hop[:-4]
            kind = kinds.get(name)
            if kind is not None and not kind.passes:
                return name
    return None


def _no_send(stream: str, item: PipelineItem) -> None:
    pass


def _no_timing(record: TimingRecord) -> None:
    pass


def _input_of(timeline: tuple[tuple[str, float], ...]) -> str:
    """The input stream an input's timeline started at: ``input.recv``, then ``<name>.in``."""
    if len(timeline) > 1 and timeline[0][0] == "input.recv":
        return timeline[1][0].removesuffix(".in")
    return ""


def _named(exc: CodecError, item: PipelineItem, kinds: Mapping[str, StageKind]) -> CodecError:
    """``exc`` naming the stage that made ``item``'s payload, when the stamps tell."""
    maker = producer_of(item.metadata.timeline, kinds)
    return exc if maker is None else CodecError(f"{exc} from stage {maker!r}")


def _checked(
    send: Callable[[str, PipelineItem], None], check: FrameCheck
) -> Callable[[str, PipelineItem], None]:
    """``send`` after ``check`` passed the payload; a :class:`CodecError` if it did not."""

    def checked(stream: str, item: PipelineItem) -> None:
        problem = check(item.payload)
        if problem is not None:
            raise CodecError(f"stream {stream!r}: {problem}")
        send(stream, item)

    return checked


def sink_operator(
    stream: str,
    transport: Callable[[], Transport],
    on_timing: Callable[[TimingRecord], None] | None,
    *,
    codec: str = "raw",
    self_testing: Callable[[], bool] = lambda: False,
) -> Callable[[StageShell], Operator]:
    """Send each item to ``transport()``'s ``stream``; emit it on, stamped; fold timing.

    A ``jpeg`` or ``h264`` ``codec`` checks each payload first (see the module docstring). A
    record folded while ``self_testing()`` (a ``ctx.self_test()`` block) is tagged
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
        kinds = shell.stage_kinds
        gpu_clock = shell.gpu_clock
        checked = codec in _CHECKED

        def make_on_next(observer: abc.ObserverBase[PipelineItem]) -> OnNext:
            reported: dict[str, int] = {}  # the newest input_seq reported, per input stream
            last: list[Any] = [None, ""]  # the last input seen and its stream (frames repeat it)
            deliver: Callable[[str, PipelineItem], None] = send
            if checked:  # a drive checks every frame's range: it is what the self test sees
                every = 1 if shell.driven else RANGE_EVERY
                deliver = _checked(send, FrameCheck(every=every, same_size=codec == "h264"))

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
                    deliver(stream, item)
                except ItemRefused as refused:  # not sent, on purpose: a drop, not a failure
                    counters.drop(refused.reason)
                    return
                except CodecError as exc:  # a payload the codec cannot take: who made it
                    shell.failed(observer, item, _named(exc, item, kinds))
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
                        record = fold(
                            stream, out.metadata, time.time() * 1000, shell.run_id, gpu_clock
                        )
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
