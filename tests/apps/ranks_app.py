"""A two-rank app for the launch tests; ``mode`` in the control doc picks a behaviour.

- ``normal``: numbered frames cross from rank 0 to rank 1 and egress there.
- ``die``: rank 1's stage kills its process at the 5th frame.
- ``raise``: rank 1's stage raises at the 5th frame.
- ``unpicklable``: rank 0 sends a payload that cannot cross.
- ``finite``: 30 frames, then the source ends; rank 1 is slow, so the end must wait for it.
- ``steer``: rank 0's source steers the prompt at the 10th frame; rank 1 records, per frame,
  the prompt it reads inline and the frame's generation.
- ``big``: 6 frames of 9.4 MB (more than a default slot holds) through rings of 16 MiB
  slots (``ctx.ring_spec``); rank 1 checks every byte. ``big_default``: the same frames
  with the default slots.

Rank 1 appends one JSON line per frame to the file named by ``out`` (when set).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import rxstream


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank."""
    doc = ctx.doc("control", defaults={"mode": "normal", "out": "", "died": "", "prompt": "a"})
    mode = doc.desired.mode.value
    big = mode in ("big", "big_default")
    if mode == "big":
        ctx.ring_spec = rxstream.RingSpec(slot_bytes=16 << 20)

    def frames() -> Iterator[Any]:
        for index in range(30) if mode == "finite" else range(6) if big else itertools.count():
            if mode == "steer" and index == 10:
                doc.steer(prompt="b")
            if mode == "unpicklable" and index == 3:
                yield (x for x in range(3))
            if big:
                yield np.full((1536, 2048, 3), index, dtype=np.uint8)
            else:
                yield np.full((4, 4), index, dtype=np.int64)

    def rank1(frame: np.ndarray, item: rxstream.PipelineItem | None = None) -> np.ndarray:
        index = int(frame.flat[0])
        if big and not (frame.shape == (1536, 2048, 3) and (frame == index).all()):
            raise RuntimeError(f"frame {index} arrived changed")
        if mode == "die" and index == 5:
            died = doc.desired.died.value
            if died:  # when it died, on the host's monotonic clock
                with open(died, "w", encoding="utf-8") as file:
                    file.write(repr(time.monotonic()))
            os._exit(3)
        if mode == "raise" and index == 5:
            raise RuntimeError("rank 1 broke on frame 5")
        if mode == "finite":
            time.sleep(0.005)
        return frame

    def record(item: rxstream.PipelineItem) -> rxstream.PipelineItem:
        out = doc.desired.out.value
        if out:
            line = {
                "index": int(item.payload.flat[0]),
                "generation": item.metadata.prompt_generation,
                "prompt": doc.desired.prompt.value,
                "hops": [hop for hop, _ in item.metadata.timeline],
            }
            with open(out, "a", encoding="utf-8") as file:
                file.write(json.dumps(line) + "\n")
        return item

    return (
        ctx.source(frames, rank=0)
        | ctx.pipe(lambda x: x, name="prepare", rank=0)
        | ctx.pipe(rank1, name="work", rank=1)
        | ctx.pipe(record, name="record", items=True)
        | ctx.stream("video")
    )
