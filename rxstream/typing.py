"""Callable aliases shared across rxstream (one place, as in reactivex and structlog)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

from reactivex import Observable

from rxstream.item import PipelineItem

__all__ = [
    "InboxPolicy",
    "ItemStream",
    "OnError",
    "Operator",
    "PaceOverflow",
    "PacePhase",
    "StageFn",
]

ItemStream: TypeAlias = Observable[PipelineItem]
"""The stream every stage consumes and produces."""

Operator: TypeAlias = Callable[[Sequence[ItemStream]], ItemStream]
"""A stage's Rx core: its input streams (one per port) to its output stream."""

StageFn: TypeAlias = Callable[..., Any]
"""A user's stage function: payload(s) in, payload out."""

InboxPolicy: TypeAlias = Literal["block", "latest", "drop_new"]
"""What a full inbox does with one more item: wait, drop the oldest, or drop the new one."""

OnError: TypeAlias = Literal["raise", "skip"]
"""What a stage does when its function raises: end the pipeline, or drop the item."""

PaceOverflow: TypeAlias = Literal["throttle", "latest"]
"""What ``pace`` does when frames come faster than its rate: hold the upstream, or drop."""

PacePhase: TypeAlias = Literal["lock", "fixed"]
"""Where ``pace`` puts its ticks: locked to just after the arrivals, or on a fixed grid."""
