"""Compile a graph of nodes into a plan: checked, named, in topological order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rxstream._exceptions import StageBuildError, StageReuseError
from rxstream._kernel._options import fuses, reads_of
from rxstream.stage import Node
from rxstream.topology._edges import check_partitions

__all__ = ["Plan", "compile_plan"]


@dataclass(frozen=True)
class Plan:
    """A runnable graph: nodes upstream-first, their unique names, and their consumer counts."""

    nodes: tuple[Node, ...]
    names: dict[Node, str]
    consumers: dict[Node, int]
    tails: tuple[Node, ...]
    ranks: dict[Node, int]
    """Each node's rank: its stage's ``rank=``, else its first input's, else 0."""

    @property
    def world(self) -> int:
        """How many ranks the plan places stages on (the highest rank + 1)."""
        return max(self.ranks.values(), default=0) + 1

    @property
    def boundaries(self) -> tuple[tuple[Node, Node], ...]:
        """The edges ``(upstream, downstream)`` whose two nodes sit on different ranks."""
        return tuple(
            (upstream, node)
            for node in self.nodes
            for upstream in node.inputs
            if self.ranks[upstream] != self.ranks[node]
        )

    def edge_name(self, upstream: Node, downstream: Node) -> str:
        """The deterministic name of an edge: ``<upstream>><downstream>``."""
        return f"{self.names[upstream]}>{self.names[downstream]}"

    @property
    def sources(self) -> tuple[Node, ...]:
        """The nodes that produce items, in plan order."""
        return tuple(node for node in self.nodes if node.stage.is_source)

    def name_of(self, node: Node) -> str:
        """The node's unique name in this plan."""
        return self.names[node]


def compile_plan(tails: Sequence[Node]) -> Plan:
    """Order, check and name the graph that ends in ``tails``.

    Raises :class:`StageReuseError` for a stage object at two places, and
    :class:`StageBuildError` for a stage with no input that is not a source, a sink that
    something follows, or walks and chunked connections placed against the rules of
    :func:`~rxstream.topology._edges.check_partitions`.
    """
    order: list[Node] = []
    seen: set[Node] = set()
    consumers: dict[Node, int] = {}
    by_stage: dict[int, Node] = {}

    def visit(node: Node) -> None:
        if node in seen:
            return
        other = by_stage.get(id(node.stage))
        if other is not None:
            stage = node.stage
            raise StageReuseError(
                f"stage {stage.name!r} ({stage.kind}) is used at two places in the pipeline; "
                f"a stage object is one node: build another with ctx.{stage.kind}(...) "
                "(one upstream feeding two downstreams is a fan-out and needs no copy)"
            )
        by_stage[id(node.stage)] = node
        for upstream in node.inputs:
            visit(upstream)
            consumers[upstream] = consumers.get(upstream, 0) + 1
        seen.add(node)
        order.append(node)

    for tail in tails:
        visit(tail)
    names = _names(order)
    for node in order:
        stage = node.stage
        if not node.inputs and not stage.is_source:
            raise StageBuildError(
                f"stage {names[node]!r} ({stage.kind}) has no input: "
                "a runnable pipeline starts with ctx.source(...) or ctx.input(...)"
            )
        if stage.is_sink and consumers.get(node):
            follower = next(n for n in order if node in n.inputs)
            raise StageBuildError(
                f"sink {names[node]!r} (ctx.stream) must end the pipeline, "
                f"but {names[follower]!r} follows it"
            )
    ranks: dict[Node, int] = {}
    for node in order:
        rank = node.stage.rank
        ranks[node] = rank if rank is not None else (ranks[node.inputs[0]] if node.inputs else 0)
    plan = Plan(
        nodes=tuple(order), names=names, consumers=consumers, tails=tuple(tails), ranks=ranks
    )
    check_partitions(plan)  # walks and chunked connections sit where partitions meet
    _check_fused(plan)
    _check_reads(plan)
    return plan


def _check_reads(plan: Plan) -> None:
    """Refuse a source that reads an input (``reads=``) on a rank other than 0: the inputs'
    samples arrive there, where the session feeds them."""
    for node in plan.nodes:
        reads = reads_of(node.stage)
        if reads and plan.ranks[node] != 0:
            raise StageBuildError(
                f"source {plan.names[node]!r} reads input {reads[0].name!r}, whose samples "
                f"arrive on rank 0 (the session's): place the source on rank 0, got "
                f"rank={plan.ranks[node]}"
            )


def _check_fused(plan: Plan) -> None:
    """Refuse a ``fuse=True`` pipe that cannot run on its upstream's thread: fed by more than
    one input, by a stage on another rank, or by one that also feeds another stage or ends
    the pipeline (it would run on that thread beside the others, in no order)."""
    tails = set(plan.tails)
    for node in plan.nodes:
        if not fuses(node.stage):
            continue
        name = plan.names[node]
        rule = "a fused stage runs on the thread of its one upstream"
        if len(node.inputs) != 1:
            raise StageBuildError(
                f"stage {name!r} (fuse=True): {rule}, got {len(node.inputs)} inputs (fan-in: "
                "give it its own thread, without fuse)"
            )
        upstream = node.inputs[0]
        up = plan.names[upstream]
        if plan.ranks[upstream] != plan.ranks[node]:
            raise StageBuildError(
                f"stage {name!r} (fuse=True): {rule}, on its rank, got rank={plan.ranks[node]} "
                f"and upstream {up!r} on rank {plan.ranks[upstream]}"
            )
        consumers = plan.consumers.get(upstream, 0) + (upstream in tails)
        if consumers > 1:
            raise StageBuildError(
                f"stage {name!r} (fuse=True): {rule}, its only consumer, got upstream {up!r} "
                f"with {consumers} consumers (a fan-out or an end)"
            )


def _names(order: Sequence[Node]) -> dict[Node, str]:
    """Explicit names as given (each once); derived names made unique as ``name-2``…"""
    names: dict[Node, str] = {}
    taken: set[str] = set()
    for node in order:
        if node.stage.explicit_name:
            name = node.stage.name
            if name in taken:
                raise StageBuildError(
                    f"stage names must be unique in a pipeline, got {name!r} twice"
                )
            names[node] = name
            taken.add(name)
    for node in order:
        if node.stage.explicit_name:
            continue
        base = name = node.stage.name
        suffix = 2
        while name in taken:
            name = f"{base}-{suffix}"
            suffix += 1
        names[node] = name
        taken.add(name)
    return names
