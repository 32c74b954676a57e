"""The partition topology of a composed pipeline.

Each rank the plan places stages on is a partition named ``rank<N>``. A partition without a
walks stage has one walk, ``rank<N>.walk``, of all its stages; one with a walks stage
(``ctx.walks``) has that stage's walks, each made of the partition's other stages and the
walk's own (named ``<walk>.<stage>``, as the run stamps them). Each rank boundary is a
connection named by ``plan.edge_name`` with the consuming stage's chunk policy (``chunks=``;
without one, items cross one by one: :class:`EveryItem`) and, into a producer-triggered walks
stage, its ``consumer_walk``. Each ``ctx.input`` stage is a client stream named like the
input, with its limits and chunk policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rxstream._kernel._options import WalksOptions, chunks_of, limits_of, reads_of
from rxstream.topology._chunks import EveryItem
from rxstream.topology._edges import WALKS, consumer_walk_of, partition_name
from rxstream.topology._limits import ClientStreamLimits
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
    from rxstream.stage import Stage

__all__ = ["format_topology", "model_of", "topology_of"]


def topology_of(pipeline: Pipeline) -> PartitionTopology:
    """The :class:`PartitionTopology` of ``pipeline`` (see the module's docstring)."""
    return model_of(pipeline).topology


def model_of(pipeline: Pipeline) -> TopologyModel:
    """The topology of ``pipeline`` with its walks and partitions, for
    :func:`~rxstream.topology.find_client_streams`."""
    plan = pipeline.plan
    ranks = sorted(set(plan.ranks.values()))
    connections: list[Connection] = []
    # each rank's nodes in plan order, each with the edges it takes (a walks stage: its own)
    takes: dict[int, list[tuple[str, Stage, tuple[str, ...]]]] = {rank: [] for rank in ranks}
    inputs = {plan.names[node] for node in plan.nodes if node.stage.kind == "input"}
    for node in plan.nodes:
        rank = plan.ranks[node]
        name = plan.names[node]
        stage = node.stage
        edges = tuple(plan.edge_name(upstream, node) for upstream in node.inputs)
        # an input stage takes its client stream; a source that reads inputs (reads=) takes
        # those that are no stage of the graph
        clients = [stage] if stage.kind == "input" else []
        clients += [read for read in reads_of(stage) if read.name not in inputs]
        for client in clients:
            stream = name if client is stage else client.name
            inputs.add(stream)
            edges = (stream, *edges)
            connections.append(
                Connection(
                    CLIENT,
                    partition_name(rank),
                    stream,
                    chunks_of(client) or EveryItem,
                    limits=limits_of(client),
                )
            )
        takes[rank].append((name, stage, edges))
    for upstream, downstream in dict.fromkeys(plan.boundaries):
        connections.append(
            Connection(
                partition_name(plan.ranks[upstream]),
                partition_name(plan.ranks[downstream]),
                plan.edge_name(upstream, downstream),
                chunks_of(downstream.stage) or EveryItem,
                consumer_walk=consumer_walk_of(downstream.stage),
            )
        )
    walks: dict[str, GraphSection] = {}
    partitions: dict[str, PartitionDefinition] = {}
    for rank in ranks:
        sections = _walks(partition_name(rank), takes[rank])
        walks.update(sections)
        partitions[partition_name(rank)] = PartitionDefinition(tuple(sections))
    topology = PartitionTopology([partition_name(rank) for rank in ranks], connections)
    return TopologyModel(topology, walks, partitions)


def _walks(
    partition: str, nodes: Sequence[tuple[str, Stage, tuple[str, ...]]]
) -> dict[str, GraphSection]:
    """A partition's walks: one of all its nodes, or one per walk of its walks stage."""
    found = [(name, stage) for name, stage, _ in nodes if stage.kind == WALKS]
    if not found:
        return {f"{partition}.walk": GraphSection({name: edges for name, _, edges in nodes})}
    [(walks_name, walks_stage)] = found  # the plan allows one walks stage a partition
    sections: dict[str, GraphSection] = {}
    assert isinstance(walks_stage.options, WalksOptions)
    assert walks_stage.options.chains is not None
    for walk, chain in walks_stage.options.chains.items():
        section: dict[str, tuple[str, ...]] = {}
        for name, _stage, edges in nodes:
            if name != walks_name:
                section[name] = edges
                continue
            previous, taken = "", edges  # the walk's first stage takes the walks stage's edges
            for qualified, _inner in chain:
                section[qualified] = taken if not previous else (f"{previous}>{qualified}",)
                previous = qualified
        sections[walk] = GraphSection(section)
    return sections


def format_topology(
    topology: PartitionTopology | TopologyModel,
    streams: Mapping[str, ClientStream] | None = None,
    limits: Mapping[str, ClientStreamLimits] | None = None,
) -> str:
    """A readable listing: the partitions (given a :class:`TopologyModel`, each one's walks
    and who picks them), each connection (edge, partitions, chunk policy), and each client
    stream with its limits and, from ``streams``, its consumer. ``limits`` are the limits in
    force (a serving config's, from :func:`~rxstream.topology.client_stream_limits`): a
    stream whose bound they change shows both."""
    model = topology if isinstance(topology, TopologyModel) else None
    if model is not None:
        topology = model.topology
    assert isinstance(topology, PartitionTopology)
    lines = [f"partitions: {', '.join(topology.partitions) or 'none'}"]
    if model is not None:
        lines.append("walks:")
        drivers = topology.walk_drivers()
        for partition in topology.partitions:
            definition = model.partitions.get(partition)
            names = () if definition is None else tuple(definition.walks)
            line = f"  {partition}: {', '.join(names) or 'none'}"
            if partition in drivers:
                line += f" (the producer picks, over {drivers[partition].edge_name})"
            elif len(names) > 1:
                line += " (the conductor picks)"
            lines.append(line)
    lines.append("connections:")
    between = [conn for conn in topology.connections if not conn.is_client_stream]
    lines += [
        f"  {conn.edge_name}: {conn.from_partition} -> {conn.to_partition}, "
        f"chunks {conn.chunk_policy_factory()!r}"
        + ("" if conn.consumer_walk is None else ", drives the walk")
        for conn in between
    ] or ["  none"]
    lines.append("client streams:")
    for conn in topology.client_connections():
        bound = _bound(conn.limits)
        applied = None if limits is None else limits.get(conn.edge_name)
        if applied is not None and _bound(applied) != bound:
            bound = f"{_bound(applied)} (serving config; declared {bound})"
        line = f"  {conn.edge_name}: client -> {conn.to_partition}, {bound}"
        stream = None if streams is None else streams.get(conn.edge_name)
        if stream is not None:
            line += f", consumed by {stream.node!r} (walk {stream.graph_walk})"
        lines.append(line)
    if not topology.client_connections():
        lines.append("  none")
    return "\n".join(lines)


def _bound(limits: ClientStreamLimits | None) -> str:
    if limits is None or limits.max_items is None:
        return "unbounded"
    return f"max {limits.max_items} {limits.unit}"
