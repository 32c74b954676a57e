"""The session transport's contract: what egress goes through and what a client sees.

A transport is handed a :class:`Session` when a run starts (:meth:`Transport.open`) and is
closed when it stops; in between, sinks :meth:`~Transport.send` items and timing records
(:meth:`~Transport.on_timing`) to it from their stage threads. ``connected`` keeps
``pipeline.run()`` alive.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rxstream._exceptions import UnknownInputError
from rxstream.doc import Doc
from rxstream.item import PipelineItem
from rxstream.timing import TimingRecord

__all__ = ["CODECS", "Session", "Transport"]

CODECS = ("raw", "jpeg", "h264")
"""The egress codecs ``ctx.stream(name, codec=…)`` takes (``None`` means ``raw``)."""


class Feed(Protocol):
    """``pipeline.feed``'s shape: push ``sample`` into input ``name``; its ``input_seq``."""

    def __call__(
        self, name: str, sample: Any, at_ms: float | None = None, *, client: Hashable = None
    ) -> int: ...


def _no_feed(name: str, sample: Any, at_ms: float | None = None, *, client: Hashable = None) -> int:
    raise UnknownInputError(f"no input stream {name!r}: this session has no inputs")


@dataclass(frozen=True)
class Session:
    """What a running pipeline offers its transport: streams, inputs, docs and ``feed``."""

    streams: Mapping[str, str] = field(default_factory=dict)
    """Each egress stream's codec, by stream name (``raw``, ``jpeg`` or ``h264``)."""
    inputs: tuple[str, ...] = ()
    """The names of the ``ctx.input`` streams a client may feed."""
    docs: Mapping[str, Doc] = field(default_factory=dict)
    """The desired-state docs a client may edit, by name."""
    feed: Feed = _no_feed
    """``pipeline.feed``: push a client sample into an input stream; its ``input_seq`` (the
    transport passes ``client=`` one key per connection: each has its own budget)."""


class Transport:
    """Where ``ctx.stream`` sinks send their items; ``connected`` holds ``run()`` alive."""

    @property
    def connected(self) -> bool:
        """Whether a client is attached; ``run()`` stops when this turns false."""
        raise NotImplementedError

    def open(self, session: Session) -> None:
        """A run starts: what it offers a client. Called before any :meth:`send`."""

    def send(self, stream: str, item: PipelineItem) -> None:
        """Egress one item of ``stream``; called on the sink stage's thread."""
        raise NotImplementedError

    def on_timing(self, record: TimingRecord) -> None:
        """A sink folded a ``[timing:<stream>]`` record; called on the sink stage's thread."""

    def close(self) -> None:
        """The run stopped: flush and release what :meth:`open` and :meth:`send` took."""
