"""Client stream limits: how much a client may feed one ``ctx.input`` stream in a session."""

from collections.abc import Callable
from typing import Any, NamedTuple

from rxstream._exceptions import RxStreamError

__all__ = ["ClientStreamLimitExceeded", "ClientStreamLimits"]


class ClientStreamLimits(NamedTuple):
    """Bounds on what the client feeds one client stream; ``None`` is unbounded.

    ``max_items`` is measured in ``unit`` s, each sample counting ``item_size(sample)`` (1 per
    item when ``item_size`` is ``None``).
    """

    max_items: int | None = None
    item_size: Callable[[Any], float] | None = None
    unit: str = "items"


class ClientStreamLimitExceeded(RxStreamError, ValueError):
    """A client fed a stream past its bound; names the stream, the bound, the unit and amount."""

    def __init__(self, stream: str, bound: int, unit: str, amount: float) -> None:
        self.stream = stream
        self.bound = bound
        self.unit = unit
        self.amount = amount
        super().__init__(
            f"client stream {stream!r} is limited to {bound} {unit} per session; "
            f"this sample would bring it to {amount:g} {unit}"
        )
