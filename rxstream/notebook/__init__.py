"""Notebook helpers: doc-bound widgets, a live frame view, a live statistics table, and
pipelines run in the background of a kernel.

Each helper keeps a notebook cell to one line::

    bg = background(pipeline)                  # start; stopped on interrupt, shutdown, close
    view = FrameView("video")                  # ctx = rxstream.Context(transport=view.transport())
    StatsView(pipeline)                        # a table that refreshes itself
    widget(doc, "gain", min=0, max=2)          # a slider two-way bound to doc.desired.gain

It needs the ``notebook`` extra (``pip install 'rxstream[notebook]'``: ipywidgets and
ipykernel); ``import rxstream`` never imports it.
"""

from __future__ import annotations

try:
    import ipywidgets  # noqa: F401  (checked here, used by the helpers' modules)
    from IPython import get_ipython  # noqa: F401
except ImportError as exc:  # tests/test_notebook_helpers.py hides ipywidgets to check this
    raise ImportError(
        "rxstream.notebook needs ipywidgets, which rxstream does not install by default: "
        "install the notebook extra with pip install 'rxstream[notebook]' "
        f"(missing: {exc.name})"
    ) from exc

from rxstream._util import fixup_module_metadata
from rxstream.notebook._background import Background, background, stop_all
from rxstream.notebook._views import (
    FrameTransport,
    FrameView,
    StatsView,
    encode_frame,
    frame_array,
)
from rxstream.notebook._widgets import widget

__all__ = [
    "Background",
    "FrameTransport",
    "FrameView",
    "StatsView",
    "background",
    "encode_frame",
    "frame_array",
    "stop_all",
    "widget",
]

fixup_module_metadata(__name__, globals())
