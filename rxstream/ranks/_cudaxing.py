"""CUDA tensors across a rank boundary: through a slot pool shared once, or exported per tensor.

The boundary's writer swaps every CUDA tensor in a payload (the payload itself, or inside
lists, tuples and dicts) for a small ref; the ring carries the refs. The first CUDA tensor
makes the boundary's slot pool (:class:`~rxstream.ipc.CudaSlotPool`, on that tensor's device:
``RingSpec.slots + EXTRA_SLOTS`` slots of ``RingSpec.slot_bytes``, or of the tensor's size if
larger), and
its :class:`~rxstream.ipc.CudaPoolShare` goes with that first item, once. From then on a tensor
crosses as a :class:`~rxstream.ipc.CudaSlotRef`: produced straight into a slot (`lease`), it
goes as it is; otherwise it is copied into a free slot (one device-to-device copy). A tensor
larger than a slot, or on another device, falls back to the per-tensor bridge
(:class:`~rxstream.ipc.CudaExporter`: a :class:`~rxstream.ipc.CudaTensorRef` per tensor),
counted and logged once.

The reader opens the pool once and sends its release events back on the boundary's release
pipe, then opens each slot ref in place; when the last view of an item's tensor is gone, the
slot's index goes back on that pipe (a bridge ref its id), and the writer drains the pipe
before each item, or blocks on it while every slot is in flight (backpressure). Two stages of
one process that sit on different ranks cannot use CUDA IPC (a process cannot open its own
handle), so there a CUDA tensor crosses by reference through a local table.

`lease` is what ``ctx.lease`` calls: on the thread of a stage whose output crosses a boundary
with a pool, it hands out a tensor in a free slot of that pool.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from rxstream._exceptions import RingClosed
from rxstream._util import library_logger
from rxstream.runtime._thread import charge_stall, stall_begins

if TYPE_CHECKING:  # the bridge imports torch: only a run that has CUDA loads it
    from rxstream.ipc import RingSpec
    from rxstream.ipc._cuda import (
        CudaApi,
        CudaExporter,
        CudaImporter,
        CudaPoolReader,
        CudaPoolShare,
        CudaPoolStatistics,
        CudaSlotPool,
        CudaTensorRef,
    )

__all__ = ["EXTRA_SLOTS", "CudaCrossing", "LocalRef", "PoolShared", "default_cuda_api", "lease"]

_log = library_logger("rxstream")

_POLL_S = 0.05
"""How often a writer waiting for a slot looks whether its boundary was closed."""
_ROUND = 2 << 20
"""Slots sized by a tensor are rounded up to this (the CUDA caching allocator's large unit)."""
EXTRA_SLOTS = 4
"""A pool's slots beyond the ring's: what the consumer's side holds while the ring is full
(the item the reader hands on, the downstream inbox's two, the one its stage works on), so in
a steady flow the ring, not the pool, is what holds the producer back, and no item is copied
out of its slot."""


def default_cuda_api() -> Any:
    """The real CUDA api when this process has torch loaded and a GPU; else ``None``.

    A process without torch imported cannot hold a CUDA tensor, so nothing is loaded for it.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    from rxstream.ipc._cuda import TorchCuda

    return TorchCuda()


class LocalRef(tuple[int]):
    """A CUDA tensor parked in this process's table while it crosses an in-process boundary."""

    __slots__ = ()


class PoolShared(tuple[Any, Any]):
    """The first pooled item's payload: ``(CudaPoolShare, payload)``; the reader opens the pool."""

    __slots__ = ()


_local: dict[int, Any] = {}
_local_ids = itertools.count(1)
_local_lock = threading.Lock()

_leases: dict[int, CudaCrossing] = {}
"""Per thread (``threading.get_ident``): the crossing whose pool that thread's stage leases."""


def lease(shape: Sequence[int], dtype: Any, device: Any = None) -> Any:
    """An empty tensor for the calling stage's output: in a slot of the boundary its output
    crosses when there is one with room (no copy at the boundary), else a new tensor on
    ``device`` (default: the pool's device, else ``cuda`` when available, else the CPU)."""
    import torch

    size = tuple(int(n) for n in shape)
    crossing = _leases.get(threading.get_ident())
    if crossing is not None:
        tensor = crossing.lease(size, dtype, device)
        if tensor is not None:
            return tensor
        if device is None:
            return crossing.empty(size, dtype)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.empty(size, dtype=dtype, device=device)


def _map(payload: Any, fn: Callable[[Any], Any], kind: type | tuple[type, ...]) -> Any:
    """``payload`` with ``fn`` applied to every ``kind`` in it (through lists, tuples, dicts)."""
    if isinstance(payload, kind):
        return fn(payload)
    if isinstance(payload, list):
        return [_map(v, fn, kind) for v in payload]
    if isinstance(payload, tuple) and not hasattr(payload, "_fields"):
        return tuple(_map(v, fn, kind) for v in payload)
    if isinstance(payload, dict):
        return {k: _map(v, fn, kind) for k, v in payload.items()}
    return payload


class CudaCrossing:
    """The CUDA side of one boundary: pool or export on the writer, open and release on the
    reader."""

    def __init__(
        self,
        api: CudaApi[Any, Any],
        release: tuple[Connection, Connection],
        *,
        local: bool,
        spec: RingSpec | None = None,
        name: str = "",
        extra_slots: int = EXTRA_SLOTS,
    ) -> None:
        import torch

        from rxstream.ipc import RingSpec
        from rxstream.ipc._cuda import (
            CudaExporter,
            CudaImporter,
            CudaSlotRef,
            CudaTensorRef,
        )
        from rxstream.ipc._cudaapi import view_of

        self._tensor = torch.Tensor
        self._torch_device = torch.device
        self._refs = (CudaTensorRef, CudaSlotRef, LocalRef)
        self._slot_ref = CudaSlotRef
        self._view = view_of
        self._api = api
        self._local = local
        self._spec = spec or RingSpec()
        self._name = name
        self._extra_slots = extra_slots
        self._release_r, self._release_w = release
        self._exporter: CudaExporter[Any, Any] = CudaExporter(api)
        self._importer: CudaImporter[Any, Any] = CudaImporter(api)
        self._pool: CudaSlotPool[Any] | None = None
        self._reader: CudaPoolReader[Any] | None = None
        self._announce: CudaPoolShare | None = None  # the pool's share, not sent yet
        self._fallbacks = 0
        self._closed = False
        self._send_lock = threading.Lock()
        self._parked: set[int] = set()  # tensors of ours in the local table, not taken yet

    def _is_cuda(self, value: Any) -> bool:
        return isinstance(value, self._tensor) and self._api.device(value).type == "cuda"

    # --- the writer --------------------------------------------------------------------------

    def export(self, payload: Any) -> Any:
        """``payload`` with its CUDA tensors swapped for refs (releases drained first).

        Raises :class:`RingClosed` when the boundary closes while it waits for a slot.
        """
        self.drain()
        exported = _map(payload, self._export_one, self._tensor)
        announce = self._announce
        if announce is not None:
            self._announce = None
            return PoolShared((announce, exported))
        return exported

    def _export_one(self, tensor: Any) -> Any:
        if not self._is_cuda(tensor):
            return tensor
        if self._local:
            with _local_lock:
                token = next(_local_ids)
                _local[token] = tensor
                self._parked.add(token)
            return LocalRef((token,))
        pool = self._pool
        if pool is None and self._api.available():
            pool = self._open_pool(tensor)
        ref = None if pool is None else pool.send(tensor)
        if ref is not None:
            return ref
        self._fallbacks += 1
        if self._fallbacks == 1 and pool is not None:
            nbytes = tensor.numel() * tensor.element_size()
            _log.warning(
                "cuda_pool_fallback",
                boundary=self._name,
                reason="a CUDA tensor does not fit the boundary's slot pool; it and any "
                "other that does not fit cross through the per-tensor bridge (counted in "
                "fallbacks, logged once)",
                nbytes=nbytes,
                device=str(self._api.device(tensor)),
                slot_bytes=pool.slot_bytes,
                pool_device=pool.device,
            )
        return self._exporter.export(tensor)

    def _open_pool(self, tensor: Any) -> CudaSlotPool[Any]:
        """The boundary's pool, made on ``tensor``'s device and sized for it (once)."""
        from rxstream.ipc._cuda import CudaSlotPool

        nbytes = tensor.numel() * tensor.element_size()
        slot_bytes = self._spec.slot_bytes
        if nbytes > slot_bytes:  # sized by the first item
            slot_bytes = -(-nbytes // _ROUND) * _ROUND
        device = self._api.device(tensor).index or 0
        pool: CudaSlotPool[Any] = CudaSlotPool(
            self._api, device, self._spec.slots + self._extra_slots, slot_bytes, self._wait_release
        )
        self._pool = pool
        self._announce = pool.share()
        _leases.setdefault(threading.get_ident(), self)  # this thread's stage may lease now
        return pool

    def lease(self, size: tuple[int, ...], dtype: Any, device: Any = None) -> Any:
        """A tensor in a free slot of this boundary's pool, or ``None`` (no pool, no room,
        another device than the pool's, or the boundary closed while it waited)."""
        pool = self._pool
        if pool is None or self._closed:
            return None
        if device is not None:
            wanted = self._torch_device(device)
            if wanted.type != "cuda" or (wanted.index or 0) != pool.device:
                return None
        self.drain()
        try:
            return pool.lease(size, dtype)
        except RingClosed:  # stopping: the stage gets a plain tensor, the writer drops it
            return None

    def empty(self, size: tuple[int, ...], dtype: Any) -> Any:
        """A new tensor on the pool's device, outside the pool (crosses by the bridge)."""
        pool = self._pool
        assert pool is not None
        nbytes = max(1, _nbytes(size, dtype))
        storage = self._api.allocate(pool.device, nbytes)
        return self._view(storage, dtype, 0, size, _contiguous(size))

    def drain(self) -> None:
        """Release every slot and storage the reader has given back."""
        while True:
            try:
                if not self._release_r.poll():
                    return
                message = self._release_r.recv()
            except (EOFError, OSError, ValueError):
                return
            if type(message) is int:
                self._exporter.release(message)
            else:
                kind, value = message
                pool = self._pool
                assert pool is not None, f"a {kind} message for a pool this side never made"
                if kind == "slot":
                    pool.release(value)
                else:  # "events": the reader's release events, once, before any slot
                    pool.open_returns(value)

    def _wait_release(self) -> None:
        """Block until the reader gives something back; :class:`RingClosed` once closed.

        The wait is the calling thread's stall (every slot in flight: the downstream's
        doing), not its work, and the run's watchdog sees it as such."""
        resume = stall_begins()
        started = time.perf_counter()
        try:
            while not self._closed:
                try:
                    if self._release_r.poll(_POLL_S):
                        self.drain()
                        return
                except (EOFError, OSError, ValueError):
                    break
            raise RingClosed(f"boundary {self._name!r} is closed")
        finally:
            resume()
            charge_stall(time.perf_counter() - started)

    @property
    def held(self) -> int:
        """Exported storages and pool slots the reader has not given back yet."""
        self.drain()
        pool = self._pool
        return self._exporter.pending() + (0 if pool is None else pool.in_flight())

    def statistics(self) -> CudaPoolStatistics:
        """The slot pool's counters as this side sees them (the writer's or the reader's)."""
        from rxstream.ipc._cuda import CudaPoolStatistics

        pool, reader = self._pool, self._reader
        side = pool if pool is not None else reader
        return CudaPoolStatistics(
            slots=0 if side is None else side.slots,
            slot_bytes=0 if side is None else side.slot_bytes,
            items=0 if pool is None else pool.items,
            zero_copy=0 if pool is None else pool.zero_copy,
            copies=0 if pool is None else pool.copies,
            fallbacks=self._fallbacks,
            copies_out=0 if reader is None else reader.copies_out,
            in_flight=0 if pool is None else pool.in_flight(),
            wait_s=0.0 if pool is None else pool.wait_ns / 1e9,
        )

    # --- the reader --------------------------------------------------------------------------

    def open(self, payload: Any) -> Any:
        """``payload`` with its refs opened as tensors over the producer's memory."""
        if type(payload) is PoolShared:
            share, payload = payload
            self._open_share(share)
        return _map(payload, self._open_one, self._refs)

    def _open_share(self, share: CudaPoolShare) -> None:
        from rxstream.ipc._cuda import CudaPoolReader

        reader: CudaPoolReader[Any] = CudaPoolReader(self._api, share, self._give_back_slot)
        self._reader = reader
        self._send(("events", reader.release_events))

    def _open_one(self, ref: Any) -> Any:
        if type(ref) is self._slot_ref:
            reader = self._reader
            assert reader is not None, "a slot ref before its pool's share"
            return reader.open(ref)
        if isinstance(ref, LocalRef):
            with _local_lock:
                self._parked.discard(ref[0])
                return _local.pop(ref[0])
        tensor = self._importer.open(ref)
        weakref.finalize(tensor, self._give_back, ref)
        return tensor

    def _give_back(self, ref: CudaTensorRef) -> None:
        self._send(self._importer.done(ref))

    def _give_back_slot(self, slot: int) -> None:
        self._send(("slot", slot))

    def _send(self, message: Any) -> None:
        # the writer's side may be gone: then it dropped everything already
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self._release_w.send(message)

    def close(self) -> None:
        """Drop every hold and close the release pipe (at the end of the run)."""
        self._closed = True
        for thread, crossing in list(_leases.items()):
            if crossing is self:
                _leases.pop(thread, None)
        with _local_lock:  # tensors parked for a reader that stopped: let them go
            for token in self._parked:
                _local.pop(token, None)
            self._parked.clear()
        self._exporter.close()
        self._importer.close()
        if self._pool is not None:
            self._pool.close()
        if self._reader is not None:
            self._reader.close()
        self._release_r.close()
        self._release_w.close()


def _contiguous(size: Sequence[int]) -> tuple[int, ...]:
    from rxstream.ipc._cudaapi import contiguous

    return contiguous(size)


def _nbytes(size: Sequence[int], dtype: Any) -> int:
    from rxstream.ipc._cudaapi import nbytes

    return nbytes(size, dtype)
