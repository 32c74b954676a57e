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

**The slot pool** (`CudaSlotPool` / `CudaPoolReader`) is the same idea shared once instead of
per tensor: the producer allocates N slots and one interprocess event per slot, the consumer
opens them once (`CudaPoolShare`), and per item only a `CudaSlotRef` (slot, offset, size,
stride, dtype) crosses::

    producer                                        consumer
    pool = CudaSlotPool(api, device, n, bytes)
    share = pool.share()          -- share, once -> reader = CudaPoolReader(api, share, back)
    pool.open_returns(handles)    <- its release events, once -- reader.release_events
    ref = pool.send(tensor)       -- ref -->        tensor = reader.open(ref)
    pool.release(slot)            <- slot --        (the last view of tensor is gone: back(slot))

``send`` recognises a tensor that `lease` handed out (by its storage's ``data_ptr``) and sends
it as it is; any other CUDA tensor is copied into a free slot (one device-to-device copy), and
one larger than a slot is refused (``None``: the caller uses the per-tensor bridge). Ordering
goes both ways on the GPU, the host never waits: the slot's event, recorded after the
producer's writes, orders the consumer's reads; the consumer's release event for the slot,
recorded when its last view is gone, orders the producer's next writes into it. A slot is
reused only once the consumer released it and no producer view of it lives; on the consumer,
every view of an item (a crop, a reshape) keeps its slot.

Limits: a tensor the consumer received cannot be exported again (torch refuses; clone it first);
tensors with the conjugate or negative bit, sparse and nested tensors are not supported.

`TorchCuda` is the real `CudaApi`; `FakeCudaApi` simulates one in a single process, for tests on
machines without CUDA (``bench/gpu_ipc.py`` checks the real one on a GPU).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np
import torch

from rxstream._exceptions import ArgumentError, CudaDeviceError, CudaRefError, CudaUnavailableError

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


class CudaPoolShare(NamedTuple):
    """A slot pool as its consumer opens it, once: every slot's memory and event handle."""

    device: int
    """The CUDA device index of the slots."""
    slot_bytes: int
    """The size of each slot, in bytes."""
    storages: tuple[StorageHandle, ...]
    """Each slot's IPC handle, as `CudaApi.share` made it."""
    events: tuple[bytes, ...]
    """Each slot's event's IPC handle: recorded after the producer's writes into the slot."""


class CudaSlotRef(NamedTuple):
    """A tensor in a pool slot, as it crosses for one item: a few dozen bytes, no handle."""

    slot: int
    """The slot's index in the pool."""
    offset: int
    """The tensor's offset in the slot, in elements."""
    size: tuple[int, ...]
    """The tensor's shape."""
    stride: tuple[int, ...]
    """The tensor's strides, in elements."""
    dtype: str
    """The dtype's name in ``torch`` (``"float16"``)."""


@dataclass(frozen=True)
class CudaPoolStatistics:
    """A CUDA boundary's slot pool at one moment, as one side sees it (zeros: no pool yet)."""

    slots: int
    """How many slots the pool has."""
    slot_bytes: int
    """The size of each slot, in bytes."""
    items: int
    """Tensors the producer sent through the pool."""
    zero_copy: int
    """Of those, tensors produced straight into a slot (a lease): no copy at all."""
    copies: int
    """Of those, tensors the producer copied into a slot (one device-to-device copy each)."""
    fallbacks: int
    """CUDA tensors sent through the per-tensor bridge instead (larger than a slot, on another
    device, or every slot held by the producer's own leases)."""
    copies_out: int
    """Tensors the consumer copied out of their slot because its views held every slot."""
    in_flight: int
    """Slots sent and not yet released by the consumer (the producer's count)."""
    wait_s: float
    """Seconds the producer waited for a slot to come back (backpressure)."""


class CudaApi(Protocol[StorageT, EventT]):
    """The CUDA calls the bridge makes, and nothing else; `TorchCuda` makes them for real."""

    local_refs: bool
    """Whether a tensor crossing within one process may pass as a reference to itself (real
    CUDA cannot open its own IPC handle; a fake checks the IPC path, so it says no)."""

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

    # --- the slot pool ----------------------------------------------------------------------

    def allocate(self, device: int, nbytes: int) -> StorageT:
        """A new allocation of ``nbytes`` on the device (a pool slot), as a storage."""
        ...

    def new_event(self, device: int) -> EventT:
        """A new interprocess event on the device, not recorded yet (its handle can be taken)."""
        ...

    def record(self, device: int, event: EventT) -> None:
        """Record ``event`` again, on the producer's current stream (after its writes)."""
        ...

    def record_release(self, device: int, event: EventT) -> None:
        """Record ``event`` again, on the consumer's current stream (after its reads)."""
        ...

    def wait_release(self, device: int, event: EventT) -> None:
        """Make the producer's current stream wait for the consumer's release ``event``."""
        ...

    def copy(self, target: torch.Tensor, source: torch.Tensor) -> None:
        """Copy ``source`` into ``target`` on the producer's current stream (device to device)."""
        ...

    def alias(self, storage: StorageT) -> tuple[StorageT, object]:
        """A new storage over the same memory, and its keeper: an object that lives as long
        as any tensor over that new storage does (watch it with ``weakref.finalize``); it
        keeps ``storage`` alive meanwhile."""
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


def _contiguous(size: Sequence[int]) -> tuple[int, ...]:
    """The strides of a C-contiguous tensor of ``size``, in elements."""
    strides = []
    step = 1
    for extent in reversed(size):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _nbytes(size: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(size) * dtype.itemsize


class CudaSlotPool(Generic[EventT]):
    """The producer's side of a slot pool: ``slots`` allocations of ``slot_bytes`` on one device,
    shared once (`share`) and reused for every item.

    ``wait`` is called when no slot is free and some are in flight: it blocks until the consumer
    may have given one back (the caller then feeds `release`), or raises to give up. A slot is
    free once the consumer released it (`release`) and no producer view of it lives (a `lease`
    or a view of one).
    """

    def __init__(
        self,
        api: CudaApi[torch.UntypedStorage, EventT],
        device: int,
        slots: int,
        slot_bytes: int,
        wait: Callable[[], None],
    ) -> None:
        for name, value in (("slots", slots), ("slot_bytes", slot_bytes)):
            if value < 1:
                raise ArgumentError(f"{name} must be >= 1, got {value}")
        self._api = api
        self.device = device
        """The CUDA device index of the slots."""
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._wait = wait
        self._storages = [api.allocate(device, slot_bytes) for _ in range(slots)]
        self._events = [api.new_event(device) for _ in range(slots)]
        self._share = CudaPoolShare(
            device,
            slot_bytes,
            tuple(api.share(storage) for storage in self._storages),
            tuple(api.event_handle(event) for event in self._events),
        )
        self._slot_of = {storage.data_ptr(): k for k, storage in enumerate(self._storages)}
        self._returns: list[EventT | None] = [None] * slots
        self._lock = threading.RLock()  # a finalizer may run on a thread that holds it
        self._free: deque[int] = deque(range(slots))
        self._leased = [False] * slots  # a producer view of the slot lives
        self._sent = [False] * slots  # sent, not released by the consumer yet
        self._read = [False] * slots  # released by the consumer at least once
        self._closed = False
        self.items = self.zero_copy = self.copies = 0
        self.wait_ns = 0

    def share(self) -> CudaPoolShare:
        """What the consumer opens, once: the slots' memory and event handles."""
        return self._share

    def open_returns(self, handles: Sequence[bytes]) -> None:
        """Open the consumer's release events, one per slot (once, before its first release)."""
        if len(handles) != self.slots:
            raise CudaRefError(
                f"open_returns takes one release event per slot ({self.slots}), got {len(handles)}"
            )
        self._returns = [self._api.open_event(self.device, handle) for handle in handles]

    def lease(self, size: Sequence[int], dtype: torch.dtype) -> torch.Tensor | None:
        """An empty contiguous tensor in a free slot, for a stage to produce into; ``None``
        when it does not fit a slot or every slot is held by the producer's own leases.

        Blocks while every slot is in flight. `send` recognises the tensor (or a view of it)
        and sends it without a copy; the slot comes back when it is released and no view of
        the lease lives, or at once when the lease dies unsent.
        """
        if _nbytes(size, dtype) > self.slot_bytes:
            return None
        slot = self._take(self._leased)
        if slot is None:
            return None
        alias, keeper = self._api.alias(self._storages[slot])
        weakref.finalize(keeper, self._lease_gone, slot).atexit = False
        return _view(alias, dtype, 0, size, _contiguous(size))

    def send(self, tensor: torch.Tensor) -> CudaSlotRef | None:
        """A ref to ``tensor`` in a slot, ordered after the producer's queued work; ``None``
        when it cannot go through the pool (larger than a slot, on another device, or every
        slot held by the producer's own leases).

        A tensor over a lease that is not in flight goes as it is (zero copy); any other is
        copied into a free slot (blocks while every slot is in flight).
        """
        api = self._api
        dtype = _DTYPE_NAMES[tensor.dtype]
        slot = self._slot_of.get(tensor.untyped_storage().data_ptr())
        if slot is not None:
            with self._lock:
                mine = self._leased[slot] and not self._sent[slot]
                if mine:
                    self._sent[slot] = True
            if mine:
                api.record(self.device, self._events[slot])
                self.items += 1
                self.zero_copy += 1
                return CudaSlotRef(
                    slot,
                    int(tensor.storage_offset()),
                    tuple(tensor.shape),
                    tensor.stride(),
                    dtype,
                )
        size = tuple(tensor.shape)
        if (api.device(tensor).index or 0) != self.device or _nbytes(
            size, tensor.dtype
        ) > self.slot_bytes:
            return None
        slot = self._take(self._sent)
        if slot is None:
            return None
        stride = _contiguous(size)
        api.copy(_view(self._storages[slot], tensor.dtype, 0, size, stride), tensor)
        api.record(self.device, self._events[slot])
        self.items += 1
        self.copies += 1
        return CudaSlotRef(slot, 0, size, stride, dtype)

    def release(self, slot: int) -> None:
        """The consumer is done with ``slot`` (its release event is recorded)."""
        with self._lock:
            if not 0 <= slot < self.slots or not self._sent[slot]:
                raise CudaRefError(
                    f"release takes a slot this pool sent and is not released yet, got {slot}; "
                    f"{self.in_flight()} of {self.slots} are in flight"
                )
            self._sent[slot] = False
            self._read[slot] = True
            if not self._leased[slot]:
                self._free.append(slot)

    def in_flight(self) -> int:
        """How many slots are sent and not released yet."""
        return sum(self._sent)

    def close(self) -> None:
        """Drop the slots (the views that live keep their memory)."""
        with self._lock:
            self._closed = True
            self._free.clear()
        self._storages = []

    def _take(self, flags: list[bool]) -> int | None:
        """A free slot, flagged (leased or sent); waits while every slot is in flight.

        ``None`` when none is free and none is in flight: nothing will come back.
        """
        started = 0.0
        while True:
            with self._lock:
                if self._free:
                    slot = self._free.popleft()
                    flags[slot] = True
                    break
                if not any(self._sent):
                    return None
            if not started:
                started = time.perf_counter()
            self._wait()
        if started:
            self.wait_ns += int((time.perf_counter() - started) * 1e9)
        back = self._returns[slot]
        if back is not None and self._read[slot]:  # our next writes after the consumer's reads
            self._api.wait_release(self.device, back)
        return slot

    def _lease_gone(self, slot: int) -> None:
        """The last view of a lease is gone (any thread): free the slot unless it is in flight."""
        with self._lock:
            self._leased[slot] = False
            if not self._sent[slot] and not self._closed:
                self._free.append(slot)


class CudaPoolReader(Generic[EventT]):
    """The consumer's side of a slot pool: opens every slot once, then each item in place.

    ``give_back(slot)`` is called (on whichever thread drops it) once the last view of an
    item's tensor is gone, after the slot's release event was recorded on this side's stream;
    the caller carries the slot index to the producer's `CudaSlotPool.release`.
    """

    def __init__(
        self,
        api: CudaApi[torch.UntypedStorage, EventT],
        share: CudaPoolShare,
        give_back: Callable[[int], None],
    ) -> None:
        if not api.available():
            raise CudaUnavailableError(
                f"cannot open a CUDA slot pool of {len(share.storages)} slots on "
                f"cuda:{share.device}: CUDA is not available in this process"
            )
        self._api = api
        self.device = share.device
        self.slots = len(share.storages)
        self.slot_bytes = share.slot_bytes
        self._give_back = give_back
        self._storages = [api.open(share.device, handle) for handle in share.storages]
        self._events = [api.open_event(share.device, handle) for handle in share.events]
        self._returns = [api.new_event(share.device) for _ in share.storages]
        self.release_events = tuple(api.event_handle(event) for event in self._returns)
        """The handles `CudaSlotPool.open_returns` takes: send them before any release."""
        self._lock = threading.Lock()
        self._held = [False] * self.slots
        self._leased = 0
        self.items = self.copies_out = 0

    def open(self, ref: CudaSlotRef) -> torch.Tensor:
        """The tensor ``ref`` names, in place; work queued after this on the current stream
        sees the producer's data. The slot goes back once every view of the tensor is gone.

        When this item's slot is the last one not held by views here, the tensor is copied out
        of it (one device copy) and the slot goes back at once: a downstream that keeps every
        item cannot stall the producer.
        """
        slot = ref.slot
        with self._lock:
            if not 0 <= slot < self.slots or self._held[slot]:
                raise CudaRefError(
                    f"open takes a slot ref whose slot is not held here, got slot {slot} of "
                    f"{self.slots} (a slot is reused only after its release)"
                )
            self._held[slot] = True
            self._leased += 1
            last = self._leased == self.slots
        api = self._api
        try:
            api.wait_event(self.device, self._events[slot])
            alias, keeper = api.alias(self._storages[slot])
            tensor = api.view(alias, _DTYPES[ref.dtype], ref.offset, ref.size, ref.stride)
        except BaseException:
            with self._lock:
                self._held[slot] = False
                self._leased -= 1
            raise
        weakref.finalize(keeper, self._done, slot).atexit = False
        del alias, keeper
        self.items += 1
        if last:
            self.copies_out += 1
            tensor = tensor.clone()  # the view dies here: the slot goes back
        return tensor

    def pending(self) -> int:
        """How many slots views here hold."""
        return self._leased

    def close(self) -> None:
        """Forget the opened slots (views that live keep their memory)."""
        self._storages = []

    def _done(self, slot: int) -> None:
        self._api.record_release(self.device, self._returns[slot])
        with self._lock:
            self._held[slot] = False
            self._leased -= 1
        self._give_back(slot)


class TorchCuda:
    """The real `CudaApi`: the calls ``torch.multiprocessing`` makes to share CUDA tensors.

    A handle is the tuple of ``UntypedStorage._share_cuda_()``: device, the allocation's
    ``cudaIpcMemHandle``, the storage's size and offset in it (bytes), torch's reference counter
    (file and slot) and torch's own event. The bridge orders the consumer by its own event, so
    `open` does not wait on torch's. These torch entry points are untyped, hence the ignores.
    """

    local_refs = True

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

    def allocate(self, device: int, nbytes: int) -> torch.UntypedStorage:
        return torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}").untyped_storage()

    def new_event(self, device: int) -> torch.cuda.Event:
        with torch.cuda.device(device):
            event = torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]
            event.ipc_handle()  # type: ignore[no-untyped-call]  # makes the CUDA event, here
        return event

    def record(self, device: int, event: torch.cuda.Event) -> None:
        event.record(torch.cuda.current_stream(device))

    def record_release(self, device: int, event: torch.cuda.Event) -> None:
        event.record(torch.cuda.current_stream(device))

    def wait_release(self, device: int, event: torch.cuda.Event) -> None:
        torch.cuda.current_stream(device).wait_event(event)

    def copy(self, target: torch.Tensor, source: torch.Tensor) -> None:
        target.copy_(source)

    def alias(self, storage: torch.UntypedStorage) -> tuple[torch.UntypedStorage, object]:
        # torch keeps an object with __cuda_array_interface__ alive until the storage it made
        # over that memory is freed, i.e. until every view of it is gone
        keeper = _Keeper(storage, "__cuda_array_interface__")
        flat = torch.as_tensor(keeper, device=storage.device)
        return flat.untyped_storage(), keeper


class _Keeper:
    """An array interface over a storage's memory (bytes), which holds the storage."""

    __slots__ = ("__array_interface__", "__cuda_array_interface__", "__weakref__", "storage")

    def __init__(self, storage: torch.UntypedStorage, interface: str) -> None:
        self.storage = storage
        description = {
            "shape": (storage.nbytes(),),
            "typestr": "|u1",
            "data": (storage.data_ptr(), False),
            "version": 3 if interface == "__array_interface__" else 2,
        }
        setattr(self, interface, description)


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

    The slot pool's calls follow the same model, both ways: ``allocate`` makes memory that is
    reused (a slot), ``record`` marks the producer's step on an event again, ``copy`` is producer
    work on its target; ``record_release`` marks the consumer's step (every read so far) and
    ``wait_release`` moves the producer's stream up to it, and producer work on a slot
    (``copy``, ``launch``) raises ``AssertionError`` unless the producer's stream has waited for
    a release recorded after the consumer's last read of that slot. ``alias`` is what torch does
    with an object that has an array interface: a storage over the same memory that holds the
    object until the storage (every view of it) is gone.
    """

    local_refs = False

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
        self._slots: set[bytes] = set()  # memory made by allocate: reused, so checked both ways
        self._read_step = 0  # the consumer's stream: one step per read
        self._read_at: dict[bytes, int] = {}  # memory -> the consumer's step of its last read
        self._released = 0  # the consumer step the producer's stream has waited for

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
        handle = self._write(tensor.untyped_storage())
        self.log.append(("launch", handle.decode()))

    def _write(self, storage: torch.UntypedStorage) -> bytes:
        """A producer step that writes ``storage``'s memory, after the consumer released it."""
        handle = self._handle(storage)
        read = self._read_at.get(handle, 0)
        if handle in self._slots and self._released < read:
            raise AssertionError(
                f"write to fake CUDA memory {handle.decode()} before the producer's stream "
                f"waited for the consumer's release of it (read at consumer step {read}, "
                f"released up to step {self._released})"
            )
        self._step += 1
        self._written[handle] = self._step
        return handle

    def _handle(self, storage: torch.UntypedStorage) -> bytes:
        handle, _ = self._handles[storage.data_ptr()]
        return handle

    def available(self) -> bool:
        return self._available

    def device(self, tensor: torch.Tensor) -> torch.device:
        entry = self._handles.get(tensor.untyped_storage().data_ptr())
        # fake memory while its buffer lives (a storage over it: its own, an alias, an open)
        alive = entry is not None and self._buffers[entry[0]]() is not None
        return self._device if alive else tensor.device

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
        self._read_step += 1
        self._read_at[handle] = self._read_step
        return _view(storage, dtype, offset, size, stride)

    def allocate(self, device: int, nbytes: int) -> torch.UntypedStorage:
        buffer = np.zeros(nbytes, np.uint8)
        storage = torch.from_numpy(buffer).untyped_storage()
        handle = f"mem-{next(self._serial)}".encode()
        self._handles[storage.data_ptr()] = (handle, weakref.ref(storage))
        self._buffers[handle] = weakref.ref(buffer)
        self._written[handle] = 0
        self._slots.add(handle)
        self.log.append(("allocate", handle.decode()))
        return storage

    def new_event(self, device: int) -> FakeEvent:
        event = FakeEvent(f"event-{next(self._serial)}".encode(), 0)
        self._events[event.handle] = event
        self.log.append(("new_event", event.handle.decode()))
        return event

    def record(self, device: int, event: FakeEvent) -> None:
        event.step = self._step
        self.log.append(("record", event.handle.decode()))

    def record_release(self, device: int, event: FakeEvent) -> None:
        event.step = self._read_step
        self.log.append(("record_release", event.handle.decode()))

    def wait_release(self, device: int, event: FakeEvent) -> None:
        self._released = max(self._released, event.step)
        self.log.append(("wait_release", event.handle.decode()))

    def copy(self, target: torch.Tensor, source: torch.Tensor) -> None:
        handle = self._write(target.untyped_storage())
        target.copy_(source)
        self.log.append(("copy", handle.decode()))

    def alias(self, storage: torch.UntypedStorage) -> tuple[torch.UntypedStorage, object]:
        keeper = _Keeper(storage, "__array_interface__")
        flat = torch.from_numpy(np.asarray(keeper))  # numpy holds keeper, torch the array
        return flat.untyped_storage(), keeper
