"""Fusing chains of 1:1 ``pipe`` stages: always under ``drive()``, on request in threads.

Under ``drive()`` a hop is a direct call, so a chain of single-input pipes needs no hop at
all: one operator calls each stage's function in turn, with each stage's own counters,
stamps (``<stage>.in``/``.out``), stale-generation check, flush reset and ``on_error``
policy, and builds one item at the end instead of one per stage. The outputs are the ones
the unfused chain gives; the only difference is that a stage's ``.in`` is the previous
stage's ``.out`` (there is no queue between them to wait in).

In a threaded run every stage is its own thread, except a pipe built with ``fuse=True``:
it runs on the thread of the stage before it (:func:`threaded_chains`), through the same
operator. :func:`check_fuse` and the plan's check (``runtime/_plan.py``) refuse what cannot
fuse (docs/concepts.md, "Fusing light stages").
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from reactivex import Observable, abc

from rxstream._exceptions import ArgumentTypeError, StageBuildError
from rxstream._kernel._generations import Generations
from rxstream._kernel._inbox import DEFAULT_CAPACITY
from rxstream._kernel._options import PipeOptions, chunks_of, fuses
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, _base, _linked, _stamped, now
from rxstream.operators._core import attach
from rxstream.operators._pipe import caller
from rxstream.runtime._plan import Plan
from rxstream.stage import Node
from rxstream.typing import ItemStream

__all__ = [
    "check_fuse",
    "fusable_chains",
    "fused",
    "fused_chain",
    "fused_into",
    "threaded_chains",
]


def check_fuse(
    name: str, fuse: object, *, fn: object, capacity: int, policy: str, chunks: object
) -> None:
    """Refuse a ``ctx.pipe(..., fuse=True)`` whose own arguments cannot fuse: a fused stage
    has no inbox (``capacity``/``policy`` other than the defaults), takes no chunks, and runs
    no ``async def`` (it would block its upstream's thread on the event loop)."""
    if not isinstance(fuse, bool):
        raise ArgumentTypeError(f"fuse must be a bool, got {fuse!r} for stage {name!r}")
    if not fuse:
        return
    rule = "a fused stage runs on its upstream's thread with no inbox"
    if capacity != DEFAULT_CAPACITY:
        raise StageBuildError(
            f"stage {name!r}: capacity cannot be given with fuse=True ({rule}), "
            f"got capacity={capacity!r}"
        )
    if policy != "block":
        raise StageBuildError(
            f"stage {name!r}: policy cannot be given with fuse=True ({rule}), got policy={policy!r}"
        )
    if chunks is not None:
        raise StageBuildError(
            f"stage {name!r}: chunks cannot be given with fuse=True (a chunked input comes "
            f"from another rank; a fused stage's upstream is on its own), got chunks={chunks!r}"
        )
    if inspect.iscoroutinefunction(fn):
        raise StageBuildError(
            f"stage {name!r}: an async def cannot be fused (fuse=True; it would block its "
            f"upstream's thread on the event loop), got fn={fn!r}"
        )


def fused(node: Node) -> bool:
    """Whether ``node`` was built with ``fuse=True``."""
    return fuses(node.stage)


def fused_into(node: Node) -> Node:
    """The node whose thread runs ``node`` (itself when it is not fused): the first upstream
    that is not fused."""
    while fused(node):
        node = node.inputs[0]
    return node


def _fusable(node: Node) -> bool:
    stage = node.stage
    options = stage.options
    return (
        stage.declared.fusable
        and len(node.inputs) == 1
        and not (isinstance(options, PipeOptions) and options.items)
        and chunks_of(stage) is None  # a chunked input is gated before the stage
    )


def fusable_chains(plan: Plan) -> dict[Node, list[Node]]:
    """The chains of two or more fusable pipes, by their last node (upstream first)."""
    chains: dict[Node, list[Node]] = {}
    current: dict[Node, list[Node]] = {}
    tails = set(plan.tails)
    for node in plan.nodes:
        if not _fusable(node):
            continue
        upstream = node.inputs[0]
        chain = current.pop(upstream, None)
        if chain is not None and plan.consumers.get(upstream, 0) == 1 and upstream not in tails:
            chain.append(node)
        else:
            chain = [node]
        current[node] = chain
    for last, chain in current.items():
        if len(chain) > 1:
            chains[last] = chain
    return chains


def threaded_chains(plan: Plan) -> dict[Node, list[Node]]:
    """The fused operators of a threaded run, by their last node (upstream first): each run of
    consecutive ``fuse=True`` pipes, headed by their upstream when that is a fusable pipe too
    (it keeps its inbox and thread; the chain runs on it). A fused ``items=True`` pipe is in
    none: it runs on its upstream's thread through a direct port."""
    chains: dict[Node, list[Node]] = {}
    for node in plan.nodes:
        if not (fused(node) and _fusable(node)):
            continue
        upstream = node.inputs[0]
        chain = chains.pop(upstream, None)
        if chain is None:
            # the plan's check made ``node`` its upstream's one consumer, and not a tail's
            chain = [upstream, node] if _fusable(upstream) and not fused(upstream) else [node]
        else:
            chain.append(node)
        chains[node] = chain
    return chains


def fused_chain(
    upstream: ItemStream, shells: Sequence[StageShell], generations: Generations
) -> ItemStream:
    """One operator running the pipes of ``shells`` in order (see the module docstring).

    Each member admits the item just before it runs, as it would on arrival unfused: a cutover
    is counted, and a flush resets, only by the members the item reaches, once each; a steer
    between two members drops the item at the next one. An item that needs none of these
    (the quick path) skips the checks while nothing changes, found by one compare a member.
    """
    # what the per-item loop reads, looked up once: each member's function, counters, and
    # where its two times go in the row of stamps (below)
    steps = [
        (index, caller(shell.target_fn, shell), shell.counters, 4 * index + 2)
        for index, shell in enumerate(shells)
    ]
    timing = shells[0].timing
    driven = shells[0].driven
    timers = [shell.gpu for shell in shells if shell.gpu is not None]  # NVTX names input_seq
    is_stale = generations.is_stale

    def subscribe(
        observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
    ) -> abc.DisposableBase:
        floor = generations.flush  # read first: no member has seen an older flush generation
        admissions = [shell.admission() for shell in shells]
        on_next_down = observer.on_next
        last = len(steps) - 1
        # an item's stamps, written in place (two times a member) and made the chain's new
        # link in one tuple at the end: ``[link, in, t, out, t, in, t, out, t…]``, the hop
        # names written once (no tuple or list made per member or per item)
        row: list[Any] = [None]
        for shell in shells:
            row += (shell.in_hop, 0.0, shell.out_hop, 0.0)
        busy = False  # an item is in the members' hands (its times half written in ``row``)

        def on_next(item: PipelineItem) -> None:
            nonlocal floor, busy
            # a member's call that led back here (a user's feedback loop through a subject)
            # must not write over the outer item's times: the inner item gets a row its own
            mine = list(row) if busy else row
            busy = True
            try:
                base = _base(item)
                epoch = generations.epoch
                # the quick path: no cutover to count, no flush a member has to reset for, not
                # stale; a change of the generations (a function steering or flushing) ends it.
                # Off it, ``epoch`` is -1: every member's compare fails and it admits the item.
                if base.cutover or base.flush_generation > floor or is_stale(base):
                    epoch = -1
                checked = floor if epoch >= 0 else base.flush_generation  # every member saw it
                for timer in timers:
                    timer.input_seq = base.input_seq
                payload = item.payload
                first = 0  # where the kept stamps' link goes in ``row``
                started = now() if timing else 0.0  # one clock read a member: its .out, next .in
                for index, call, counters, at in steps:
                    if generations.epoch != epoch:
                        epoch = -1
                        if not admissions[index].admit(base):
                            return
                        checked = min(checked, base.flush_generation)
                    counters.items_in += 1
                    try:
                        payload = call(payload)
                    except Exception as exc:
                        shells[index].failed(observer, item, exc)
                        return
                    except BaseException as exc:  # not on_error's: the run ends naming the stage
                        counters.drop("error")  # the item is lost here
                        if not driven:  # a drive raises it as it is, fused or not
                            shells[index].crashed(exc)
                        raise
                    counters.items_out += 1
                    if isinstance(payload, PipelineItem):  # the function set the metadata itself
                        item, payload = payload, payload.payload
                        first = at - 2  # the earlier members' stamps go with the item it replaced
                        if index < last:
                            base = _base(item)
                            epoch = -1  # the next members check what they get
                    if timing:
                        done = now()
                        mine[at] = started
                        mine[at + 2] = done
                        started = done
                if checked > floor:  # every member admitted this flush generation
                    floor = checked
                if timing:
                    on_next_down(_linked(item, payload, mine, first))
                else:
                    on_next_down(_stamped(item, payload, ()))
            finally:
                if mine is row:
                    busy = False

        return attach(upstream, on_next, observer.on_error, observer.on_completed, scheduler)

    return Observable(subscribe)
