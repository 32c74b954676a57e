"""The calls the CUDA IPC bridge makes (`CudaApi`), the real ones (`TorchCuda`), and the
helpers the bridge's modules share (dtype names, a view over a storage, contiguous strides)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any, Protocol, TypeVar

import torch

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "CudaApi",
    "EventT",
    "Keeper",
    "StorageHandle",
    "StorageT",
    "TorchCuda",
    "contiguous",
    "describe",
    "nbytes",
    "view_of",
]

StorageT = TypeVar("StorageT")
EventT = TypeVar("EventT")

StorageHandle = tuple[Any, ...]
"""What `CudaApi.share` returns: picklable, opaque to the bridge."""

DTYPES: dict[str, torch.dtype] = {
    str(value).removeprefix("torch."): value
    for value in vars(torch).values()
    if isinstance(value, torch.dtype)
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


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

    # --- stage timing (the engine's GPU time of a stage's call) and NVTX ranges --------------

    def timing_event(self, device: int | None) -> Any:
        """A new event that records GPU time (not interprocess), on the device (``None``: the
        current one); made once per pool slot and recorded again and again."""
        ...

    def record_current(self, device: int | None, event: Any) -> None:
        """Record ``event`` on the device's current stream: the stream a stage's call uses."""
        ...

    def event_done(self, event: Any) -> bool:
        """Whether the work before ``event`` is done (CUDA's ``query()``: never waits)."""
        ...

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """GPU milliseconds from ``start`` to ``end``, both done (never waits)."""
        ...

    def nvtx_push(self, message: str) -> None:
        """Open an NVTX range named ``message`` on this thread."""
        ...

    def nvtx_pop(self) -> None:
        """Close this thread's innermost NVTX range."""
        ...


def describe(dtype: torch.dtype, size: Sequence[int], device: object) -> str:
    return f"{DTYPE_NAMES[dtype]} tensor of shape {tuple(size)} on {device}"


def view_of(
    storage: torch.UntypedStorage,
    dtype: torch.dtype,
    offset: int,
    size: Sequence[int],
    stride: Sequence[int],
) -> torch.Tensor:
    return torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


def contiguous(size: Sequence[int]) -> tuple[int, ...]:
    """The strides of a C-contiguous tensor of ``size``, in elements."""
    strides = []
    step = 1
    for extent in reversed(size):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def nbytes(size: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(size) * dtype.itemsize


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
        return view_of(storage, dtype, offset, size, stride)

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
        keeper = Keeper(storage, "__cuda_array_interface__")
        flat = torch.as_tensor(keeper, device=storage.device)
        return flat.untyped_storage(), keeper

    def timing_event(self, device: int | None) -> torch.cuda.Event:
        with torch.cuda.device(device):
            return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def record_current(self, device: int | None, event: torch.cuda.Event) -> None:
        event.record(torch.cuda.current_stream(device))

    def event_done(self, event: torch.cuda.Event) -> bool:
        done: bool = event.query()  # type: ignore[no-untyped-call]
        return done

    def elapsed_ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        ms: float = start.elapsed_time(end)
        return ms

    def nvtx_push(self, message: str) -> None:
        torch.cuda.nvtx.range_push(message)  # type: ignore[no-untyped-call]

    def nvtx_pop(self) -> None:
        torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]


class Keeper:
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
