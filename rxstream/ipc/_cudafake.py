"""`FakeCudaApi`: a `CudaApi` without CUDA, in one process, for tests on machines without a
GPU (``bench/gpu_ipc.py`` checks the real one on a GPU)."""

from __future__ import annotations

import collections
import itertools
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from rxstream.ipc._cudaapi import Keeper, StorageHandle, view_of

__all__ = ["FakeCudaApi", "FakeEvent", "FakeTimingEvent"]


class FakeEvent:
    """An event of `FakeCudaApi`: its handle and the producer stream step it marks."""

    __slots__ = ("handle", "step")

    def __init__(self, handle: bytes, step: int) -> None:
        self.handle = handle
        self.step = step


class FakeTimingEvent:
    """A timing event of `FakeCudaApi`: the fake GPU clock (ms) where it was last recorded,
    and whether the work before it is done."""

    __slots__ = ("at_ms", "done", "recorded")

    def __init__(self) -> None:
        self.at_ms = 0.0
        self.done = True
        self.recorded = False


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

    Stage timing runs on a fake GPU clock: `kernel` queues work of a given GPU time on the
    current stream (the clock moves on by it, the host does not wait), a timing event recorded
    then marks the clock, and `elapsed_ms` is the clock between two events. While `stalled`,
    events recorded are not done (``query()`` says no) until `finish`. ``calls`` counts every
    call by name, ``synchronize`` included (the engine's hot path must never make one), and
    ``nvtx`` is the NVTX stack: ``("push", name)`` and ``("pop", name)`` in order.
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
        self.gpu_ms = 0.0  # the fake GPU clock: the current stream's queued work, in ms
        self.stalled = False  # events recorded now stay pending until finish()
        self.calls: collections.Counter[str] = collections.Counter()
        self.nvtx: list[tuple[str, str]] = []
        self._stack: list[str] = []
        self._pending: list[FakeTimingEvent] = []

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
        return view_of(storage, dtype, offset, size, stride)

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
        keeper = Keeper(storage, "__array_interface__")
        flat = torch.from_numpy(np.asarray(keeper))  # numpy holds keeper, torch the array
        return flat.untyped_storage(), keeper

    # --- stage timing and NVTX ------------------------------------------------------------

    def kernel(self, ms: float) -> None:
        """Queue work of ``ms`` GPU milliseconds on the current stream (returns at once)."""
        self.calls["kernel"] += 1
        self.gpu_ms += ms

    def finish(self) -> None:
        """The GPU catches up: every pending event is done."""
        for event in self._pending:
            event.done = True
        self._pending.clear()
        self.stalled = False

    def synchronize(self, device: int | None = None) -> None:
        """Wait for the device (counted: the engine must not call it)."""
        self.calls["synchronize"] += 1
        self.finish()

    def timing_event(self, device: int | None) -> FakeTimingEvent:
        self.calls["timing_event"] += 1
        return FakeTimingEvent()

    def record_current(self, device: int | None, event: FakeTimingEvent) -> None:
        self.calls["record_current"] += 1
        event.at_ms = self.gpu_ms
        event.recorded = True
        event.done = not self.stalled
        if self.stalled:
            self._pending.append(event)

    def event_done(self, event: FakeTimingEvent) -> bool:
        self.calls["event_done"] += 1
        return event.done

    def elapsed_ms(self, start: FakeTimingEvent, end: FakeTimingEvent) -> float:
        self.calls["elapsed_ms"] += 1
        if not (start.recorded and end.recorded and start.done and end.done):
            raise AssertionError("elapsed_ms of a fake timing event not recorded or not done")
        return end.at_ms - start.at_ms

    def nvtx_push(self, message: str) -> None:
        self.calls["nvtx_push"] += 1
        self._stack.append(message)
        self.nvtx.append(("push", message))

    def nvtx_pop(self) -> None:
        self.calls["nvtx_pop"] += 1
        if not self._stack:
            raise AssertionError("nvtx_pop without an open NVTX range")
        self.nvtx.append(("pop", self._stack.pop()))
