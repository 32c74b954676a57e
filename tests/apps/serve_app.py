"""A small app for the ``rxstream serve`` tests: flat frames in the doc's ``shade``.

A counter source, ``pace`` at 30 fps and ``paint``: a 16 x 16 raw frame of the doc's
``shade`` (so a frame says which doc made it); ``fail`` set makes ``paint`` raise. The
``model`` resource writes a file ``load-<pid>-<n>`` into the folder ``loads`` (when set) each
time it is made: loaded once per worker process, whatever the sessions.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import numpy as np

import rxstream


class Model:
    """A stand-in for weights: its construction is counted."""

    def __init__(self, loads: str) -> None:
        if loads:
            folder = Path(loads)
            mine = len(list(folder.glob(f"load-{os.getpid()}-*")))
            (folder / f"load-{os.getpid()}-{mine}").write_text(repr(time.time()))


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """Paint the doc's shade, 30 frames a second."""
    doc = ctx.doc("control", defaults={"shade": 0, "fail": False, "loads": ""})
    loads = doc.desired.loads.value
    model = ctx.resource("model", lambda: Model(loads))

    def paint(index: int) -> np.ndarray:
        model.get()
        if doc.desired.fail.value:
            raise RuntimeError("asked to fail")
        return np.full((16, 16, 3), doc.desired.shade.value, dtype=np.uint8)

    return ctx.source(itertools.count) | ctx.pace(fps=30.0) | ctx.pipe(paint) | ctx.stream("video")
