"""What a composed pipeline declares about its partitions: walks stages and chunked edges.

The plan's checks (:func:`check_partitions`), the run's wiring and the topology derivation all
read a stage's declarations through these functions, so the three agree. A stage declares:

- ``chunks``: the :data:`~rxstream.topology.ChunkPolicyFactory` of the connections it
  consumes (``ctx.pipe``, ``ctx.walks``; on ``ctx.input``, of its client stream);
- on a walks stage (``ctx.walks``): its walk names and, when its partition is
  producer-triggered, the ``consumer_walk`` its producer calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rxstream._exceptions import StageBuildError
from rxstream._kernel._options import WalksOptions, chunks_of
from rxstream.topology._chunks import ChunkPolicy
from rxstream.topology._model import ConsumerWalk

if TYPE_CHECKING:
    from rxstream.runtime._plan import Plan
    from rxstream.stage import Node, Stage

__all__ = [
    "WALKS",
    "check_chunks",
    "check_partitions",
    "consumer_walk_of",
    "partition_name",
    "walks_of",
]

WALKS = "walks"
"""The kind of a walks stage (``ctx.walks``)."""


def partition_name(rank: int) -> str:
    """The partition of rank ``rank``."""
    return f"rank{rank}"


def consumer_walk_of(stage: Stage) -> ConsumerWalk | None:
    """The ``consumer_walk`` of a producer-triggered walks stage, else None."""
    options = stage.options
    return options.consumer_walk if isinstance(options, WalksOptions) else None


def walks_of(stage: Stage) -> tuple[str, ...]:
    """The walk names a walks stage declares (none for any other stage)."""
    options = stage.options
    return options.walks if isinstance(options, WalksOptions) else ()


def check_chunks(chunks: Any, label: str) -> ChunkPolicy | None:
    """A ``chunks=`` argument checked: None, or a factory whose policy is returned (one call)."""
    if chunks is None:
        return None
    if not callable(chunks):
        raise StageBuildError(
            f"chunks must be a factory that makes a ChunkPolicy (a class like EveryItem, or "
            f"lambda: FixedSize(4)), got {chunks!r} for stage {label!r}"
        )
    made = chunks()
    if not isinstance(made, ChunkPolicy):
        raise StageBuildError(
            f"chunks() must return a ChunkPolicy (with overlapping and ready), got {made!r} "
            f"for stage {label!r}"
        )
    return made


def check_partitions(plan: Plan) -> None:
    """The placement rules of walks and chunked connections; :class:`StageBuildError` else.

    A stage that declares ``chunks=`` or ``consumer_walk=`` consumes connections, so each of
    its inputs sits on another rank; a partition (a rank) declares its walks once; walk names
    are unique in a pipeline; a producer-triggered partition takes one connection, the one
    into its walks stage (so ``check_walk_driving_connections`` holds for every pipeline).
    """
    declared: dict[int, Node] = {}
    owners: dict[str, Node] = {}
    for node in plan.nodes:
        stage = node.stage
        name = plan.names[node]
        rank = plan.ranks[node]
        driven = consumer_walk_of(stage) is not None
        if chunks_of(stage) is not None or driven:
            option = "consumer_walk=" if driven else "chunks="
            for upstream in node.inputs:
                if plan.ranks[upstream] == rank:
                    raise StageBuildError(
                        f"{option} is declared on a connection between partitions, but stage "
                        f"{name!r} takes {plan.names[upstream]!r} from its own rank {rank}: "
                        "place it on another rank than its input"
                    )
        if stage.kind != WALKS:
            continue
        other = declared.setdefault(rank, node)
        if other is not node:
            raise StageBuildError(
                f"a partition declares its walks once, got walks stages {plan.names[other]!r} "
                f"and {name!r} on rank {rank} (partition {partition_name(rank)!r})"
            )
        for walk in walks_of(stage):
            owner = owners.setdefault(walk, node)
            if owner is not node:
                raise StageBuildError(
                    f"walk names must be unique in a pipeline, got {walk!r} in stages "
                    f"{plan.names[owner]!r} and {name!r}"
                )
    for node in plan.nodes:
        walks = declared.get(plan.ranks[node])
        if walks is None or consumer_walk_of(walks.stage) is None or node is walks:
            continue
        name = plan.names[node]
        edges = [
            repr(plan.edge_name(upstream, node))
            for upstream in node.inputs
            if plan.ranks[upstream] != plan.ranks[node]
        ]
        if node.stage.kind == "input":
            edges.insert(0, f"client stream {name!r}")
        if edges:
            raise StageBuildError(
                f"producer-triggered partition {partition_name(plan.ranks[node])!r} takes one "
                f"connection, the one into its walks stage {plan.names[walks]!r}, got "
                f"{edges[0]} into stage {name!r}"
            )
