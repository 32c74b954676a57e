"""Small RGB frames for the ``rxstream run`` tests; the control doc (a dataclass schema) says how.

A counter source makes ``height`` x ``width`` uint8 frames (each a flat colour from its index;
``limit`` frames, or forever), steers ``gain`` every ``steer_every`` frames (so the sink logs a
``[timing:video]`` record per cutover), ``pace`` holds ``fps``, and the ``video`` sink egresses.
``split`` puts the paint stage and the sink on rank 1. Every rank writes its pid to
``<pids>/rank<r>.pid`` and rank 0 the doc's state to ``report`` (when set). The build checks one
frame in its self test.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

import rxstream
from rxstream.doc._snapshot import thaw


@dataclass
class Size:
    """The frame size: even, as h264 wants it."""

    height: int = 32
    width: int = 48

    def __post_init__(self) -> None:
        if self.height % 2 or self.width % 2 or self.height < 2 or self.width < 2:
            raise ValueError(
                f"height and width must be even and >= 2, got {self.height}x{self.width}"
            )


@dataclass
class Control:
    """The app's desired state."""

    size: Size = field(default_factory=Size)
    fps: float = 200.0
    gain: float = 1.0
    mode: Literal["ramp", "flat"] = "ramp"
    split: bool = False
    limit: int | None = None
    steer_every: int = 8
    tags: list[str] = field(default_factory=list)
    pids: str = ""
    report: str = ""


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank."""
    doc = ctx.doc("control", schema=Control)
    state = doc.desired
    if state.pids.value:
        Path(state.pids.value, f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    if state.report.value and ctx.rank == 0:
        Path(state.report.value).write_text(json.dumps(thaw(doc.snapshot())))
    height, width = state.size.height.value, state.size.width.value
    limit, every = state.limit.value, state.steer_every.value

    def counter() -> Iterator[int]:
        for index in range(limit) if limit is not None else itertools.count():
            if index and every and index % every == 0:
                doc.steer(gain=doc.desired.gain.value + 1)
            yield index

    def paint(index: int) -> np.ndarray:
        shade = index * 7 % 256 if doc.desired.mode.value == "ramp" else 128
        return np.full((height, width, 3), shade, dtype=np.uint8)

    rank = 1 if state.split.value else 0
    pipeline = (
        ctx.source(counter)
        | ctx.pace(fps=state.fps.value)
        | ctx.pipe(paint, rank=rank)
        | ctx.stream("video")
    )
    with ctx.self_test():
        (frame,) = pipeline.drive(frames=1)
        assert frame.shape == (height, width, 3), frame.shape
        assert frame.dtype == np.uint8, frame.dtype
    return pipeline
