"""The floors of bench/hop.py's chain, no engine: the cheapest bounded chains Python can make.

A source thread and four stage threads (``p1``..``p4``), each calling ``noop`` (``p4``: the
chain's ``last``), each hand-off two C ``queue.SimpleQueue``s: the items, and ``capacity``
free-slot tokens (the producer takes a token before it puts, the consumer gives it back as it
takes the item). ``FloorStampedChain`` adds exactly bench/hop.py's hand-written chain's stamps;
the ``Fused`` floors run ``p1``..``p4`` back to back on one thread after the source (the fused
shape's floor). No engine of the same shape does less per item: bench/hop.py and
bench/peers.py measure them beside the chains and print, per capacity, whether a floor reaches
a target (:func:`floor_line`).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from _report import STOP, Threads, ignore, noop, pulled, spread, verdict

from rxstream._kernel._generations import Generations
from rxstream._kernel._stats import StageCounters
from rxstream.item import (
    PipelineItem,
    _base,
    _forward,
    _new,
    _set_md,
    _set_payload,
    _set_st,
    _sourced,
    _trusted_metadata,
    now,
)

__all__ = [
    "FloorChain",
    "FloorItemsChain",
    "FloorItemsInlineChain",
    "FloorPlainItemsChain",
    "FloorStampedChain",
    "FusedFloorChain",
    "FusedFloorItemsChain",
    "FusedFloorStampedChain",
    "floor_line",
    "items_line",
]

STAGES = ("p1", "p2", "p3", "p4")
"""bench/hop.py's stage names (its chain: a source and these four)."""
JOIN_S = 10.0

_monotonic = time.monotonic


class _HandOff:
    """A bounded hand-off of two C queues: the items, and ``capacity`` free-slot tokens; the
    producer takes a token before it puts, the consumer gives it back as it takes the item."""

    __slots__ = ("items", "tokens")

    def __init__(self, capacity: int) -> None:
        self.items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(capacity):
            self.tokens.put(None)


def _floor_source(pull: Callable[[], Any], out: _HandOff, stamps: bool) -> Callable[[], None]:
    """A source thread body: take a token, put the next value (with ``stamps``, stamped as
    bench/hop.py's ``_hand_source`` stamps it)."""
    put, take = out.items.put, out.tokens.get

    def bare() -> None:
        for value in pulled(pull):
            take()
            put(value)
        take()
        put(STOP)

    def stamped() -> None:
        values = pulled(pull)
        while True:
            started = _monotonic()
            value = next(values, STOP)
            take()
            if value is STOP:
                put(STOP)
                return
            put((value, (("src.in", started), ("src.out", _monotonic()))))

    return stamped if stamps else bare


def _floor_stage(
    names: Sequence[str],
    fns: Sequence[Callable[[Any], Any]],
    inbox: _HandOff,
    outbox: _HandOff | None,
    stamps: bool,
) -> Callable[[], None]:
    """A stage thread body: take an item, give its token back, call ``fns`` back to back (one
    function: a stage; four: the fused shape's floor, always the end), put the result on unless
    it is the end. With ``stamps``, each call is stamped as bench/hop.py's ``_hand_stage``
    stamps it."""
    get, give = inbox.items.get, inbox.tokens.put
    end = outbox is None
    put, take = (ignore, tuple) if outbox is None else (outbox.items.put, outbox.tokens.get)
    hops = [(f"{name}.in", f"{name}.out") for name in names]

    def one() -> None:
        (fn,) = fns
        while True:
            value = get()
            if value is STOP:
                take()
                put(STOP)
                return
            give(None)
            out = fn(value)
            if not end:
                take()
                put(out)

    def one_stamped() -> None:
        (fn,) = fns
        ((in_hop, out_hop),) = hops
        while True:
            message = get()
            if message is STOP:
                take()
                put(STOP)
                return
            give(None)
            started = _monotonic()
            payload, timeline = message
            out = fn(payload)
            timeline = timeline + ((in_hop, started), (out_hop, _monotonic()))  # noqa: RUF005
            if not end:
                take()
                put((out, timeline))

    def four() -> None:
        f1, f2, f3, f4 = fns
        while True:
            value = get()
            if value is STOP:
                return
            give(None)
            f4(f3(f2(f1(value))))

    def four_stamped() -> None:
        f1, f2, f3, f4 = fns
        (i1, o1), (i2, o2), (i3, o3), (i4, o4) = hops
        while True:
            message = get()
            if message is STOP:
                return
            give(None)
            started = _monotonic()
            payload, timeline = message
            out = f1(payload)
            timeline = timeline + ((i1, started), (o1, _monotonic()))  # noqa: RUF005
            started = _monotonic()
            out = f2(out)
            timeline = timeline + ((i2, started), (o2, _monotonic()))  # noqa: RUF005
            started = _monotonic()
            out = f3(out)
            timeline = timeline + ((i3, started), (o3, _monotonic()))  # noqa: RUF005
            started = _monotonic()
            out = f4(out)
            timeline = timeline + ((i4, started), (o4, _monotonic()))  # noqa: RUF005

    if len(fns) == 1:
        return one_stamped if stamps else one
    if not end:
        raise RuntimeError("the fused shape's floor is the chain's end")
    return four_stamped if stamps else four


class FloorChain(Threads):
    """The floor, no engine: ``src`` and ``p1``..``p4`` as plain threads, each hand-off a
    ``_HandOff`` of two C ``queue.SimpleQueue``s, no stamps: the cheapest bounded
    thread-per-stage chain Python can make (``stamps``: with the hand-written chain's stamps;
    ``fused``: ``p1``..``p4`` back to back on one thread after the source, the fused shape's
    floor)."""

    what = "floor chain"
    join_s = JOIN_S

    stamps = False
    fused = False

    def __init__(self, pull: Callable[[], Any], last: Callable[[Any], Any], capacity: int):
        fns = [noop] * (len(STAGES) - 1) + [last]
        pairs = zip(STAGES, fns, strict=True)
        groups = [(STAGES, fns)] if self.fused else [((name,), [fn]) for name, fn in pairs]
        hand_offs = [_HandOff(capacity) for _ in groups]
        bodies = [_floor_source(pull, hand_offs[0], self.stamps)]
        for index, (names, group) in enumerate(groups):
            outbox = hand_offs[index + 1] if index + 1 < len(hand_offs) else None
            bodies.append(_floor_stage(names, group, hand_offs[index], outbox, self.stamps))
        self._threads = [threading.Thread(target=body, daemon=True) for body in bodies]


class FloorStampedChain(FloorChain):
    """The floor with exactly the hand-written chain's stamps."""

    stamps = True


class FusedFloorChain(FloorChain):
    """The fused shape's floor: a source thread, one thread calling ``p1``..``p4`` back to
    back; no stamps."""

    fused = True


class FusedFloorStampedChain(FusedFloorChain):
    """The fused shape's floor with the hand-written chain's stamps on each of the 4 calls."""

    stamps = True


def _items_source(
    pull: Callable[[], Any], out: _HandOff, generations: Generations
) -> Callable[[], None]:
    """A source thread body making rxstream's items: each value with its metadata (the
    generations now, its ``pts``) and its ``src.in``/``src.out`` stamps, counted."""
    put, take = out.items.put, out.tokens.get
    counters = StageCounters("src", "source")

    def body() -> None:
        values = pulled(pull)
        pts = 0
        while True:
            started = now()
            value = next(values, STOP)
            take()
            if value is STOP:
                put(STOP)
                return
            counters.items_in += 1
            item = _sourced(
                value,
                generations.prompt,
                generations.flush,
                False,
                generations.drop,
                pts,
                0,
                0,
                (),
                "src.in",
                started,
                "src.out",
                now(),
            )
            pts += 1
            counters.items_out += 1
            put(item)

    return body


def _items_stage(
    names: Sequence[str],
    fns: Sequence[Callable[[Any], Any]],
    inbox: _HandOff,
    outbox: _HandOff | None,
    generations: Generations,
) -> Callable[[], None]:
    """A stage thread body over rxstream's items: for each of ``fns`` in turn (one: a stage;
    four: the fused shape), the routine admission, the counters, the stamps, the call and the
    new item (see the module docstring); put on unless it is the end."""
    get, give = inbox.items.get, inbox.tokens.put
    end = outbox is None
    put, take = (ignore, tuple) if outbox is None else (outbox.items.put, outbox.tokens.get)
    steps = [
        (fn, StageCounters(name, "pipe"), f"{name}.in", f"{name}.out")
        for name, fn in zip(names, fns, strict=True)
    ]
    flushed = generations.flush

    def body() -> None:
        while True:
            item: PipelineItem = get()
            if item is STOP:
                if not end:
                    take()
                    put(STOP)
                return
            give(None)
            for fn, counters, in_hop, out_hop in steps:
                base = _base(item)
                if (
                    base.cutover
                    or base.flush_generation > flushed
                    or base.prompt_generation < generations.drop
                ):
                    raise RuntimeError("the items floor admits routine items only")
                started = now()
                counters.items_in += 1
                out = fn(item.payload)
                counters.items_out += 1
                item = _forward(item, out, in_hop, started, out_hop, now())
            if not end:
                take()
                put(item)

    return body


class FloorItemsChain(FloorChain):
    """The floor carrying rxstream's items (see the module docstring): ``src`` and
    ``p1``..``p4`` as plain threads over C-queue hand-offs, each stage's per-item work the
    engine's, inline (``fused``: the four stages back to back on one thread)."""

    what = "items floor chain"

    def __init__(self, pull: Callable[[], Any], last: Callable[[Any], Any], capacity: int):
        fns = [noop] * (len(STAGES) - 1) + [last]
        pairs = list(zip(STAGES, fns, strict=True))
        groups = [pairs] if self.fused else [[pair] for pair in pairs]
        hand_offs = [_HandOff(capacity) for _ in groups]
        generations = Generations()
        bodies = [_items_source(pull, hand_offs[0], generations)]
        for index, group in enumerate(groups):
            outbox = hand_offs[index + 1] if index + 1 < len(hand_offs) else None
            names = [name for name, _ in group]
            calls = [fn for _, fn in group]
            bodies.append(_items_stage(names, calls, hand_offs[index], outbox, generations))
        self._threads = [threading.Thread(target=body, daemon=True) for body in bodies]


class FusedFloorItemsChain(FloorItemsChain):
    """The fused shape's floor carrying rxstream's items: a source thread, one thread doing
    the four stages' per-item work back to back."""

    fused = True


def floor_line(
    capacity: int,
    shapes: Sequence[tuple[str, Sequence[float], Sequence[float]]],
    baseline: Sequence[float],
    against: str,
    target: float,
) -> str:
    """One line: whether each floor shape, ``(name, plain, stamped)`` figures of the run,
    reaches ``target`` times ``baseline`` (the median of the ratios paired by repetition, as a
    row's verdict; the better of the two: a stamped figure above the plain one is noise, and
    counts)."""
    parts, missed = [], 0
    for name, plain, stamped in shapes:
        ratios, _ = verdict(plain, baseline, None)
        stamped_ratios, _ = verdict(stamped, baseline, None)
        best = max(statistics.median(ratios), statistics.median(stamped_ratios))
        missed += best < target
        parts.append(
            f"{name} {spread(ratios, 2, 'x')}, with the stamps {spread(stamped_ratios, 2, 'x')}:"
            f" {'reaches it' if best >= target else 'below it'}"
        )
    shape = "this shape" if len(shapes) == 1 else "these shapes"
    bound = (
        f"the floor of {shape}, a chain that does nothing but its hand-offs and calls, did "
        "not reach the target in this run (its own slots of the repetitions: under load a "
        "chain measured in another slot can read higher)"
        if missed == len(shapes)
        else "a bare chain reached the target in this run: what an engine adds decides"
    )
    return (
        f"- capacity {capacity}, the target ≥ {target:.1f}x {against}: {'; '.join(parts)}. "
        f"So {bound}."
    )


class _PlainItem:
    """An item's slots in a class that is not frozen (the plain-assignment floor's item)."""

    __slots__ = ("_md", "_st", "metadata", "payload")


def _inline_bodies(
    pull: Callable[[], Any],
    hand_offs: Sequence[_HandOff],
    fns: Sequence[Callable[[Any], Any]],
    plain: bool,
) -> list[Callable[[], None]]:
    """The 5 thread bodies of a representation floor: a source making each item's metadata
    (``_trusted_metadata``) and the item inline, four stages each doing the items floor's work
    with the item read and made inline (``plain``: a :class:`_PlainItem` by assignment; else a
    ``PipelineItem`` through its slots' setters)."""
    generations = Generations()
    flushed = generations.flush

    def source() -> None:
        put, take = hand_offs[0].items.put, hand_offs[0].tokens.get
        counters = StageCounters("src", "source")
        values = pulled(pull)
        pts = 0
        while True:
            started = now()
            value = next(values, STOP)
            take()
            if value is STOP:
                put(STOP)
                return
            counters.items_in += 1
            base = _trusted_metadata(
                generations.prompt, generations.flush, False, generations.drop,
                pts, False, None, 0, 0, (),
            )  # fmt: skip
            link = (None, "src.in", started, "src.out", now())
            if plain:
                item: Any = _new(_PlainItem)
                item.payload, item._md, item._st = value, base, link
            else:
                item = _new(PipelineItem)
                _set_payload(item, value)
                _set_md(item, base)
                _set_st(item, link)
            pts += 1
            counters.items_out += 1
            put(item)

    def stage(index: int) -> Callable[[], None]:
        name, fn = STAGES[index], fns[index]
        inbox = hand_offs[index]
        end = index + 1 == len(hand_offs)
        put, take = (ignore, tuple) if end else (hand_offs[index + 1].items.put,
                                                 hand_offs[index + 1].tokens.get)  # fmt: skip
        get, give = inbox.items.get, inbox.tokens.put
        counters = StageCounters(name, "pipe")
        in_hop, out_hop = f"{name}.in", f"{name}.out"

        def body() -> None:
            while True:
                item = get()
                if item is STOP:
                    if not end:
                        take()
                        put(STOP)
                    return
                give(None)
                base = item._md
                if (
                    base.cutover
                    or base.flush_generation > flushed
                    or base.prompt_generation < generations.drop
                ):
                    raise RuntimeError("the representation floors admit routine items only")
                started = now()
                counters.items_in += 1
                out = fn(item.payload)
                counters.items_out += 1
                link = (item._st, in_hop, started, out_hop, now())
                if plain:
                    fresh: Any = _new(_PlainItem)
                    fresh.payload, fresh._md, fresh._st = out, base, link
                else:
                    fresh = _new(PipelineItem)
                    _set_payload(fresh, out)
                    _set_md(fresh, base)
                    _set_st(fresh, link)
                if not end:
                    take()
                    put(fresh)

        return body

    return [source] + [stage(index) for index in range(len(STAGES))]


class FloorItemsInlineChain(FloorChain):
    """The items floor with the item read and made inline, through a ``PipelineItem``'s slot
    setters (the frozen class's own way; see the module docstring)."""

    what = "items floor chain, inline"
    plain = False

    def __init__(self, pull: Callable[[], Any], last: Callable[[Any], Any], capacity: int):
        fns = [noop] * (len(STAGES) - 1) + [last]
        hand_offs = [_HandOff(capacity) for _ in STAGES]
        bodies = _inline_bodies(pull, hand_offs, fns, self.plain)
        self._threads = [threading.Thread(target=body, daemon=True) for body in bodies]


class FloorPlainItemsChain(FloorItemsInlineChain):
    """The same with a plain slotted class written by assignment (not frozen: what the items
    would cost if an engine-made item could be written like any object)."""

    what = "plain-slots floor chain"
    plain = True


def items_line(
    capacity: int,
    shapes: Sequence[tuple[str, Sequence[float]]],
    baseline: Sequence[float],
    against: str,
    target: float,
) -> str:
    """One line: whether each floor carrying rxstream's items, ``(name, figures)`` of the run,
    reaches ``target`` times ``baseline`` (the median of the ratios paired by repetition)."""
    parts, missed = [], 0
    for name, figures in shapes:
        ratios, _ = verdict(figures, baseline, None)
        reached = statistics.median(ratios) >= target
        missed += not reached
        parts.append(f"{name} {spread(ratios, 2, 'x')}: {'reaches it' if reached else 'below it'}")
    bound = (
        "no chain that carries rxstream's items on this shape (their metadata, stamps, counters "
        "and admission, inline, nothing else) reached the target in this run: it is past what "
        "the items allow here, whatever an engine's layers"
        if missed == len(shapes)
        else "a chain carrying rxstream's items reached the target in this run: the engine's "
        "layers above the items decide"
    )
    return (
        f"- capacity {capacity}, the target ≥ {target:.1f}x {against}, with rxstream's items: "
        f"{'; '.join(parts)}. So {bound}."
    )
