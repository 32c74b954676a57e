"""The partition topology: partitions, their walks, the connections between them.

A **partition** is a named group of stages that runs asynchronously from the others (in this
engine, a rank). A **graph walk** (:class:`GraphSection`) is a named set of a partition's
nodes that one pass runs; the conductor picks the walk per pass, except in a
**producer-triggered** partition, whose walk each chunk's producer decides through
``Connection.consumer_walk(ProducerWalkCtx)``. A **connection** is a streaming edge between
two partitions, or from :data:`CLIENT` into one (a client stream, the engine's ``ctx.input``).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias

from rxstream._exceptions import TopologyError
from rxstream.topology._chunks import ChunkPolicy
from rxstream.topology._limits import ClientStreamLimits

__all__ = [
    "CLIENT",
    "ClientStream",
    "Connection",
    "ConsumerWalk",
    "GraphEdge",
    "GraphSection",
    "PartitionDefinition",
    "PartitionTopology",
    "ProducerWalkCtx",
    "StreamingGraphEdge",
    "TopologyModel",
    "find_client_stream",
    "find_client_streams",
    "walk_driving_problems",
]

CLIENT = "client"
"""The ``from_partition`` of a connection the client feeds (a client stream)."""


class ClientStream(NamedTuple):
    """Where a client stream's items go: the node that consumes the edge, a walk it runs in
    (for routing to its workers) and its partition."""

    node: str
    graph_walk: str
    partition: str


@dataclass
class ProducerWalkCtx:
    """The producer's state for one pass that emits on a walk-driving edge.

    The producer refills one instance for every call (:meth:`refill`), since the hook runs
    per request on every emitting step: valid only during the call.
    """

    producer_walk: str = ""
    """The walk the producer is running: in a pipeline, its partition's one walk
    (``rank<N>.walk``), or ``""`` when that partition declares several."""
    node: str = ""
    """The producer node that emits on the edge (in a pipeline, the upstream stage)."""
    loop_iters: Mapping[str, int] = field(default_factory=dict)
    """Each loop of the producer's walk -> its current iteration. In a pipeline the stream is
    the loop: ``{node: how many items the producer emitted on the edge before this one}``."""
    fwd_info: object | None = None
    """The engine's information on the current forward pass, or None. In a pipeline, the
    :class:`~rxstream.PipelineItem` being emitted (its payload and metadata)."""

    def refill(
        self,
        producer_walk: str,
        node: str,
        loop_iters: Mapping[str, int] | None = None,
        fwd_info: object | None = None,
    ) -> "ProducerWalkCtx":
        """Overwrite every field for the next call; returns this same object."""
        self.producer_walk = producer_walk
        self.node = node
        self.loop_iters = {} if loop_iters is None else loop_iters
        self.fwd_info = fwd_info
        return self


ConsumerWalk: TypeAlias = Callable[[ProducerWalkCtx], str]
"""The producer's hook that names the walk a producer-triggered partition runs per chunk."""


@dataclass(frozen=True)
class Connection:
    """Defines a streaming connection between two partitions, or from the client
    (``from_partition=CLIENT``) into one.

    Only a client stream takes ``limits``: a partition's output is bounded by the model
    itself. ``chunk_policy_factory`` makes one :class:`ChunkPolicy` per stream;
    ``consumer_walk`` (set on the connections into a producer-triggered partition) picks the
    walk each chunk runs under.
    """

    from_partition: str
    to_partition: str
    edge_name: str
    chunk_policy_factory: Callable[[], ChunkPolicy]
    limits: ClientStreamLimits | None = None
    consumer_walk: Callable[[ProducerWalkCtx], str] | None = None

    def __post_init__(self) -> None:
        edge = self.edge_name
        if not isinstance(edge, str) or not edge:
            raise TopologyError(f"edge_name must be a non-empty str, got {edge!r}")
        for label in ("from_partition", "to_partition"):
            value = getattr(self, label)
            if not isinstance(value, str) or not value:
                raise TopologyError(
                    f"{label} must be a non-empty str, got {value!r} for connection {edge!r}"
                )
        if self.to_partition == CLIENT:
            raise TopologyError(
                f"to_partition must be a partition, got CLIENT ({CLIENT!r}) for connection "
                f"{edge!r}: the client only feeds streams"
            )
        if self.from_partition == self.to_partition:
            raise TopologyError(
                f"a connection joins two partitions, got {self.from_partition!r} twice "
                f"for connection {edge!r}"
            )
        if not callable(self.chunk_policy_factory):
            raise TopologyError(
                f"chunk_policy_factory must be callable, got {self.chunk_policy_factory!r} "
                f"for connection {edge!r}"
            )
        if self.consumer_walk is not None and not callable(self.consumer_walk):
            raise TopologyError(
                f"consumer_walk must be callable or None, got {self.consumer_walk!r} "
                f"for connection {edge!r}"
            )
        limits = self.limits
        if limits is None:
            return
        if self.from_partition != CLIENT:
            raise TopologyError(
                f"limits are for client streams only, got {limits!r} for connection {edge!r} "
                f"from partition {self.from_partition!r}: a partition's output is bounded by "
                "the model itself"
            )
        if not isinstance(limits, ClientStreamLimits):
            raise TopologyError(
                f"limits must be a ClientStreamLimits, got {limits!r} for client stream {edge!r}"
            )
        bound = limits.max_items
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise TopologyError(
                f"max_items must be an int or None, got {bound!r} for client stream {edge!r}"
            )
        if bound is not None and bound <= 0:
            raise TopologyError(f"max_items must be > 0, got {bound} for client stream {edge!r}")

    @property
    def is_client_stream(self) -> bool:
        """Whether the client feeds this connection."""
        return self.from_partition == CLIENT


@dataclass
class PartitionTopology:
    """Declares how a model's computation is split into async partitions.

    Each partition has its own set of graph walks. Connections define streaming data flow
    between partitions via StreamBuffers. Partition names are unique and are not
    :data:`CLIENT`; every connection joins declared partitions; edge names are unique.
    """

    partitions: list[str]
    connections: list[Connection] = field(default_factory=list)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for name in self.partitions:
            if not isinstance(name, str) or not name or name == CLIENT:
                raise TopologyError(
                    f"a partition name must be a non-empty str other than {CLIENT!r}, got {name!r}"
                )
            if name in seen:
                raise TopologyError(f"partition names must be unique, got {name!r} twice")
            seen.add(name)
        edges: set[str] = set()
        for conn in self.connections:
            if not isinstance(conn, Connection):
                raise TopologyError(f"connections must be Connection objects, got {conn!r}")
            for label in ("from_partition", "to_partition"):
                value = getattr(conn, label)
                if value not in seen and not (label == "from_partition" and value == CLIENT):
                    raise TopologyError(
                        f"{label} must be a declared partition ({', '.join(self.partitions)}), "
                        f"got {value!r} for connection {conn.edge_name!r}"
                    )
            if conn.edge_name in edges:
                raise TopologyError(f"edge names must be unique, got {conn.edge_name!r} twice")
            edges.add(conn.edge_name)

    def client_connections(self) -> list[Connection]:
        """The streams the client feeds."""
        return [conn for conn in self.connections if conn.from_partition == CLIENT]

    def producer_triggered_partitions(self) -> set[str]:
        """Partitions whose graph walk the stream drives, not the conductor."""
        return {conn.to_partition for conn in self.connections if conn.consumer_walk is not None}

    def walk_drivers(self) -> dict[str, Connection]:
        """Producer-triggered partition -> the connection whose ``consumer_walk`` decides its
        walk (any one of them; :meth:`check_walk_driving_connections` makes them agree)."""
        drivers: dict[str, Connection] = {}
        for conn in self.connections:
            if conn.consumer_walk is not None:
                drivers.setdefault(conn.to_partition, conn)
        return drivers

    def check_walk_driving_connections(self) -> None:
        """A producer-triggered partition has one authority over its walk: all its incoming
        connections come from one producer and share one ``consumer_walk``, so every edge's
        items agree on the walk. Its chunks must not overlap either, since a chunk runs under
        exactly one walk. Raises :class:`~rxstream.topology.TopologyError` naming every
        violation."""
        problems = walk_driving_problems(self)
        if problems:
            raise TopologyError("; ".join(problems))


def walk_driving_problems(topology: PartitionTopology) -> list[str]:
    """Each violation of :meth:`PartitionTopology.check_walk_driving_connections`, in order."""
    problems: list[str] = []
    for partition, driver in topology.walk_drivers().items():
        incoming = [conn for conn in topology.connections if conn.to_partition == partition]
        for conn in incoming:
            if conn.from_partition != driver.from_partition:
                problems.append(
                    f"producer-triggered partition {partition!r} takes connections from one "
                    f"producer ({driver.from_partition!r}, by {driver.edge_name!r}), "
                    f"got {conn.from_partition!r} for connection {conn.edge_name!r}"
                )
            elif conn.consumer_walk is not driver.consumer_walk:
                problems.append(
                    f"the connections into producer-triggered partition {partition!r} share "
                    f"one consumer_walk (that of {driver.edge_name!r}), "
                    f"got {_callable_name(conn.consumer_walk)} for connection {conn.edge_name!r}"
                )
            policy = conn.chunk_policy_factory()
            if policy.overlapping:
                problems.append(
                    f"chunks into producer-triggered partition {partition!r} must not overlap "
                    f"(a chunk runs under one walk), got {policy!r} for connection "
                    f"{conn.edge_name!r}"
                )
    return problems


def _callable_name(fn: object) -> str:
    if fn is None:
        return "None"
    return str(getattr(fn, "__qualname__", None) or repr(fn))


@dataclass
class GraphEdge:
    """An edge of a model's graph: it takes a node's output to ``next_node``.

    The fields follow the seed; the engine itself reads ``next_node`` and ``name``.
    """

    next_node: str
    name: str
    tensor_info: list[Any] = field(default_factory=list)
    """What the edge carries, one description per tensor (opaque here)."""
    persist: bool = False
    """Whether the value stays available to later passes."""
    conductor_new_token: bool = False
    """Whether the conductor learns of a new token from this edge."""
    is_streaming: bool = False
    """Whether the edge carries streaming data."""
    output_modality: str = ""
    """The modality of what the edge carries when it leaves the model (text, audio…)."""
    _persist_for_loop: bool = False
    _final_stream_chunk: bool = False
    _total_fanin: int = 1
    _shard_dim: int | None = None


@dataclass
class StreamingGraphEdge(GraphEdge):
    """A graph edge that carries streaming data between partitions.

    Routed like a normal :class:`GraphEdge` (the producer is unaware it is streaming). On the
    consumer, the arriving items are buffered in a StreamBuffer and gated by a ChunkPolicy
    before they satisfy the consuming node's input.
    """

    target_partition: str = ""
    """The partition the edge streams into."""


@dataclass(frozen=True)
class GraphSection:
    """One graph walk: each of its nodes -> the names of the edges that node takes."""

    nodes: Mapping[str, Sequence[str]]

    def consumers(self, edge_name: str) -> list[str]:
        """The nodes of this walk that take ``edge_name``, in declaration order."""
        return [node for node, edges in self.nodes.items() if edge_name in edges]


@dataclass(frozen=True)
class PartitionDefinition:
    """A partition's graph walks, by name."""

    walks: Sequence[str]


@dataclass(frozen=True)
class TopologyModel:
    """What :func:`find_client_streams` reads of a model: its topology, walks and partitions."""

    topology: PartitionTopology
    walks: Mapping[str, GraphSection]
    partitions: Mapping[str, PartitionDefinition]


def find_client_stream(
    conn: Connection,
    walks: Mapping[str, GraphSection],
    partitions: Mapping[str, PartitionDefinition],
) -> ClientStream:
    """``conn``'s consumer: the one node, over every walk of the partition it flows into, that
    takes the edge; ``ValueError`` (a :class:`~rxstream.topology.TopologyError`) naming the
    stream when there is none, or more than one."""
    edge = conn.edge_name
    if conn.from_partition != CLIENT:
        raise TopologyError(
            f"connection {edge!r} is not a client stream (it comes from partition "
            f"{conn.from_partition!r})"
        )
    partition = partitions.get(conn.to_partition)
    if partition is None:
        raise TopologyError(
            f"client stream {edge!r} flows into partition {conn.to_partition!r}, "
            f"which has no definition (partitions: {', '.join(partitions) or 'none'})"
        )
    found: dict[str, str] = {}
    for walk in partition.walks:
        section = walks.get(walk)
        if section is None:
            raise TopologyError(
                f"partition {conn.to_partition!r} names walk {walk!r}, which has no "
                f"definition (walks: {', '.join(walks) or 'none'})"
            )
        for node in section.consumers(edge):
            found.setdefault(node, walk)
    if not found:
        raise TopologyError(
            f"client stream {edge!r} has no consumer: no node in the walks of partition "
            f"{conn.to_partition!r} ({', '.join(partition.walks) or 'none'}) takes it"
        )
    if len(found) > 1:
        raise TopologyError(
            f"client stream {edge!r} must have one consumer, got {len(found)} in partition "
            f"{conn.to_partition!r}: {', '.join(found)}"
        )
    [(node, walk)] = found.items()
    return ClientStream(node, walk, conn.to_partition)


def find_client_streams(model: TopologyModel) -> dict[str, ClientStream]:
    """Each client stream's consumer (:func:`find_client_stream`), by edge name."""
    return {
        conn.edge_name: find_client_stream(conn, model.walks, model.partitions)
        for conn in model.topology.client_connections()
    }
