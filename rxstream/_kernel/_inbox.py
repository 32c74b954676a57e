"""The inbox spec: how many items wait in front of a stage and what happens when it is full."""

from dataclasses import dataclass
from typing import get_args

from rxstream._exceptions import ArgumentError
from rxstream.typing import InboxPolicy

__all__ = ["DEFAULT_CAPACITY", "InboxSpec"]

DEFAULT_CAPACITY = 2
_POLICIES = get_args(InboxPolicy)


@dataclass(frozen=True)
class InboxSpec:
    """A stage's bounded inbox: ``capacity`` items, and the ``policy`` for one more.

    ``block`` makes the upstream thread wait (backpressure up to a generator source),
    ``latest`` drops the oldest waiting item (real time), ``drop_new`` drops the arriving one.
    """

    capacity: int = DEFAULT_CAPACITY
    policy: InboxPolicy = "block"

    def check(self, stage: str) -> "InboxSpec":
        """This spec, or a ``ValueError`` naming ``stage`` and the broken rule."""
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise ArgumentError(
                f"inbox capacity must be an int >= 1, got {self.capacity!r} for stage {stage!r}"
            )
        if self.capacity < 1:
            raise ArgumentError(
                f"inbox capacity must be >= 1, got {self.capacity} for stage {stage!r}"
            )
        if self.policy not in _POLICIES:
            raise ArgumentError(
                f"inbox policy must be one of {', '.join(_POLICIES)}, "
                f"got {self.policy!r} for stage {stage!r}"
            )
        return self
