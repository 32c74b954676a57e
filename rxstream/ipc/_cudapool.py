"""The CUDA slot pool: the CUDA IPC bridge shared once instead of per tensor.

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
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple

import torch

from rxstream._exceptions import ArgumentError, CudaRefError, CudaUnavailableError
from rxstream.ipc._cudaapi import (
    DTYPE_NAMES,
    DTYPES,
    CudaApi,
    EventT,
    StorageHandle,
    contiguous,
    nbytes,
    view_of,
)

__all__ = ["CudaPoolReader", "CudaPoolShare", "CudaPoolStatistics", "CudaSlotPool", "CudaSlotRef"]


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
        if nbytes(size, dtype) > self.slot_bytes:
            return None
        slot = self._take(self._leased)
        if slot is None:
            return None
        alias, keeper = self._api.alias(self._storages[slot])
        weakref.finalize(keeper, self._lease_gone, slot).atexit = False
        return view_of(alias, dtype, 0, size, contiguous(size))

    def send(self, tensor: torch.Tensor) -> CudaSlotRef | None:
        """A ref to ``tensor`` in a slot, ordered after the producer's queued work; ``None``
        when it cannot go through the pool (larger than a slot, on another device, or every
        slot held by the producer's own leases).

        A tensor over a lease that is not in flight goes as it is (zero copy); any other is
        copied into a free slot (blocks while every slot is in flight).
        """
        api = self._api
        dtype = DTYPE_NAMES[tensor.dtype]
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
        if (api.device(tensor).index or 0) != self.device or nbytes(
            size, tensor.dtype
        ) > self.slot_bytes:
            return None
        slot = self._take(self._sent)
        if slot is None:
            return None
        stride = contiguous(size)
        api.copy(view_of(self._storages[slot], tensor.dtype, 0, size, stride), tensor)
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
            tensor = api.view(alias, DTYPES[ref.dtype], ref.offset, ref.size, ref.stride)
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
