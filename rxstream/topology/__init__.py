"""The partition-topology API: partitions, walks, connections, chunk policies, client streams.

Client stream limits are enforced at ``ctx.input``; ``pipeline.topology()`` derives the
:class:`PartitionTopology` of a composed pipeline. See ``docs/topology.md``.
"""

from rxstream._exceptions import DeploymentError, StreamBufferClosed, TopologyError
from rxstream._util import fixup_module_metadata
from rxstream.topology._chunks import (
    ChunkPolicy,
    ChunkPolicyFactory,
    EveryItem,
    FixedSize,
    Sliding,
    StreamBuffer,
    UntilFinal,
)
from rxstream.topology._derive import format_topology, model_of, topology_of
from rxstream.topology._limits import (
    ClientStreamLimitExceeded,
    ClientStreamLimits,
    InvalidSample,
    SampleRefused,
)
from rxstream.topology._model import (
    CLIENT,
    ClientStream,
    Connection,
    ConsumerWalk,
    GraphEdge,
    GraphSection,
    PartitionDefinition,
    PartitionTopology,
    ProducerWalkCtx,
    StreamingGraphEdge,
    TopologyModel,
    find_client_stream,
    find_client_streams,
)
from rxstream.topology._samples import Field
from rxstream.topology._validate import (
    client_stream_limits,
    load_serving_config,
    validate_deployment,
)

__all__ = [
    "CLIENT",
    "ChunkPolicy",
    "ChunkPolicyFactory",
    "ClientStream",
    "ClientStreamLimitExceeded",
    "ClientStreamLimits",
    "Connection",
    "ConsumerWalk",
    "DeploymentError",
    "EveryItem",
    "Field",
    "FixedSize",
    "GraphEdge",
    "GraphSection",
    "InvalidSample",
    "PartitionDefinition",
    "PartitionTopology",
    "ProducerWalkCtx",
    "SampleRefused",
    "Sliding",
    "StreamBuffer",
    "StreamBufferClosed",
    "StreamingGraphEdge",
    "TopologyError",
    "TopologyModel",
    "UntilFinal",
    "client_stream_limits",
    "find_client_stream",
    "find_client_streams",
    "format_topology",
    "load_serving_config",
    "model_of",
    "topology_of",
    "validate_deployment",
]

fixup_module_metadata(__name__, globals())
