"""A three-rank app for the torchrun tests: frames cross between hosts, then through a ring.

rank 0: ``frames`` (items with ``pts``, ``input_seq`` and ``input_at_ms`` set; in mode
``normal`` the 10th steers the prompt) and ``render``, which makes each frame: a numpy frame
and a bfloat16 tensor large enough to travel as messages of their own, and small values
inside the head.
rank 1: ``work`` reads the prompt inline and checks what arrived. Frame 2 also carries 9 MiB,
more than a ring slot holds: only the cross-host transport carries it, and ``work`` keeps its
sum alone.
rank 2: ``finish`` and the sink ``video``.

``render>work`` is the boundary the tests force across hosts (``RXSTREAM_CROSS_HOST``);
``work>finish`` stays a shared-memory ring between ranks 1 and 2.

``mode`` in the control doc: ``normal``; ``raise`` (``work`` raises at frame 5); ``die``
(rank 1's process exits at frame 5); ``freeze`` (rank 1 stops itself with SIGSTOP at frame
5, its sockets open: only heartbeats tell); ``die0`` (rank 0, the controller, exits at frame
5). Rank 2 appends what reached ``finish`` to
``$RXSTREAM_WIRE_OUT/egress.jsonl`` and the timing records to ``timing.jsonl``; rank 1 writes
when it froze or died to ``rank1.txt`` (the host's monotonic clock).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import rxstream
from rxstream.timing import TimingRecord

OUT = os.environ.get("RXSTREAM_WIRE_OUT", "")


def _append(name: str, row: dict[str, Any]) -> None:
    if OUT:
        with open(Path(OUT) / name, "a", encoding="utf-8") as file:
            file.write(json.dumps(row) + "\n")


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank."""
    doc = ctx.doc("control", defaults={"mode": "normal", "prompt": "a"})
    mode = doc.desired.mode.value

    def frames() -> Iterator[rxstream.PipelineItem]:
        gens = ctx.generations
        for i in itertools.count():
            if i == 10 and mode == "normal":  # (a steer would drop frame 5 of the others)
                doc.steer(prompt="b")
            metadata = rxstream.PipelineMetadata(
                prompt_generation=gens.prompt,
                flush_generation=gens.flush,
                cutover=i == 10 and mode == "normal",
                pts=10 * i,
                input_seq=i + 1,
                input_at_ms=1000 + i,
            )
            yield rxstream.PipelineItem(i, metadata)

    def render(i: int) -> dict[str, Any]:
        if i == 5 and mode == "die0":
            os._exit(3)
        extra = {"big": np.ones(9 << 20, dtype=np.uint8)} if i == 2 else {}  # > a ring slot
        return {
            **extra,
            "index": i,
            "frame": np.full((128, 128), i, dtype=np.float32),  # 64 KB: a message of its own
            "tensor": torch.full((64, 256), i, dtype=torch.bfloat16),  # 32 KB: the same
            "small": np.arange(4) + i,  # inside the head
            "label": f"frame {i}",
        }

    def work(payload: dict[str, Any]) -> dict[str, Any]:
        i = payload["index"]
        if i == 5 and mode in ("die", "freeze"):
            _append("rank1.txt", {"mode": mode, "at": time.monotonic(), "pid": os.getpid()})
            if mode == "die":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGSTOP)
        if i == 5 and mode == "raise":
            raise RuntimeError("rank 1 broke on frame 5")
        frame, tensor = payload["frame"], payload["tensor"]
        big = payload.pop("big", None)  # too big for the ring to rank 2
        return {
            **payload,
            "big_sum": None if big is None else int(big.sum()),
            "prompt": doc.desired.prompt.value,
            "frame_ok": type(frame) is np.ndarray
            and frame.dtype == np.float32
            and frame.shape == (128, 128)
            and bool((frame == i).all()),
            "tensor_ok": type(tensor) is torch.Tensor
            and tensor.dtype == torch.bfloat16
            and tuple(tensor.shape) == (64, 256)
            and bool((tensor == i).all()),
        }

    def finish(item: rxstream.PipelineItem) -> rxstream.PipelineItem:
        payload, md = item.payload, item.metadata
        _append(
            "egress.jsonl",
            {
                "index": payload["index"],
                "label": payload["label"],
                "small": payload["small"].tolist(),
                "prompt": payload["prompt"],
                "frame_ok": payload["frame_ok"],
                "tensor_ok": payload["tensor_ok"],
                "frame_sum": float(payload["frame"].sum()),
                "big_sum": payload["big_sum"],
                "pts": md.pts,
                "input_seq": md.input_seq,
                "input_at_ms": md.input_at_ms,
                "generation": md.prompt_generation,
                "cutover": md.cutover,
                "hops": [hop for hop, _ in md.timeline],
                "stamps": [t for _, t in md.timeline],
            },
        )
        return item

    def timing(record: TimingRecord) -> None:
        hops = [[h.name, h.wait_ms, h.compute_ms] for h in record.hops]
        _append(
            "timing.jsonl",
            {"input_seq": record.input_seq, "total_ms": record.total_ms, "hops": hops},
        )

    return (
        ctx.source(frames, name="frames", rank=0)
        | ctx.pipe(render, name="render")
        | ctx.pipe(work, name="work", rank=1)
        | ctx.pipe(finish, name="finish", rank=2, items=True)
        | ctx.stream("video", on_timing=timing)
    )
