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

Limits: a tensor the consumer received cannot be exported again (torch refuses; clone it first);
tensors with the conjugate or negative bit, sparse and nested tensors are not supported.

`TorchCuda` is the real `CudaApi`; `FakeCudaApi` simulates one in a single process, for tests on
machines without CUDA (``bench/gpu_ipc.py`` checks the real one on a GPU).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Hashable, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np
import torch

from rxstream._exceptions import CudaDeviceError, CudaRefError, CudaUnavailableError

__all__ = [
    "CudaApi",
    "CudaExporter",
    "CudaImporter",
    "CudaTensorRef",
    "FakeCudaApi",
    "TorchCuda",
]

StorageT = TypeVar("StorageT")
EventT = TypeVar("EventT")

StorageHandle = tuple[Any, ...]
"""What `CudaApi.share` returns: picklable, opaque to the bridge."""

_DTYPES: dict[str, torch.dtype] = {
    str(value).removeprefix("torch."): value
    for value in vars(torch).values()
    if isinstance(value, torch.dtype)
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


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


class CudaApi(Protocol[StorageT, EventT]):
    """The CUDA calls the bridge makes, and nothing else; `TorchCuda` makes them for real."""

    def available(self) -> bool:
        """Whether CUDA can be used in this process."""
        ...

    def device(self, tensor: torch.Tensor) -> torch.device:
        """The device the tensor's memory is on."""
        ...

    def storage(self, tensor: torch.Tensor) -> StorageT:
        """The storage under the tensor: what the exporter keeps alive."""
        ...

    def share(self, storage: StorageT) -> StorageHandle:
        """An IPC handle for the storage's memory, to open in another process."""
        ...

    def handle_key(self, handle: StorageHandle) -> Hashable:
        """What a handle opens: equal keys open the same bytes (the importer's cache key)."""
        ...

    def open(self, device: int, handle: StorageHandle) -> StorageT:
        """Map the memory a handle names into this process, as a storage."""
        ...

    def release_handle(self, handle: StorageHandle) -> None:
        """Give back what a handle holds without opening it (torch: its share's IPC count)."""
        ...

    def record_event(self, device: int) -> EventT:
        """A new interprocess event, recorded on the device's current stream."""
        ...

    def event_handle(self, event: EventT) -> bytes:
        """The IPC handle of an event."""
        ...

    def open_event(self, device: int, handle: bytes) -> EventT:
        """An event of another process, from its IPC handle."""
        ...

    def wait_event(self, device: int, event: EventT) -> None:
        """Make the device's current stream wait for the event (the host does not wait)."""
        ...

    def view(
        self,
        storage: StorageT,
        dtype: torch.dtype,
        offset: int,
        size: Sequence[int],
        stride: Sequence[int],
    ) -> torch.Tensor:
        """A tensor over the storage, with that dtype, offset, size and stride."""
        ...


def _describe(dtype: torch.dtype, size: Sequence[int], device: object) -> str:
    return f"{_DTYPE_NAMES[dtype]} tensor of shape {tuple(size)} on {device}"


def _view(
    storage: torch.UntypedStorage,
    dtype: torch.dtype,
    offset: int,
    size: Sequence[int],
    stride: Sequence[int],
) -> torch.Tensor:
    return torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


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
                f"shared-memory ring), got a {_describe(tensor.dtype, tensor.shape, device)}"
            )
        if not self._available:
            raise CudaUnavailableError(
                f"cannot export a {_describe(tensor.dtype, tensor.shape, device)}: "
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
            _DTYPE_NAMES[tensor.dtype],
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
                f"{_describe(_DTYPES[ref.dtype], ref.size, f'cuda:{ref.device}')}): "
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
        return api.view(storage, _DTYPES[ref.dtype], ref.offset, ref.size, ref.stride)

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


class TorchCuda:
    """The real `CudaApi`: the calls ``torch.multiprocessing`` makes to share CUDA tensors.

    A handle is the tuple of ``UntypedStorage._share_cuda_()``: device, the allocation's
    ``cudaIpcMemHandle``, the storage's size and offset in it (bytes), torch's reference counter
    (file and slot) and torch's own event. The bridge orders the consumer by its own event, so
    `open` does not wait on torch's. These torch entry points are untyped, hence the ignores.
    """

    def available(self) -> bool:
        return torch.cuda.is_available()

    def device(self, tensor: torch.Tensor) -> torch.device:
        return tensor.device

    def storage(self, tensor: torch.Tensor) -> torch.UntypedStorage:
        return tensor.untyped_storage()

    def share(self, storage: torch.UntypedStorage) -> StorageHandle:
        return tuple(storage._share_cuda_())  # type: ignore[no-untyped-call]

    def handle_key(self, handle: StorageHandle) -> Hashable:
        return (handle[1], handle[3], handle[2])

    def open(self, device: int, handle: StorageHandle) -> torch.UntypedStorage:
        _, memory, size, offset, counter, counter_offset, event, _ = handle
        if memory is None or not size:  # an empty storage has no allocation to share
            return torch.empty(0, dtype=torch.uint8, device=f"cuda:{device}").untyped_storage()
        torch.cuda.init()  # type: ignore[no-untyped-call]
        return torch.UntypedStorage._new_shared_cuda(
            device, memory, size, offset, counter, counter_offset, event, False
        )

    def release_handle(self, handle: StorageHandle) -> None:
        _, memory, size, _, counter, counter_offset, _, _ = handle
        if memory is not None and size:
            torch.UntypedStorage._release_ipc_counter_cuda(counter, counter_offset)

    def record_event(self, device: int) -> torch.cuda.Event:
        event = torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(device))
        return event

    def event_handle(self, event: torch.cuda.Event) -> bytes:
        handle: bytes = event.ipc_handle()  # type: ignore[no-untyped-call]
        return handle

    def open_event(self, device: int, handle: bytes) -> torch.cuda.Event:
        torch.cuda.init()  # type: ignore[no-untyped-call]  # the consumer's first CUDA call
        event: torch.cuda.Event = torch.cuda.Event.from_ipc_handle(  # type: ignore[no-untyped-call]
            torch.device("cuda", device), handle
        )
        return event

    def wait_event(self, device: int, event: torch.cuda.Event) -> None:
        torch.cuda.current_stream(device).wait_event(event)

    def view(
        self,
        storage: torch.UntypedStorage,
        dtype: torch.dtype,
        offset: int,
        size: Sequence[int],
        stride: Sequence[int],
    ) -> torch.Tensor:
        return _view(storage, dtype, offset, size, stride)


class FakeEvent:
    """An event of `FakeCudaApi`: its handle and the producer stream step it marks."""

    __slots__ = ("handle", "step")

    def __init__(self, handle: bytes, step: int) -> None:
        self.handle = handle
        self.step = step


class FakeCudaApi:
    """A `CudaApi` without CUDA, in one process, that checks how the bridge uses it.

    "Device memory" is numpy buffers: `to_device` copies a CPU tensor into one and returns a CPU
    tensor over it that this api reports on ``cuda:<device>``; ``open`` maps the buffer again
    (a second storage over the same bytes, as CUDA maps an allocation in the consumer).
    ``log`` records every call as ``(call, handle)``, in order. Like CUDA, opening a handle that
    is still open in the process fails, and so does opening memory its producer freed. One
    producer stream and one consumer stream are simulated: `launch` marks producer work on a
    tensor, an event marks the producer's step, a wait moves the consumer's stream up to it, and
    `view` (the consumer's read) raises ``AssertionError`` unless the consumer's stream has waited
    for the last producer work on that memory.
    """

    def __init__(self, *, available: bool = True, device: int = 0) -> None:
        self.log: list[tuple[str, str]] = []
        self._available = available
        self._device = torch.device("cuda", device)
        self._serial = itertools.count(1)
        self._handles: dict[int, tuple[bytes, weakref.ref[torch.UntypedStorage]]] = {}
        self._buffers: dict[bytes, weakref.ref[np.ndarray[Any, Any]]] = {}
        self._mapped: dict[bytes, weakref.ref[torch.UntypedStorage]] = {}
        self._written: dict[bytes, int] = {}
        self._events: dict[bytes, FakeEvent] = {}
        self._step = 0
        self._waited = 0

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of ``tensor`` in fake device memory (contiguous), written by a `launch`."""
        buffer = np.zeros(tensor.numel() * tensor.element_size(), np.uint8)
        fake = torch.from_numpy(buffer).view(tensor.dtype).view(tensor.shape)
        fake.copy_(tensor)
        storage = fake.untyped_storage()
        handle = f"mem-{next(self._serial)}".encode()
        self._handles[storage.data_ptr()] = (handle, weakref.ref(storage))
        self._buffers[handle] = weakref.ref(buffer)
        self.launch(fake)
        return fake

    def launch(self, tensor: torch.Tensor) -> None:
        """Record producer work on the current stream that writes ``tensor``."""
        handle = self._handle(tensor.untyped_storage())
        self._step += 1
        self._written[handle] = self._step
        self.log.append(("launch", handle.decode()))

    def _handle(self, storage: torch.UntypedStorage) -> bytes:
        handle, _ = self._handles[storage.data_ptr()]
        return handle

    def available(self) -> bool:
        return self._available

    def device(self, tensor: torch.Tensor) -> torch.device:
        storage = tensor.untyped_storage()
        entry = self._handles.get(storage.data_ptr())
        return self._device if entry is not None and entry[1]() is storage else tensor.device

    def storage(self, tensor: torch.Tensor) -> torch.UntypedStorage:
        return tensor.untyped_storage()

    def share(self, storage: torch.UntypedStorage) -> StorageHandle:
        handle = self._handle(storage)
        self.log.append(("share", handle.decode()))
        return (handle, storage.nbytes())

    def handle_key(self, handle: StorageHandle) -> Hashable:
        key: bytes = handle[0]
        return key

    def open(self, device: int, handle: StorageHandle) -> torch.UntypedStorage:
        key: bytes = handle[0]
        mapped = self._mapped.get(key)
        if mapped is not None and mapped() is not None:
            raise AssertionError(
                f"fake CUDA memory {key.decode()} is already open in this process "
                "(CUDA refuses to open one IPC handle twice)"
            )
        buffer = self._buffers[key]()
        if buffer is None:
            raise AssertionError(f"fake CUDA memory {key.decode()} was freed by its producer")
        storage = torch.from_numpy(buffer[:]).untyped_storage()
        self._mapped[key] = weakref.ref(storage)
        self.log.append(("open", key.decode()))
        return storage

    def release_handle(self, handle: StorageHandle) -> None:
        key: bytes = handle[0]
        self.log.append(("release_handle", key.decode()))

    def record_event(self, device: int) -> FakeEvent:
        event = FakeEvent(f"event-{next(self._serial)}".encode(), self._step)
        self._events[event.handle] = event
        self.log.append(("record", event.handle.decode()))
        return event

    def event_handle(self, event: FakeEvent) -> bytes:
        return event.handle

    def open_event(self, device: int, handle: bytes) -> FakeEvent:
        self.log.append(("open_event", handle.decode()))
        return self._events[handle]

    def wait_event(self, device: int, event: FakeEvent) -> None:
        self._waited = max(self._waited, event.step)
        self.log.append(("wait", event.handle.decode()))

    def view(
        self,
        storage: torch.UntypedStorage,
        dtype: torch.dtype,
        offset: int,
        size: Sequence[int],
        stride: Sequence[int],
    ) -> torch.Tensor:
        handle = self._handle(storage)
        written = self._written[handle]
        if self._waited < written:
            raise AssertionError(
                f"read of fake CUDA memory {handle.decode()} before the consumer's stream "
                f"waited for the work that wrote it (written at step {written}, "
                f"waited up to step {self._waited})"
            )
        self.log.append(("read", handle.decode()))
        return _view(storage, dtype, offset, size, stride)
