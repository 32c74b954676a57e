"""Internal: one private module per stage kind; each a small ``(source, …) -> Observable`` core.

Not part of rxstream's public surface: these functions take the runtime's private stage shell,
and ``rxstream.Context``'s builders (``ctx.pipe``, ``ctx.pace``, …) are how a user makes these
stages. ``__all__`` here is the interface to the layer above (``rxstream.context``), free to
change; docs/decisions.md says why.
"""

from rxstream.operators._fanin import (
    COMBINE_KIND,
    MERGE_KIND,
    ZIP_KIND,
    combine_operator,
    merge_operator,
    zip_operator,
)
from rxstream.operators._pace import PACE_KIND, pace_operator
from rxstream.operators._pipe import PIPE_KIND, TAP_KIND, pipe_operator, tap_operator
from rxstream.operators._rx import RX_KIND, rx_operator
from rxstream.operators._sink import STREAM_KIND, sink_operator
from rxstream.operators._source import check_source
from rxstream.operators._unbatch import UNBATCH_KIND, split_batch, unbatch_operator
from rxstream.operators._window import WINDOW_KIND, window_operator

__all__ = [
    "COMBINE_KIND",
    "MERGE_KIND",
    "PACE_KIND",
    "PIPE_KIND",
    "RX_KIND",
    "STREAM_KIND",
    "TAP_KIND",
    "UNBATCH_KIND",
    "WINDOW_KIND",
    "ZIP_KIND",
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
