"""Fan-in: ``[a, b] | ctx.merge() / ctx.zip() / ctx.combine()`` (Rx merge, zip, combine_latest).

Each output of ``zip``/``combine`` is one group of input items; its metadata follows the N:1
rule (:func:`rxstream.item.merge_metadata`), so the newest input's correlation and timeline
travel on (``cutover`` if any input had it: an input's marked item marks every ``combine``
output it is part of). ``merge`` passes a steer's mark once, however many of its inputs'
sources marked it (:class:`_Cutovers`). ``items_in`` counts arrivals on every input; an
arrival that never becomes part of an output is counted as dropped, reason ``unpaired``: for
``combine`` a value replaced before every input had one, for ``zip`` what is left unpaired
when it completes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import reactivex
from reactivex import Observable, Observer, abc, operators
from reactivex.disposable import CompositeDisposable

from rxstream._kernel._kind import StageKind
from rxstream._kernel._shell import StageShell
from rxstream.item import (
    PipelineItem,
    _base,
    _from_parts,
    _parts,
    evolve_metadata,
    merge_metadata,
    now,
)
from rxstream.operators._core import attach
from rxstream.typing import ItemStream, Operator

__all__ = [
    "COMBINE_KIND",
    "MERGE_KIND",
    "ZIP_KIND",
    "combine_groups",
    "combine_operator",
    "merge_operator",
    "merged",
    "zip_operator",
]

MERGE_KIND = StageKind("merge", "1:1", passes=True)
"""``ctx.merge``: every item of every input."""

ZIP_KIND = StageKind("zip", "N:1")
"""``ctx.zip``: one output per index of the inputs."""

COMBINE_KIND = StageKind("combine", "N:1")
"""``ctx.combine``: one output per arrival, once each input has one."""

Group = tuple[PipelineItem, ...]


class _Cutovers:
    """One cutover a steer at a merge.

    Every source marks its first item of a new prompt generation, so two sources would bring a
    steer's mark twice. The first input to bring the new generation's marked item keeps the
    mark; the first items of that generation from the other inputs lose it. A mark on a later
    item of an input (a ``doc.bind`` swap's) is kept.
    """

    def __init__(self, inputs: int) -> None:
        self._seen = [-1] * inputs  # the newest prompt generation each input brought
        self._cut = -1  # the newest generation whose mark went out

    def admit(self, index: int, item: PipelineItem) -> PipelineItem:
        """``item``, arriving on input ``index``: as it is, or without a second mark."""
        base = _base(item)
        generation = base.prompt_generation
        if generation > self._seen[index]:  # this input's first item of a generation
            self._seen[index] = generation
            if base.cutover:
                if self._cut == generation:  # another input's went out already
                    return _uncut(item)
                self._cut = max(self._cut, generation)
        return item


def combine_groups(ports: Sequence[ItemStream], shell: StageShell) -> Observable[Group]:
    """The latest item of every input, each time any input emits (once all have one)."""
    counters = shell.counters

    def subscribe(
        observer: abc.ObserverBase[Group], scheduler: abc.SchedulerBase | None = None
    ) -> abc.DisposableBase:
        n = len(ports)
        latest: list[PipelineItem | None] = [None] * n
        unused = [False] * n  # latest[i] has not been part of an output yet
        done = [False] * n

        def on_next(index: int, item: PipelineItem) -> None:
            counters.items_in += 1
            if unused[index]:
                counters.drop("unpaired")
            latest[index] = item
            unused[index] = True
            if None in latest:
                return
            unused[:] = [False] * n
            observer.on_next(tuple(latest))  # type: ignore[arg-type]

        def on_completed(index: int) -> None:
            done[index] = True
            if all(done) or latest[index] is None:  # no output can come any more
                leftover = sum(unused)
                if leftover:
                    counters.drop("unpaired", leftover)
                    unused[:] = [False] * n
                observer.on_completed()

        def port_observer(index: int) -> abc.ObserverBase[PipelineItem]:
            return Observer(
                lambda item: on_next(index, item), observer.on_error, lambda: on_completed(index)
            )

        return CompositeDisposable(
            [port.subscribe(port_observer(i), scheduler=scheduler) for i, port in enumerate(ports)]
        )

    return Observable(subscribe)


def _zip_groups(ports: Sequence[ItemStream], shell: StageShell) -> Observable[Group]:
    """Rx ``zip``; arrivals counted, and what is left unpaired at completion dropped."""
    counters = shell.counters
    arrivals = [0]
    paired = [0]

    def arrive(item: PipelineItem) -> PipelineItem:
        counters.items_in += 1
        arrivals[0] += 1
        return item

    def pair(group: Group) -> Group:
        paired[0] += len(group)
        return group

    def settle() -> None:
        leftover = arrivals[0] - paired[0]
        if leftover:
            counters.drop("unpaired", leftover)

    counted = [port.pipe(operators.map(arrive)) for port in ports]
    return reactivex.zip(*counted).pipe(
        operators.map(pair), operators.do_action(on_completed=settle)
    )


def merged(
    groups: Observable[Group],
    shell: StageShell,
    combine: Callable[[tuple[Any, ...]], Any],
) -> ItemStream:
    """Each group of items as one item: ``combine(payloads)`` with the merged metadata."""

    def subscribe(
        observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
    ) -> abc.DisposableBase:
        def on_next(group: Group) -> None:
            started = now()
            try:
                payload = combine(tuple(item.payload for item in group))
            except Exception as exc:
                shell.failed(observer, group[-1], exc)
                return
            metadata = merge_metadata([item.metadata for item in group], shell.stamps(started))
            observer.on_next(shell.emit(payload, metadata))

        return groups.subscribe(
            on_next, observer.on_error, observer.on_completed, scheduler=scheduler
        )

    return Observable(subscribe)


def _grouping(
    groups: Callable[[Sequence[ItemStream], StageShell], Observable[Group]],
    fn: Callable[..., Any] | None,
) -> Callable[[StageShell], Operator]:
    combine: Callable[[tuple[Any, ...]], Any] = (
        (lambda payloads: payloads) if fn is None else (lambda payloads: fn(*payloads))
    )

    def build(shell: StageShell) -> Operator:
        return lambda ports: merged(groups(ports, shell), shell, combine)

    return build


def zip_operator(fn: Callable[..., Any] | None = None) -> Callable[[StageShell], Operator]:
    """Pair the inputs index by index; payload ``fn(*payloads)`` or the tuple of payloads."""
    return _grouping(_zip_groups, fn)


def combine_operator(fn: Callable[..., Any] | None = None) -> Callable[[StageShell], Operator]:
    """The latest of every input on each arrival; ``fn(*payloads)`` or the tuple."""
    return _grouping(combine_groups, fn)


def merge_operator() -> Callable[[StageShell], Operator]:
    """Every item of every input, in arrival order, metadata kept (plus stamps); one cutover
    a steer (:class:`_Cutovers`)."""

    def build(shell: StageShell) -> Operator:
        counters = shell.counters

        def operator(ports: Sequence[ItemStream]) -> ItemStream:
            def subscribe(
                observer: abc.ObserverBase[PipelineItem],
                scheduler: abc.SchedulerBase | None = None,
            ) -> abc.DisposableBase:
                n = len(ports)
                done = [False] * n
                admit = _Cutovers(n).admit

                def on_next(index: int, item: PipelineItem) -> None:
                    started = now()
                    counters.items_in += 1
                    item = admit(index, item)
                    observer.on_next(shell.forward(item, item.payload, started))

                def on_completed(index: int) -> None:
                    done[index] = True
                    if all(done):
                        observer.on_completed()

                def port(index: int, stream: ItemStream) -> abc.DisposableBase:
                    return attach(
                        stream,
                        lambda item: on_next(index, item),
                        observer.on_error,
                        lambda: on_completed(index),
                        scheduler,
                    )

                # every port reaches this stage's thread through its inbox: one at a time
                return CompositeDisposable([port(i, stream) for i, stream in enumerate(ports)])

            return Observable(subscribe)

        return operator

    return build


def _uncut(item: PipelineItem) -> PipelineItem:
    """``item`` without its cutover mark (its stamps kept)."""
    base, chain = _parts(item)
    return _from_parts(item.payload, evolve_metadata(base, cutover=False), chain)
