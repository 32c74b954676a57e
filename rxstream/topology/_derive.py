"""The partition topology of a composed pipeline.

Each rank the plan places stages on is a partition named ``rank<N>`` with one walk,
``rank<N>.walk``, of all its stages. Each rank boundary is a connection named by
``plan.edge_name`` with an :class:`EveryItem` chunk policy (items cross one by one); each
``ctx.input`` stage is a client stream named like the input, with its limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rxstream.topology._chunks import EveryItem
from rxstream.topology._model import (
    CLIENT,
    ClientStream,
    Connection,
    GraphSection,
    PartitionDefinition,
    PartitionTopology,
    TopologyModel,
)

if TYPE_CHECKING:
    from rxstream.pipeline import Pipeline

__all__ = ["format_topology", "model_of", "topology_of"]


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


def format_topology(
    topology: PartitionTopology, streams: Mapping[str, ClientStream] | None = None
) -> str:
    """A readable listing: the partitions, each connection (edge, partitions, chunk policy),
    and each client stream with its limits and, from ``streams``, its consumer."""
    lines = [f"partitions: {', '.join(topology.partitions) or 'none'}", "connections:"]
    between = [conn for conn in topology.connections if not conn.is_client_stream]
    lines += [
        f"  {conn.edge_name}: {conn.from_partition} -> {conn.to_partition}, "
        f"chunks {conn.chunk_policy_factory()!r}"
        + ("" if conn.consumer_walk is None else ", drives the walk")
        for conn in between
    ] or ["  none"]
    lines.append("client streams:")
    for conn in topology.client_connections():
        limits = conn.limits
        bound = (
            "unbounded"
            if limits is None or limits.max_items is None
            else f"max {limits.max_items} {limits.unit}"
        )
        line = f"  {conn.edge_name}: client -> {conn.to_partition}, {bound}"
        stream = None if streams is None else streams.get(conn.edge_name)
        if stream is not None:
            line += f", consumed by {stream.node!r} (walk {stream.graph_walk})"
        lines.append(line)
    if not topology.client_connections():
        lines.append("  none")
    return "\n".join(lines)
