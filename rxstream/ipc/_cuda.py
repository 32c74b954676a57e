"""The CUDA IPC bridge: CUDA tensors cross between processes of one host without a copy.

One boundary has one exporter (producer process) and one importer (consumer process); the
runtime carries the refs and the release ids over its own channel::

    producer                                   consumer
    ref = exporter.export(tensor)  -- ref -->  tensor = importer.open(ref)
                                               ... the consuming stage uses tensor ...
    exporter.release(ref_id)  <-- ref_id ----  ref_id = importer.done(ref)
                                               (or importer.discard(ref), never opened)

- **No copy.** A `CudaTensorRef` names the tensor's storage by its CUDA IPC handle; the
  importer maps that allocation and rebuilds the same view (offset, size, stride, dtype) over it.
- **Ordering.** ``export`` records an interprocess event on the producer's current stream, after
  the work that wrote the tensor (work on another stream must be ordered before it by the
  caller); ``open`` makes the consumer's current stream wait on that event before it returns the
  tensor. Neither side blocks the host.
- **Lifetime.** The exporter holds the storage and the event from ``export`` until
  ``release(ref_id)``, so the producer may drop its tensor at once. Beneath that, torch's IPC
  reference count keeps the block out of the producer's caching allocator while any consumer
  storage built on it lives, and the consumer's storage synchronises its stream when freed.
  torch counts every export until the consumer's storage dies, so a ref the consumer drops
  unopened must be given back with ``discard`` (which also returns the id to release); a
  consumer that dies leaves its counts, and the producer's blocks stay allocated until it exits.
- **One open per allocation.** The importer caches opened storages by handle (opening one handle
  twice in a process fails in CUDA) and drops a storage at its last ``done``.

The slot pool (`CudaSlotPool` / `CudaPoolReader`, ``_cudapool.py``) is the same idea shared
once instead of per tensor; `TorchCuda` (``_cudaapi.py``) is the real `CudaApi` and
`FakeCudaApi` (``_cudafake.py``) simulates one in a single process, for tests on machines
without CUDA (``bench/gpu_ipc.py`` checks the real one on a GPU). This module hands on all of
the bridge's names.

Limits: a tensor the consumer received cannot be exported again (torch refuses; clone it first);
tensors with the conjugate or negative bit, sparse and nested tensors are not supported.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Generic, NamedTuple

import torch

from rxstream._exceptions import CudaDeviceError, CudaRefError, CudaUnavailableError
from rxstream.ipc._cudaapi import (
    DTYPE_NAMES,
    DTYPES,
    CudaApi,
    EventT,
    StorageHandle,
    StorageT,
    TorchCuda,
    describe,
)
from rxstream.ipc._cudafake import FakeCudaApi
from rxstream.ipc._cudapool import (
    CudaPoolReader,
    CudaPoolShare,
    CudaPoolStatistics,
    CudaSlotPool,
    CudaSlotRef,
)

__all__ = [
    "CudaApi",
    "CudaExporter",
    "CudaImporter",
    "CudaPoolReader",
    "CudaPoolShare",
    "CudaPoolStatistics",
    "CudaSlotPool",
    "CudaSlotRef",
    "CudaTensorRef",
    "FakeCudaApi",
    "TorchCuda",
]


class CudaTensorRef(NamedTuple):
    """A CUDA tensor as it crosses a process boundary: picklable, a few hundred bytes."""

    ref_id: int
    """The exporter's id for this export; the consumer sends it back to release the storage."""
    device: int
    """The CUDA device index of the storage."""
    storage: StorageHandle
    """The storage's IPC handle, as `CudaApi.share` made it."""
    offset: int
    """The tensor's offset in its storage, in elements."""
    size: tuple[int, ...]
    """The tensor's shape."""
    stride: tuple[int, ...]
    """The tensor's strides, in elements."""
    dtype: str
    """The dtype's name in ``torch`` (``"float16"``)."""
    event: bytes
    """The IPC handle of the event recorded after the producer's work on the tensor."""


class CudaExporter(Generic[StorageT, EventT]):
    """The producer's side: exports CUDA tensors as refs and holds them until released."""

    def __init__(self, api: CudaApi[StorageT, EventT]) -> None:
        self._api = api
        self._available = api.available()
        self._held: dict[int, tuple[StorageT, EventT]] = {}
        self._ids = itertools.count(1)

    def export(self, tensor: torch.Tensor) -> CudaTensorRef:
        """A ref to ``tensor``, ordered after the work queued so far on the current stream."""
        api = self._api
        device = api.device(tensor)
        if device.type != "cuda":
            raise CudaDeviceError(
                "export takes a tensor on a CUDA device (CPU tensors cross through the "
                f"shared-memory ring), got a {describe(tensor.dtype, tensor.shape, device)}"
            )
        if not self._available:
            raise CudaUnavailableError(
                f"cannot export a {describe(tensor.dtype, tensor.shape, device)}: "
                "CUDA is not available in this process"
            )
        index = device.index or 0
        storage = api.storage(tensor)
        handle = api.share(storage)
        event = api.record_event(index)
        ref_id = next(self._ids)
        self._held[ref_id] = (storage, event)
        return CudaTensorRef(
            ref_id,
            index,
            handle,
            int(tensor.storage_offset()),
            tuple(tensor.shape),
            tensor.stride(),
            DTYPE_NAMES[tensor.dtype],
            api.event_handle(event),
        )

    def release(self, ref_id: int) -> None:
        """Drop the hold on an exported storage: the consumer is done with it."""
        try:
            del self._held[ref_id]
        except KeyError:
            raise CudaRefError(
                "release takes a ref id this exporter holds (exported, not yet released), "
                f"got {ref_id}; it holds {len(self._held)}"
            ) from None

    def pending(self) -> int:
        """How many exported refs are not released yet."""
        return len(self._held)

    def close(self) -> None:
        """Drop every hold (the consumer is gone); torch's IPC count still guards open ones."""
        self._held.clear()


class CudaImporter(Generic[StorageT, EventT]):
    """The consumer's side: opens refs as tensors over the producer's memory."""

    def __init__(self, api: CudaApi[StorageT, EventT]) -> None:
        self._api = api
        self._available = api.available()
        self._storages: dict[Hashable, StorageT] = {}
        self._users: dict[Hashable, int] = {}
        self._open: dict[int, Hashable] = {}

    def open(self, ref: CudaTensorRef) -> torch.Tensor:
        """The tensor ``ref`` names; work queued after this on the current stream sees its data."""
        if not self._available:
            raise CudaUnavailableError(
                f"cannot open CUDA tensor ref {ref.ref_id} (a "
                f"{describe(DTYPES[ref.dtype], ref.size, f'cuda:{ref.device}')}): "
                "CUDA is not available in this process"
            )
        if ref.ref_id in self._open:
            raise CudaRefError(
                f"open takes a ref that is not open here (done(ref) first), got ref id {ref.ref_id}"
            )
        api = self._api
        api.wait_event(ref.device, api.open_event(ref.device, ref.event))
        key = api.handle_key(ref.storage)
        storage = self._storages.get(key)
        if storage is None:
            storage = self._storages[key] = api.open(ref.device, ref.storage)
            self._users[key] = 1
        else:
            api.release_handle(ref.storage)
            self._users[key] += 1
        self._open[ref.ref_id] = key
        return api.view(storage, DTYPES[ref.dtype], ref.offset, ref.size, ref.stride)

    def done(self, ref: CudaTensorRef) -> int:
        """Forget an opened ref; returns its id, for the producer's `CudaExporter.release`."""
        key = self._open.pop(ref.ref_id, None)
        if key is None:
            raise CudaRefError(
                "done takes a ref this importer opened and is not done with, "
                f"got ref id {ref.ref_id}"
            )
        users = self._users[key] - 1
        if users:
            self._users[key] = users
        else:
            del self._users[key], self._storages[key]
        return ref.ref_id

    def discard(self, ref: CudaTensorRef) -> int:
        """Give back a ref without opening it (a dropped item); returns its id for release.

        Every ref the consumer receives ends in ``done`` or ``discard``: torch counts each export
        as a consumer until then, and keeps the producer's block out of its allocator (leaked)
        while any count is left.
        """
        if ref.ref_id in self._open:
            raise CudaRefError(
                "discard takes a ref that is not open here (done(ref) for an opened one), "
                f"got ref id {ref.ref_id}"
            )
        self._api.release_handle(ref.storage)
        return ref.ref_id

    def pending(self) -> int:
        """How many opened refs are not done yet."""
        return len(self._open)

    def close(self) -> None:
        """Forget every opened ref and cached storage."""
        self._open.clear()
        self._users.clear()
        self._storages.clear()
