"""GPU-true stage time: a CUDA event pair around each call of a stage placed on a CUDA device,
resolved when a record is folded, never waited on; and opt-in NVTX ranges per stage call.

A run that has a CUDA api (the real one, or ``Context(cuda_api=…)``'s) makes one `GpuClock`;
each stage placed on a CUDA device (``device="cuda"``/``"cuda:N"``) gets a `StageTimer` from
it. The timer wraps the stage's call: it records an event on the current stream (the stream
the call uses) before the call and another after it, from a small pool of pairs reused in
turn, and notes the host time of the call. The host never waits: nothing synchronizes. When
the sink folds a record, `GpuClock.gpu_ms` finds the pair of the hop's call (the one whose
call time lies between the hop's ``.in`` and ``.out`` stamps) and asks the end event whether
it is done (CUDA's ``query()``): done, the pair's elapsed GPU time is the hop's ``gpu_ms``;
not done yet, or its pair already reused by a later call (the pool is `POOL` pairs a stage),
it is ``None`` and counted in ``unresolved``.

NVTX (``RXSTREAM_NVTX=1``): every stage call of a run with a CUDA api is one NVTX range named
``<stage> input_seq=<n>``, pushed before the call and popped after it, also when it raises.
Off, no stage call is wrapped at all.

Across processes: an item that leaves this process's rank for another's (whose sink folds
it) takes a ``<stage>.gpu`` stamp per CUDA stage of this rank it went through, resolved as it
leaves (`GpuClock.stamps`): the GPU ms, or NaN when the work was not done by then.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

from rxstream.item import now

__all__ = ["GPU_SUFFIX", "NVTX_ENV", "POOL", "GpuClock", "StageTimer", "nvtx_from_env"]

GPU_SUFFIX = ".gpu"
"""The stamp ``<stage>.gpu`` an item takes when it leaves its rank's process: its value is the
stage's GPU ms, not a time (NaN: unresolved then), so the rank that folds it has it."""

POOL = 64
"""Event pairs a stage keeps: a call reuses the pair of the call ``POOL`` calls before it, so a
record folded later than that finds no pair (``gpu_ms`` ``None``, counted unresolved)."""

NVTX_ENV = "RXSTREAM_NVTX"
"""The environment variable that turns NVTX ranges on (``1``)."""


def nvtx_from_env() -> bool:
    """Whether ``RXSTREAM_NVTX`` asks for NVTX ranges (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get(NVTX_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def device_index(device: str) -> int | None:
    """``"cuda:N"``'s ``N``; ``None`` for ``"cuda"`` (the current device)."""
    _, _, index = device.partition(":")
    return int(index) if index else None


class StageTimer:
    """One stage's event pairs and NVTX range (see the module docstring); `wrap` its call."""

    __slots__ = ("_api", "_at", "_device", "_next", "_pairs", "gpu", "input_seq", "name", "nvtx")

    def __init__(self, api: Any, name: str, device: int | None, *, gpu: bool, nvtx: bool) -> None:
        self._api = api
        self.name = name
        self._device = device
        self.gpu = gpu
        """Whether the stage's calls are timed by events (it is placed on a CUDA device)."""
        self.nvtx = nvtx
        """Whether each call is an NVTX range."""
        self.input_seq = 0
        """The ``input_seq`` of the item being called (set by the operator, for NVTX's name)."""
        self._pairs: list[tuple[Any, Any]] = []  # made on the first call, on the stage's thread
        self._at: list[float] = [-1.0] * POOL  # host time of each pair's call (-1: none/busy)
        self._next = 0

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` with this stage's event pair and NVTX range around it."""
        api = self._api
        device = self._device
        name = self.name
        timed, nvtx = self.gpu, self.nvtx
        at = self._at

        def wrapped(*args: Any) -> Any:
            if nvtx:
                api.nvtx_push(f"{name} input_seq={self.input_seq}")
            try:
                if not timed:
                    return call(*args)
                if not self._pairs:
                    self._pairs = [
                        (api.timing_event(device), api.timing_event(device)) for _ in range(POOL)
                    ]
                slot = self._next
                self._next = (slot + 1) % POOL
                start, end = self._pairs[slot]
                at[slot] = -1.0  # being recorded again: no fold reads it meanwhile
                began = now()
                api.record_current(device, start)
                try:
                    return call(*args)
                finally:
                    api.record_current(device, end)
                    at[slot] = began
            finally:
                if nvtx:
                    api.nvtx_pop()

        return wrapped

    def gpu_ms(self, began: float, ended: float) -> float | None:
        """The GPU ms of the call between host times ``began`` and ``ended`` (a hop's ``.in``
        and ``.out``), or ``None``: no pair left for it, or its work not done yet."""
        pairs = self._pairs
        for slot, at in enumerate(self._at):
            if began <= at <= ended and pairs:
                start, end = pairs[slot]
                if not self._api.event_done(end):
                    return None
                ms = float(self._api.elapsed_ms(start, end))
                return ms if self._at[slot] == at else None  # recorded again meanwhile
        return None


class GpuClock:
    """A run's stage timers, and the resolution of their calls' GPU time (module docstring)."""

    def __init__(self, api: Any, *, nvtx: bool = False) -> None:
        self.api = api
        self.nvtx = nvtx
        """Whether every stage call is an NVTX range."""
        self.timers: dict[str, StageTimer] = {}
        self.resolved = 0
        """Hops whose ``gpu_ms`` a fold found."""
        self.unresolved = 0
        """Hops of a CUDA stage whose ``gpu_ms`` a fold reported as ``None`` (work not done, or
        its event pair already reused)."""
        self._lock = threading.Lock()

    def timer(self, name: str, device: str | None) -> StageTimer | None:
        """The timer of stage ``name`` placed on ``device``: event pairs for a CUDA device, an
        NVTX range when on; ``None`` when it needs neither (its calls stay as they are)."""
        gpu = device is not None and device.startswith("cuda")
        if not gpu and not self.nvtx:
            return None
        index = device_index(device) if gpu and device is not None else None
        timer = StageTimer(self.api, name, index, gpu=gpu, nvtx=self.nvtx)
        if gpu:
            self.timers[name] = timer
        return timer

    def gpu_ms(self, name: str, began: float, ended: float) -> float | None:
        """Hop ``name``'s GPU ms for its call between ``began`` and ``ended`` (``None``:
        unresolved, counted); only for a stage in `timers`."""
        ms = self.timers[name].gpu_ms(began, ended)
        with self._lock:
            if ms is None:
                self.unresolved += 1
            else:
                self.resolved += 1
        return ms

    def stamps(self, timeline: tuple[tuple[str, float], ...]) -> tuple[Any, ...]:
        """The ``<stage>.gpu`` stamps (flat: ``hop, ms…``) of this process's CUDA stages in
        ``timeline`` that have none yet, for an item leaving to another process's rank:
        resolved now, never waited on (NaN when unresolved)."""
        timers = self.timers
        stamped = {hop for hop, _ in timeline if hop.endswith(GPU_SUFFIX)}
        opened: dict[str, float] = {}
        out: list[Any] = []
        for hop, t in timeline:
            if hop.endswith(".in"):
                opened[hop[:-3]] = t
            elif hop.endswith(".out"):
                name = hop[:-4]
                began = opened.pop(name, None)
                gpu_hop = name + GPU_SUFFIX
                if name in timers and began is not None and gpu_hop not in stamped:
                    ms = self.gpu_ms(name, began, t)
                    out += (gpu_hop, math.nan if ms is None else ms)
        return tuple(out)
