"""The stamps of a stage that holds items: ``pace`` (until its tick), ``window`` (until it closes).

Such a stage stamps three times: ``<stage>.in`` when the item arrived, ``<stage>.hold`` when
the hold ended (the tick fired, the window closed) and ``<stage>.out`` when the output was made.
Each stamp ends the span it names, like ``.in`` ends the queue-wait and ``.out`` the compute:
the fold reads ``.in`` → ``.hold`` as the item's hold and ``.hold`` → ``.out`` as compute
(docs/timing.md). The chain stays plain ``(hop, t)`` pairs, so ring framing is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

from rxstream._kernel._shell import StageShell
from rxstream.item import Timeline, now

__all__ = ["HeldStamps", "held_stamps"]

HeldStamps = Callable[[float, float], Timeline]
"""``(arrived, released) -> (.in, .hold, .out now)``: the stamps of one held item."""


def held_stamps(shell: StageShell) -> HeldStamps:
    """The stamper of ``shell``'s stage, decided once: none when timing is off."""
    if not shell.timing:
        return _none
    in_hop, hold_hop, out_hop = shell.in_hop, f"{shell.name}.hold", shell.out_hop

    def stamps(arrived: float, released: float) -> Timeline:
        return ((in_hop, arrived), (hold_hop, released), (out_hop, now()))

    return stamps


def _none(_arrived: float, _released: float) -> Timeline:
    return ()
