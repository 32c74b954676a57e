"""Client stream limits: how much a client may feed one ``ctx.input`` stream in a session.

A session is one client in one run: each client connection (a page) has its own budget, and
a new ``start()`` gives every client a fresh one. A sample is checked (its ``at_ms``, the
stream's schema, its ``item_size``) before it is charged, so a refused sample costs nothing.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from rxstream._exceptions import (
    NO_VALUE,
    ClientStreamLimitExceeded,
    InvalidSample,
    SampleRefused,
)

__all__ = [
    "NO_VALUE",
    "ClientStreamLimitExceeded",
    "ClientStreamLimits",
    "InvalidSample",
    "SampleRefused",
]


class ClientStreamLimits(NamedTuple):
    """Bounds on what the client feeds one client stream; ``None`` is unbounded.

    ``max_items`` is measured in ``unit`` s, each sample counting ``item_size(sample)`` (1 per
    item when ``item_size`` is ``None``; it must return a finite number >= 0, else the sample
    is refused). The bound holds per client connection per run.
    """

    max_items: int | None = None
    item_size: Callable[[Any], float] | None = None
    unit: str = "items"
