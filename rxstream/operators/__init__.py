"""Internal: one private module per stage kind; each a small ``(source, …) -> Observable`` core.

Not part of rxstream's public surface: these functions take the runtime's private stage shell,
and ``rxstream.Context``'s builders (``ctx.pipe``, ``ctx.pace``, …) are how a user makes these
stages. ``__all__`` here is the interface to the layer above (``rxstream.context``), free to
change; docs/decisions.md says why.
"""

from rxstream.operators._fanin import combine_operator, merge_operator, zip_operator
from rxstream.operators._pace import pace_operator
from rxstream.operators._pipe import pipe_operator, tap_operator
from rxstream.operators._rx import rx_operator
from rxstream.operators._sink import sink_operator
from rxstream.operators._source import check_source
from rxstream.operators._unbatch import split_batch, unbatch_operator
from rxstream.operators._window import window_operator

__all__ = [
    "check_source",
    "combine_operator",
    "merge_operator",
    "pace_operator",
    "pipe_operator",
    "rx_operator",
    "sink_operator",
    "split_batch",
    "tap_operator",
    "unbatch_operator",
    "window_operator",
    "zip_operator",
]
