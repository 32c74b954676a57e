"""The partition topology of a composed pipeline.

Each rank the plan places stages on is a partition named ``rank<N>`` with one walk,
``rank<N>.walk``, of all its stages. Each rank boundary is a connection named by
``plan.edge_name`` with an :class:`EveryItem` chunk policy (items cross one by one); each
``ctx.input`` stage is a client stream named like the input, with its limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rxstream.topology._chunks import EveryItem
from rxstream.topology._model import (
    CLIENT,
    Connection,
    GraphSection,
    PartitionDefinition,
    PartitionTopology,
    TopologyModel,
)

if TYPE_CHECKING:
    from rxstream.pipeline import Pipeline

__all__ = ["model_of", "topology_of"]


def partition_name(rank: int) -> str:
    """The partition of rank ``rank``."""
    return f"rank{rank}"


def topology_of(pipeline: Pipeline) -> PartitionTopology:
    """The :class:`PartitionTopology` of ``pipeline`` (see the module's docstring)."""
    return model_of(pipeline).topology


def model_of(pipeline: Pipeline) -> TopologyModel:
    """The topology of ``pipeline`` with its walks and partitions, for
    :func:`~rxstream.topology.find_client_streams`."""
    plan = pipeline.plan
    ranks = sorted(set(plan.ranks.values()))
    connections: list[Connection] = []
    takes: dict[int, dict[str, list[str]]] = {rank: {} for rank in ranks}
    for node in plan.nodes:
        rank = plan.ranks[node]
        name = plan.names[node]
        edges = takes[rank].setdefault(name, [])
        if node.stage.kind == "input":
            edges.append(name)
            connections.append(
                Connection(
                    CLIENT,
                    partition_name(rank),
                    name,
                    EveryItem,
                    limits=node.stage.options.get("limits"),
                )
            )
        for upstream in node.inputs:
            edges.append(plan.edge_name(upstream, node))
    for upstream, downstream in dict.fromkeys(plan.boundaries):
        connections.append(
            Connection(
                partition_name(plan.ranks[upstream]),
                partition_name(plan.ranks[downstream]),
                plan.edge_name(upstream, downstream),
                EveryItem,
            )
        )
    walks = {
        f"{partition_name(rank)}.walk": GraphSection(
            {node: tuple(edges) for node, edges in takes[rank].items()}
        )
        for rank in ranks
    }
    partitions = {
        partition_name(rank): PartitionDefinition((f"{partition_name(rank)}.walk",))
        for rank in ranks
    }
    topology = PartitionTopology([partition_name(rank) for rank in ranks], connections)
    return TopologyModel(topology, walks, partitions)
