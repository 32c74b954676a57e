"""Client stream limits: how much a client may feed one ``ctx.input`` stream in a session.

A session is one client in one run: each client connection (a page) has its own budget, and
a new ``start()`` gives every client a fresh one. A sample is checked (its ``at_ms``, the
stream's schema, its ``item_size``) before it is charged, so a refused sample costs nothing.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from rxstream._exceptions import RxStreamError

__all__ = ["ClientStreamLimitExceeded", "ClientStreamLimits", "InvalidSample", "SampleRefused"]


class ClientStreamLimits(NamedTuple):
    """Bounds on what the client feeds one client stream; ``None`` is unbounded.

    ``max_items`` is measured in ``unit`` s, each sample counting ``item_size(sample)`` (1 per
    item when ``item_size`` is ``None``; it must return a finite number >= 0, else the sample
    is refused). The bound holds per client connection per run.
    """

    max_items: int | None = None
    item_size: Callable[[Any], float] | None = None
    unit: str = "items"


NO_VALUE: Any = object()
"""What :attr:`InvalidSample.value` is when the rule is about a key (missing, unknown)."""


class SampleRefused(RxStreamError, ValueError):
    """A sample ``feed`` refused (nothing was queued or charged); ``code`` says which kind."""

    code = "refused"
    """What the web transport's error reply calls it: ``limit`` or ``invalid``."""

    def __init__(self, stream: str, message: str) -> None:
        self.stream = stream
        super().__init__(message)


class ClientStreamLimitExceeded(SampleRefused):
    """A client fed a stream past its bound; names the stream, the bound, the unit and amount."""

    code = "limit"

    def __init__(self, stream: str, bound: int, unit: str, amount: float) -> None:
        self.bound = bound
        self.unit = unit
        self.amount = amount
        super().__init__(
            stream,
            f"client stream {stream!r} is limited to {bound} {unit} per session; "
            f"this sample would bring it to {amount:g} {unit}",
        )


class InvalidSample(SampleRefused):
    """A sample (or its ``at_ms``, or its ``item_size``) that breaks a rule of its stream;
    names the stream, where in the sample, the rule and the value."""

    code = "invalid"

    def __init__(self, stream: str, where: str, rule: str, value: Any = NO_VALUE) -> None:
        self.where = where
        self.rule = rule
        self.value = value
        """The value refused (:data:`NO_VALUE` for a rule about a key: missing, unknown)."""
        got = "" if value is NO_VALUE else f", got {value!r}"
        super().__init__(stream, f"{where} {rule}{got} for client stream {stream!r}")
