"""The typed options of each stage kind: what its builder gives a stage, read as attributes.

A :class:`~rxstream._kernel._kind.StageKind` names its options class (``options=``); a
:class:`~rxstream.stage.Stage` of that kind holds one instance (``stage.options``), and one of
another class is refused. The layers that read a kind's options (the plan, the fuser, the
run, the topology, egress) test the class, never a name: ``isinstance(stage.options,
PaceOptions)``. :class:`Chunked` is what every kind that may consume a chunked connection
shares (``chunks=``).

They live here, at the bottom of the layers, because the topology (below the operators)
reads the chunked, the input's and the walks' options.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rxstream.stage import Stage
    from rxstream.topology._chunks import ChunkPolicyFactory
    from rxstream.topology._limits import ClientStreamLimits
    from rxstream.topology._model import ConsumerWalk

__all__ = [
    "BindOptions",
    "Chunked",
    "InputOptions",
    "NoOptions",
    "PaceOptions",
    "PipeOptions",
    "SourceOptions",
    "StreamOptions",
    "WalksOptions",
    "chunks_of",
    "fuses",
    "limits_of",
    "reads_of",
]


@dataclass(frozen=True, slots=True)
class NoOptions:
    """A kind that takes no options (``merge``, ``window``, ``tap``…)."""


@dataclass(frozen=True, slots=True)
class Chunked:
    """A kind that may consume a chunked connection: ``chunks`` is the chunk policy factory
    of the connections it consumes (``None``: each item as it is)."""

    chunks: ChunkPolicyFactory | None = None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """``ctx.source``: the ``ctx.input`` stages it reads (``reads=``), in order."""

    reads: tuple[Stage, ...] = ()


@dataclass(frozen=True, slots=True)
class InputOptions(Chunked):
    """``ctx.input``: its client-stream ``limits`` and sample ``schema``."""

    limits: ClientStreamLimits | None = None
    schema: object = None


@dataclass(frozen=True, slots=True)
class PipeOptions(Chunked):
    """``ctx.pipe``: ``items`` (the function takes and returns whole items), ``fuse`` (it
    runs on its upstream's thread)."""

    items: bool = False
    fuse: bool = False


@dataclass(frozen=True, slots=True)
class PaceOptions:
    """``ctx.pace``: its frame rate, tick (``time_base``, seconds), ``overflow`` and
    ``phase``."""

    fps: float
    time_base: Fraction
    overflow: str
    phase: str


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """``ctx.stream``: the sink's codec."""

    codec: str = "raw"


@dataclass(frozen=True, slots=True)
class BindOptions:
    """``doc.bind``: the doc paths (each a tuple of keys) whose change rebuilds the stage."""

    deps: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class WalksOptions(Chunked):
    """``ctx.walks``: its walk names, each walk's chain (``(name in the run, stage)`` pairs),
    and who picks a pass's walk: the conductor (``pick``) or the producer
    (``consumer_walk``)."""

    walks: tuple[str, ...] = ()
    chains: Mapping[str, tuple[tuple[str, Stage], ...]] | None = None
    pick: Any = None
    consumer_walk: ConsumerWalk | None = None


def reads_of(stage: Stage) -> tuple[Stage, ...]:
    """The inputs a source reads (``reads=``); none for any other stage."""
    options = stage.options
    return options.reads if isinstance(options, SourceOptions) else ()


def chunks_of(stage: Stage) -> ChunkPolicyFactory | None:
    """The chunk policy factory of the connections ``stage`` consumes, or None (items as is)."""
    options = stage.options
    return options.chunks if isinstance(options, Chunked) else None


def limits_of(stage: Stage) -> ClientStreamLimits | None:
    """The client-stream limits of an input stage (``None``: unbounded, or not an input)."""
    options = stage.options
    return options.limits if isinstance(options, InputOptions) else None


def fuses(stage: Stage) -> bool:
    """Whether ``stage`` was built with ``fuse=True`` (a pipe)."""
    options = stage.options
    return isinstance(options, PipeOptions) and options.fuse
