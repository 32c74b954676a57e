"""Fusing chains of 1:1 ``pipe`` stages for ``drive()``.

Under ``drive()`` a hop is a direct call, so a chain of single-input pipes needs no hop at
all: one operator calls each stage's function in turn, with each stage's own counters,
stamps (``<stage>.in``/``.out``), stale-generation check, flush reset and ``on_error``
policy, and builds one item at the end instead of one per stage. The outputs are the ones
the unfused chain gives; the only difference is that a stage's ``.in`` is the previous
stage's ``.out`` (there is no queue between them to wait in). Threads never fuse: there
every stage is its own thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reactivex import Observable, abc

from rxstream._kernel._generations import Generations
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem, PipelineMetadata, _base, _stamped, now
from rxstream.operators._core import attach
from rxstream.operators._pipe import caller
from rxstream.runtime._plan import Plan
from rxstream.stage import Node
from rxstream.typing import ItemStream

__all__ = ["fusable_chains", "fused_chain"]


def _fusable(node: Node) -> bool:
    stage = node.stage
    options = stage.options
    return (
        stage.kind == "pipe"
        and len(node.inputs) == 1
        and not options.get("items")
        and options.get("chunks") is None  # a chunked input is gated before the stage
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


def fused_chain(
    upstream: ItemStream, shells: Sequence[StageShell], generations: Generations
) -> ItemStream:
    """One operator running the pipes of ``shells`` in order (see the module docstring)."""
    members: list[tuple[StageShell, Callable[..., Any]]] = [
        (shell, caller(shell.target_fn, shell)) for shell in shells
    ]
    # what the per-item loop reads, looked up once
    steps = [
        (index, shell, call, shell.counters, shell.in_hop, shell.out_hop)
        for index, (shell, call) in enumerate(members)
    ]
    timing = shells[0].timing

    def subscribe(
        observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
    ) -> abc.DisposableBase:
        admissions = [shell.admission() for shell in shells]
        routine = admissions[0].routine

        def admit(index: int, base: PipelineMetadata) -> bool:
            """The per-hop checks of member ``index`` and on; whether the item goes on."""
            return all(admission.admit(base) for admission in admissions[index:])

        def on_next(item: PipelineItem) -> None:
            base = _base(item)
            # the checks every member would make on arrival, made at once: only a function
            # that steers or flushes mid-chain changes their outcome, and that is re-checked
            epoch = generations.epoch
            if not routine(base) and not admit(0, base):
                return
            payload = item.payload
            stamps: list[Any] = []  # flat: hop, t, hop, t…
            started = now()
            for index, shell, call, counters, in_hop, out_hop in steps:
                if generations.epoch != epoch:  # a function steered or flushed mid-chain
                    epoch = generations.epoch
                    if not admit(index, base):
                        return
                counters.items_in += 1
                try:
                    payload = call(payload)
                except Exception as exc:
                    shell.failed(observer, item, exc)
                    return
                counters.items_out += 1
                if isinstance(payload, PipelineItem):  # the function set the metadata itself
                    item, payload = payload, payload.payload
                    stamps.clear()
                    base = _base(item)
                if timing:
                    done = now()
                    stamps += (in_hop, started, out_hop, done)
                    started = done
            observer.on_next(_stamped(item, payload, tuple(stamps)))

        return attach(upstream, on_next, observer.on_error, observer.on_completed, scheduler)

    return Observable(subscribe)
