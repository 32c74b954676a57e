"""Timing records: one item's timeline folded into per-hop queue-wait, hold and compute."""

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rxstream._exceptions import ArgumentTypeError
from rxstream.item import PipelineMetadata, Timeline
from rxstream.timing._client import ClientTiming
from rxstream.timing._gpu import GPU_SUFFIX, GpuClock

__all__ = ["HopTiming", "TimingRecord", "fold", "run_of"]

_SHOWN_CHARS = 60
"""The most of a bad ``run`` value a malformed line's reason shows."""


def run_of(flat: Mapping[str, Any]) -> str:
    """A log line's ``run``: ``""`` when it has none (a line written before runs had ids);
    ``ArgumentTypeError`` (a ``TypeError``: the line is malformed) when it is not a string,
    ``null`` included (rxstream never writes one)."""
    run = flat.get("run", "")
    if isinstance(run, str):
        return run
    try:
        shown = json.dumps(run, default=repr)
    except RecursionError:  # nested past the encoder's depth: its start is enough
        shown = "[" * _SHOWN_CHARS
    if len(shown) > _SHOWN_CHARS:
        shown = shown[: _SHOWN_CHARS - 1] + "…"
    raise ArgumentTypeError(f"run must be a string, got {shown} ({type(run).__name__})")


@dataclass(frozen=True)
class HopTiming:
    """One stage's share of an item's latency."""

    name: str
    """The stage's name."""
    wait_ms: float
    """Queue-wait: from the previous stamp (the upstream ``.out``) to this stage's ``.in``."""
    compute_ms: float
    """Compute: from this stage's ``.in`` (its ``.hold`` when it held the item) to its ``.out``."""
    hold_ms: float = 0.0
    """Hold: from ``.in`` to ``.hold``, the time a ``pace`` or ``window`` kept the item waiting
    for its tick or for its window to close (0 for a stage that does not hold)."""
    gpu_ms: float | None = None
    """GPU time of the stage's call: between CUDA events recorded on the call's stream before
    and after it (a stage placed on a CUDA device); ``None`` for any other stage, and for a
    CUDA stage whose events were not done (or were reused) when the record was folded."""
    gpu: bool = False
    """Whether the stage was timed on its CUDA device (``gpu_ms`` is then its GPU time, or
    ``None`` when unresolved)."""


@dataclass(frozen=True)
class TimingRecord:
    """Where the milliseconds went between a user's input (or a steer) and egress.

    One record per conditioned window (per ``input_seq``) or per cutover, never per frame.
    """

    stream: str
    """The egress stream (the sink's name)."""
    input_seq: int
    """The input sample that conditioned the frame (0 for a steered pipeline's cutover)."""
    input_at_ms: int
    """The client's timestamp of that input in ms (its receive time when the client sent none)."""
    cutover: bool
    """Whether the frame was a cutover (the first of a new generation or of a rebuilt stage)."""
    prompt_generation: int
    """The frame's prompt generation."""
    pts: int
    """The frame's presentation timestamp."""
    origin: str
    """The first stamp: ``input.recv``, ``steer``, or the first stage's ``.in``."""
    total_ms: float
    """From the origin stamp to the last ``.out`` (egress): every hop's wait, hold and compute."""
    from_client_ms: float | None
    """Wall-clock ms from ``input_at_ms`` to egress (meaningful when the client clock is shared)."""
    hops: tuple[HopTiming, ...]
    """Each hop in the order it happened."""
    client: ClientTiming | None = None
    """The page's part (net, decode, present, ``photon_ms``), joined from its ``[photon:…]``
    line; ``None`` when no page reported showing the frame."""

    @property
    def photon_ms(self) -> float | None:
        """Input to pixels (``client.photon_ms``), or ``None`` without a page's report."""
        return None if self.client is None else self.client.photon_ms

    self_test: bool = False
    """Whether the frame egressed inside ``with ctx.self_test():`` (the app checking itself at
    start-up, not a user's input): ``rxstream timing`` leaves such records out by default."""
    run: str = ""
    """The id of the run that folded it (``Pipeline.run_id``: one per threaded run or driven
    session, the same on every rank of a launch); ``""`` for a record made outside a run, or
    read from a line written before runs had ids."""

    def fields(self) -> dict[str, Any]:
        """The flat key-value form of the log line (``<hop>.wait_ms``, ``<hop>.compute_ms``).

        ``<hop>.hold_ms`` is written only for a hop that held the item (non-zero hold), so the
        lines of stages that do not hold are as they were; a missing one reads back as 0.
        ``<hop>.gpu_ms`` is written only for a hop timed on its CUDA device (``null`` when
        unresolved): a line without CUDA stages is as it was.
        """
        flat: dict[str, Any] = {
            "run": self.run,
            "stream": self.stream,
            "input_seq": self.input_seq,
            "input_at_ms": self.input_at_ms,
            "cutover": self.cutover,
            "prompt_generation": self.prompt_generation,
            "pts": self.pts,
            "origin": self.origin,
            "total_ms": round(self.total_ms, 3),
            "from_client_ms": None
            if self.from_client_ms is None
            else round(self.from_client_ms, 3),
            "hops": ",".join(hop.name for hop in self.hops),
        }
        for hop in self.hops:
            flat[f"{hop.name}.wait_ms"] = round(hop.wait_ms, 3)
            if hop.hold_ms:
                flat[f"{hop.name}.hold_ms"] = round(hop.hold_ms, 3)
            flat[f"{hop.name}.compute_ms"] = round(hop.compute_ms, 3)
            if hop.gpu:
                flat[f"{hop.name}.gpu_ms"] = None if hop.gpu_ms is None else round(hop.gpu_ms, 3)
        if self.client is not None:
            flat.update(self.client.fields())
        if self.self_test:  # only then: the lines of a live run stay as they were
            flat["self_test"] = True
        return flat

    @classmethod
    def from_fields(cls, flat: Mapping[str, Any]) -> "TimingRecord":
        """The record a log line's fields describe (``KeyError``/``ValueError``/``TypeError``
        when malformed: a ``run`` that is not a string among them)."""
        names = [name for name in str(flat["hops"]).split(",") if name]
        hops = tuple(
            HopTiming(
                name,
                float(flat[f"{name}.wait_ms"]),
                float(flat[f"{name}.compute_ms"]),
                float(flat.get(f"{name}.hold_ms", 0.0)),
                _gpu_ms(flat.get(f"{name}.gpu_ms")),
                f"{name}.gpu_ms" in flat,
            )
            for name in names
        )
        from_client = flat.get("from_client_ms")
        return cls(
            stream=str(flat["stream"]),
            input_seq=int(flat["input_seq"]),
            input_at_ms=int(flat.get("input_at_ms", 0)),
            cutover=bool(flat.get("cutover", False)),
            prompt_generation=int(flat.get("prompt_generation", 0)),
            pts=int(flat.get("pts", 0)),
            origin=str(flat.get("origin", "")),
            total_ms=float(flat["total_ms"]),
            from_client_ms=None if from_client is None else float(from_client),
            hops=hops,
            client=ClientTiming.from_fields(flat) if "photon_ms" in flat else None,
            self_test=flat.get("self_test") is True,
            run=run_of(flat),
        )


def _gpu_ms(value: Any) -> float | None:
    return None if value is None else float(value)


def fold(
    stream: str,
    metadata: PipelineMetadata,
    wall_ms: float,
    run: str = "",
    gpu: GpuClock | None = None,
) -> TimingRecord:
    """Fold ``metadata.timeline`` into a record of ``run``; ``wall_ms`` is the egress
    wall-clock time; ``gpu``, the run's clock of its CUDA stages' events (their hops'
    ``gpu_ms``)."""
    timed = {} if gpu is None else gpu.timers
    timeline: Timeline = metadata.timeline
    # another process's CUDA stages: resolved as the item left that rank (NaN: unresolved)
    carried = {hop[: -len(GPU_SUFFIX)]: t for hop, t in timeline if hop.endswith(GPU_SUFFIX)}
    hops: list[HopTiming] = []
    origin = timeline[0][0] if timeline else ""
    start = timeline[0][1] if timeline else 0.0
    previous = start
    opened: dict[str, float] = {}
    held: dict[str, float] = {}
    waits: dict[str, float] = {}
    end = start
    for hop, t in timeline:
        if hop.endswith(".in"):
            name = hop[:-3]
            opened[name] = t
            waits[name] = t - previous
        elif hop.endswith(".out"):
            name = hop[:-4]
            began = opened.pop(name, t)
            released = held.pop(name, None)
            wait = waits.pop(name, 0.0) * 1e3
            hold = 0.0 if released is None else (released - began) * 1e3
            compute = (t - (began if released is None else released)) * 1e3
            if name in carried:
                ms = None if math.isnan(carried[name]) else carried[name]
                hops.append(HopTiming(name, wait, compute, hold, ms, True))
            elif name in timed and gpu is not None:
                ms = gpu.gpu_ms(name, began, t)
                hops.append(HopTiming(name, wait, compute, hold, ms, True))
            else:
                hops.append(HopTiming(name, wait, compute, hold))
            end = t
        elif hop.endswith(".hold"):  # a pace or window held the item from .in until now
            held[hop[:-5]] = t
        elif hop.endswith(GPU_SUFFIX):  # a value, not a time (above)
            continue
        previous = t
    from_client = wall_ms - metadata.input_at_ms if metadata.input_at_ms else None
    return TimingRecord(
        stream=stream,
        input_seq=metadata.input_seq,
        input_at_ms=metadata.input_at_ms,
        cutover=metadata.cutover,
        prompt_generation=metadata.prompt_generation,
        pts=metadata.pts,
        origin=origin,
        total_ms=(end - start) * 1e3,
        from_client_ms=from_client,
        hops=tuple(hops),
        run=run,
    )
