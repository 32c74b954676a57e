"""ShmRing: one producer hands framed items to one consumer through shared-memory slots.

One :class:`~multiprocessing.shared_memory.SharedMemory` segment holds a header and N slots::

    [ 16 int64 words | one state byte per slot ]  padded to 64 bytes
    [ slot 0 ][ slot 1 ] ... [ slot N-1 ]         slot_bytes each, padded to 64 bytes

A slot holds one item as :func:`~rxstream.ipc.frame` made it: ``header_len, n_buffers``, an
``(offset, length)`` pair per buffer, the pickle header, then each buffer at a 64-byte aligned
offset (a ``bytes`` item is stored as is, unpickled). ``put`` copies every buffer once into a
free slot and writes the slot's index (4 bytes) into the *ready* pipe; ``get`` reads an
index, unframes in place (arrays and tensors are views of the slot) and, once every view is
gone, writes the index into the *free* pipe. The pipes carry indices, never payloads; a close
writes a mark into both to wake any side. Before ``get`` sleeps in the pipe's ``read`` it
watches the header's item count for a few µs (``spin_us``, :mod:`rxstream.ipc._wake`): an item
committed meanwhile is read without a wake-up.

The two traps of DESIGN §6:

- A view must never outlive the mapping. Leased slots keep the segment's mapping referenced;
  ``close()`` drops this ring's own references and CPython unmaps the memory when the last
  view of it is gone (``SharedMemory.close`` would raise ``BufferError`` instead).
- Python 3.11's ``SharedMemory`` registers every segment it attaches to with the process's
  resource tracker, which unlinks it when that process exits. A process with a tracker of its
  own (not a ``multiprocessing`` child of the owner) unregisters after attaching; a spawned
  child shares the owner's tracker, and unregistering there would cancel the owner's own
  registration, so it does not.
"""

import contextlib
import math
import os
import pickle
import secrets
import select
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import Pipe, resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from types import TracebackType
from typing import Any, Self

import numpy as np

from rxstream._exceptions import (
    ArgumentError,
    ArgumentTypeError,
    PayloadTooLarge,
    PipelineStateError,
    RingClosed,
    RingConflict,
)
from rxstream.ipc import _lease
from rxstream.ipc._framing import Buffer, Framed, frame, unframe
from rxstream.ipc._wake import DEFAULT_SPIN_US, check_spin_us, spin

__all__ = ["RingHandle", "RingSpec", "RingStatistics", "ShmRing"]

NAME_PREFIX = "rxs_"
"""The prefix of the segment names :meth:`ShmRing.create` makes up: ``rxs_<pid>_<hex>``, the
creating process's pid, so a process (a test) can tell its own segments from others'."""
MAX_SLOTS = 1024
"""The most slots a ring takes: the pipes hold every index in flight without blocking."""
MIN_SLOT_BYTES = 256
"""The smallest slot a ring takes."""

_ALIGN = 64
_MAGIC = int.from_bytes(b"RXSRING1", "little")
# the header's int64 words
_W_MAGIC, _W_SLOTS, _W_SLOT_BYTES, _W_CLOSED = 0, 1, 2, 3
_W_PRODUCER, _W_CONSUMER = 4, 5  # (pid << 32) | native thread id of the first caller
_W_ITEMS, _W_BYTES, _W_PUT_WAIT_NS, _W_GET_WAIT_NS = 6, 7, 8, 9
_W_SPIN_NS = 15  # how long the consumer spins before it sleeps (rxstream.ipc._wake)
_WORDS = 16
# slot states: written (and maybe leased) until the consumer hands the slot back
_FREE, _READY = 0, 1

_INDEX = struct.Struct("<I")
_CLOSE_MARK = 0xFFFF_FFFF
_CLOSE_MARK_BYTES = _INDEX.pack(_CLOSE_MARK)
_SLOT_HEAD = struct.Struct("<QQ")  # header_len, n_buffers; then (offset, length) per buffer
_COUNTS = struct.Struct("<qq")  # the words items, bytes
_W_ZERO_COPY, _W_COPIES, _W_HELD = _lease.W_ZERO_COPY, _lease.W_COPIES, _lease.W_HELD
_RAW_BYTES = (1 << 64) - 1  # n_buffers of a ``bytes`` item, stored as is instead of pickled
_BIG_COPY = 1 << 16
"""Buffers from this size on are copied by numpy, which lets other threads run meanwhile."""

_PRODUCER, _CONSUMER = "producer", "consumer"
_get_ident = threading.get_ident
_perf = time.perf_counter


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & -_ALIGN


@dataclass(frozen=True)
class RingSpec:
    """A ring's geometry: ``slots`` slots of ``slot_bytes`` each.

    The default is a rank boundary's: 4 slots of 8 MiB, enough for a 1080p RGB uint8 frame
    (6.2 MB) with its header; a 4K one (24.9 MB) wants ``RingSpec(slot_bytes=32 << 20)``. Set
    it for an app's boundaries with ``ctx.ring_spec = …`` in ``build(ctx)``. Four slots keep a
    few items in flight while the reader holds one; each slot is shared memory
    (``slots * slot_bytes`` a boundary).
    """

    slots: int = 4
    """How many items the ring holds at once (written and waiting, or leased): 1 to 1024."""
    slot_bytes: int = 8 << 20
    """The most bytes one framed item may take (its header and its arrays): at least 256."""

    def __post_init__(self) -> None:
        _check_geometry(self.slots, self.slot_bytes)


def _check_geometry(slots: int, slot_bytes: int) -> None:
    """``ValueError`` (``TypeError`` for a non-int) naming the field, the rule and the value."""
    for name, value in (("slots", slots), ("slot_bytes", slot_bytes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(
                f"{name} must be an int, got {value!r} ({type(value).__name__})"
            )
    if not 1 <= slots <= MAX_SLOTS:
        raise ArgumentError(f"slots must be between 1 and {MAX_SLOTS}, got {slots}")
    if slot_bytes < MIN_SLOT_BYTES:
        raise ArgumentError(f"slot_bytes must be >= {MIN_SLOT_BYTES}, got {slot_bytes}")


@dataclass(frozen=True)
class RingStatistics:
    """A ring's counters at one moment; the same from either side."""

    items: int
    """Items put into the ring so far."""
    bytes: int
    """Bytes those items took in their slots (pickle header, buffers and their alignment)."""
    slots_in_use: int
    """Slots written and not yet handed back: waiting for ``get``, or leased to its views."""
    put_wait_s: float
    """Seconds ``put`` spent blocked for want of a free slot (backpressure)."""
    get_wait_s: float
    """Seconds ``get`` spent blocked for want of an item."""
    zero_copy: int = 0
    """Items put in place: their arrays were written into a slot leased with ``lease``."""
    copies: int = 0
    """Items whose arrays (out-of-band buffers) ``put`` copied into a slot."""


@dataclass(frozen=True)
class RingHandle:
    """What attaching to a ring takes; pass it to a ``multiprocessing`` (spawn) child.

    It pickles when a child is started with it (the pipe ends travel as file descriptors).
    """

    name: str
    """The shared-memory segment's name (``/dev/shm/<name>`` on Linux)."""
    slots: int
    """How many slots the ring has."""
    slot_bytes: int
    """The most bytes one framed item may take."""
    ready: tuple[Connection, Connection]
    """The pipe (reader, writer) that tells the consumer which slot holds the next item."""
    free: tuple[Connection, Connection]
    """The pipe (reader, writer) that hands slots back to the producer."""
    owner_pid: int
    """The process that created the segment (and unlinks it)."""
    tracker: tuple[int, int] | None
    """The owner's resource tracker, as (device, inode) of its pipe; ``None`` if unknown."""


class ShmRing:
    """A single-producer, single-consumer ring of fixed slots in one shared-memory segment.

    Make one with :meth:`create` (the owner, who unlinks the segment at the end) and open the
    other side with :meth:`attach`, in another process or thread. Whoever calls :meth:`put`
    first is the producer and whoever calls :meth:`get` first the consumer; any other thread
    or process doing the same raises :class:`RingConflict` (exact within a process, best
    effort across processes: Python has no atomic compare-and-swap on shared memory).
    Each side closes its ring; the owner also unlinks it.
    """

    portable = False
    """Its two ends share a host and an interpreter (a ``Channel`` in ``rxstream.ranks``)."""

    def __init__(
        self,
        segment: "_Segment",
        handle: RingHandle,
        connections: tuple[Connection, Connection, Connection, Connection],
        *,
        owner: bool,
    ) -> None:
        """Use :meth:`create` or :meth:`attach`."""
        self._name = handle.name
        self._slots = handle.slots
        self._slot_bytes = handle.slot_bytes
        self._stride = _align(handle.slot_bytes)
        self._start = _align(_WORDS * 8 + handle.slots)
        self._segment = segment
        self._handle = handle
        self._owner = owner
        buf = segment.buf
        assert buf is not None
        self._seg: memoryview = buf
        self._array: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(buf, np.uint8)
        self._words = buf[: _WORDS * 8].cast("q")
        self._states = buf[_WORDS * 8 : _WORDS * 8 + handle.slots]
        self._connections = connections
        ready_r, ready_w, free_r, free_w = (c.fileno() for c in connections)
        self._ready_r, self._ready_w, self._free_r, self._free_w = ready_r, ready_w, free_r, free_w
        self._lock = threading.RLock()
        self._closed = False  # this side called close()
        self._released = False  # this side let go of its fds and mapping
        self._peer_closed = False  # a close mark came through the ready pipe
        self._putting = False  # a put is running (on the producer's thread)
        self._getting = False  # a get is running (on the consumer's thread)
        self._producer: int | None = None  # the thread (get_ident) that claimed the role here
        self._consumer: int | None = None
        self._free: list[int] = []  # slots the producer may write
        self._pending: deque[int] = deque()  # slots written, not yet taken by get
        self._items = self._bytes = self._put_wait_ns = 0  # the producer's counters
        self._get_wait_ns = 0  # the consumer's
        self._lessor: _lease.Lessor | None = None  # the producer's leases, from its first lease
        self._zero_copy = self._copies = 0  # the producer's: items put in place, copied in
        self._free_poll = select.poll()
        self._free_poll.register(self._free_r, select.POLLIN)
        self._ready_poll = select.poll()
        self._ready_poll.register(self._ready_r, select.POLLIN)
        self._taken: int | None = None  # a slot get read out and hands back on its next call
        self._leased = 0  # slots whose items' views the consumer's side still holds
        self._index_bytes = [_INDEX.pack(i) for i in range(handle.slots)]
        self._index_of = {packed: i for i, packed in enumerate(self._index_bytes)}
        self._final: RingStatistics | None = None
        self._unlinked = False
        self._read_size = _INDEX.size * (handle.slots + 8)
        self._seen = 0  # indices the consumer read out of the ready pipe (see _wake.spin)
        self._spin_ns = 0  # the consumer's, read from the header when it claims its role

    # --- making and opening -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        slots: int = 8,
        slot_bytes: int = 8 << 20,
        name: str | None = None,
        spin_us: float = DEFAULT_SPIN_US,
    ) -> Self:
        """A new ring of ``slots`` slots of ``slot_bytes`` each; this process owns it.

        ``name`` names the segment (default: ``rxs_<pid>_`` and random hex). ``spin_us``: how
        long the consumer watches for the next item before it sleeps (0 to 1000 µs; 0: it
        sleeps at once), see :mod:`rxstream.ipc._wake`.
        """
        _check_geometry(slots, slot_bytes)
        check_spin_us(spin_us)
        name = name or f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        size = _align(_WORDS * 8 + slots) + slots * _align(slot_bytes)
        segment = _Segment(name=name, create=True, size=size)
        try:
            ready_r, ready_w = Pipe(duplex=False)
            free_r, free_w = Pipe(duplex=False)
            handle = RingHandle(
                name=name,
                slots=slots,
                slot_bytes=slot_bytes,
                ready=(ready_r, ready_w),
                free=(free_r, free_w),
                owner_pid=os.getpid(),
                tracker=_tracker_id(),
            )
            ring = cls(segment, handle, (ready_r, ready_w, free_r, free_w), owner=True)
        except BaseException:
            segment.release()
            segment.unlink()
            raise
        words = ring._words
        words[_W_SLOTS] = slots
        words[_W_SLOT_BYTES] = slot_bytes
        words[_W_SPIN_NS] = round(spin_us * 1000)
        words[_W_MAGIC] = _MAGIC
        return ring

    @classmethod
    def attach(cls, handle: RingHandle) -> Self:
        """The other side of the ring ``handle`` describes (another process, or thread)."""
        segment = _Segment.attach(handle.name, handle.owner_pid, handle.tracker)
        try:
            buf = segment.buf
            assert buf is not None
            with buf[: _WORDS * 8].cast("q") as words:
                found = (words[_W_MAGIC], words[_W_SLOTS], words[_W_SLOT_BYTES])
            if found != (_MAGIC, handle.slots, handle.slot_bytes):
                raise ValueError(
                    f"segment {handle.name!r} is not the ring its handle describes "
                    f"({handle.slots} slots of {handle.slot_bytes} bytes)"
                )
            ends = (*handle.ready, *handle.free)
            ours = tuple(
                Connection(os.dup(c.fileno()), readable=c.readable, writable=c.writable)
                for c in ends
            )
        except BaseException:
            segment.release()
            raise
        return cls(segment, handle, (ours[0], ours[1], ours[2], ours[3]), owner=False)

    def handle(self) -> RingHandle:
        """What :meth:`attach` takes: pass it to the other side's process."""
        if self._released:
            raise RingClosed(f"ring {self._name!r} is closed")
        return self._handle

    @property
    def name(self) -> str:
        """The shared-memory segment's name."""
        return self._name

    # --- the producer -------------------------------------------------------------------------

    def put(self, obj: object, timeout: float | None = None) -> int:
        """Frame ``obj`` into a free slot and tell the consumer; blocks while none is free.

        ``bytes`` go in as they are, a :class:`~rxstream.ipc.Framed` as it was framed.
        Returns the nanoseconds this call waited for a free slot (backpressure; 0 mostly).
        Raises :class:`RingClosed` once either side closed the ring, :class:`PayloadTooLarge`
        for an item larger than a slot (nothing is written), :class:`FramingError` for an
        object that cannot be framed, and ``TimeoutError`` when no slot came free in
        ``timeout`` seconds.
        """
        if self._producer != _get_ident():
            self._claim(_PRODUCER)
        self._putting = True  # close() lets go of the fds and mapping only between calls
        waited = self._put_wait_ns
        try:
            if self._closed or self._words[_W_CLOSED]:
                raise RingClosed(f"ring {self._name!r} is closed")
            if type(obj) is bytes:  # as is: no pickle on either side
                header, count = obj, _RAW_BYTES
            else:  # framed already (a boundary's array item), or framed here
                header, buffers = obj if type(obj) is Framed else frame(obj)
                if buffers:
                    self._put_buffers(header, buffers, timeout)
                    return self._put_wait_ns - waited
                count = 0
            size = len(header)
            end = _SLOT_HEAD.size + size
            if end > self._slot_bytes:
                raise self._too_large(end)
            free = self._free
            slot = free.pop() if free else self._wait_free(timeout)
            if self._lessor is not None:
                slot = self._lessor.vet(slot, timeout)
            base = self._start + slot * self._stride
            seg = self._seg
            _SLOT_HEAD.pack_into(seg, base, size, count)
            seg[base + _SLOT_HEAD.size : base + end] = header
            self._commit(slot, end)
            return self._put_wait_ns - waited
        finally:
            self._putting = False
            if self._closed:
                self._let_go_if_idle()

    def lease(
        self, shape: Sequence[int], dtype: Any, timeout: float | None = None
    ) -> np.ndarray[Any, Any] | None:
        """An empty array of ``shape`` and ``dtype`` over a free slot, to fill and ``put``.

        ``put`` of the array (or of an object holding it, or a view of it) writes only the
        item's header next to it: no copy (counted in ``zero_copy``). The slot goes back once
        no view of it lives on either side; a lease never put goes back when its last view
        goes. ``None`` when the array does not fit a slot with room for a header
        (``HEAD_ROOM``, 4 KiB), for an object dtype, when ``slots - 1`` are leased out already
        (a copy always has a slot to wait for), or once the ring is closed. Blocks while no
        slot is free (backpressure), ``TimeoutError`` after ``timeout`` seconds. The producer
        leases: the caller becomes the producer as with ``put``.
        """
        if self._closed:
            return None
        if self._producer != _get_ident():
            try:
                self._claim(_PRODUCER)
            except RingClosed:  # closed meanwhile, from another thread
                return None
        self._putting = True  # as put: close() lets go of the fds and mapping only after it
        try:
            if self._closed:
                return None
            lessor = self._lessor
            if lessor is None:
                lessor = self._lessor = _lease.Lessor(self)
            return lessor.lease(shape, dtype, timeout)
        finally:
            self._putting = False
            if self._closed:
                self._let_go_if_idle()

    def _put_buffers(self, header: bytes, buffers: list[Buffer], timeout: float | None) -> None:
        """``put`` for an item with out-of-band buffers: each copied once, 64-byte aligned."""
        raws = [_raw(b) for b in buffers]
        lessor = self._lessor
        if lessor is not None and lessor.pending and lessor.put(header, raws):
            return  # in place: written into a slot leased out, no copy
        count = len(raws)
        head_at = _SLOT_HEAD.size + 16 * count
        end = head_at + len(header)
        table: list[int] = []
        for raw in raws:
            at = _align(end)
            end = at + raw.nbytes
            table += (at, raw.nbytes)
        if end > self._slot_bytes:
            raise self._too_large(end)
        # a big item: first take the slots handed back since, and reuse the latest one (its
        # memory is still in cache: one frame in flight stays in one slot, not in all of them)
        if (
            end >= _BIG_COPY
            and self._free_poll.poll(0)
            and self._read_indices(self._free_r, self._free)
        ):
            raise RingClosed(f"ring {self._name!r} is closed")
        slot = self._free.pop() if self._free else self._wait_free(timeout)
        if lessor is not None:
            slot = lessor.vet(slot, timeout)
        try:
            base = self._start + slot * self._stride
            seg = self._seg
            _SLOT_HEAD.pack_into(seg, base, len(header), count)
            struct.pack_into(f"<{2 * count}Q", seg, base + _SLOT_HEAD.size, *table)
            seg[base + head_at : base + head_at + len(header)] = header
            for k, raw in enumerate(raws):
                at, size = base + table[2 * k], table[2 * k + 1]
                if size >= _BIG_COPY:  # numpy lets other threads run while it copies
                    np.copyto(self._array[at : at + size], np.frombuffer(raw, np.uint8))
                else:
                    seg[at : at + size] = raw
        except BaseException:
            self._free.append(slot)
            raise
        self._copies += 1
        self._words[_W_COPIES] = self._copies
        self._commit(slot, end)

    def _commit(self, slot: int, size: int) -> None:
        """Count the item written in ``slot`` and tell the consumer."""
        self._states[slot] = _READY
        self._items += 1
        self._bytes += size
        _COUNTS.pack_into(self._seg, _W_ITEMS * 8, self._items, self._bytes)
        os.write(self._ready_w, self._index_bytes[slot])

    def _too_large(self, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"a framed item of {size:,} bytes does not fit a ring slot of "
            f"{self._slot_bytes:,} bytes; create the ring with a larger slot_bytes= "
            f"(at least {size:,})",
            size=size,
            slot_bytes=self._slot_bytes,
        )

    def _wait_free(self, timeout: float | None) -> int:
        """Block until the consumer hands a slot back; that slot."""
        free = self._free
        started = _perf()
        try:
            while not free:
                if timeout is not None and not _readable(self._free_poll, started, timeout):
                    raise TimeoutError(
                        f"no slot of ring {self._name!r} came free within {timeout} s "
                        f"(all {self._slots} are written and not handed back)"
                    )
                closed = self._read_indices(self._free_r, free)
                if closed or self._closed or self._words[_W_CLOSED]:
                    raise RingClosed(f"ring {self._name!r} is closed")
        finally:
            self._put_wait_ns += int((_perf() - started) * 1e9)
            self._words[_W_PUT_WAIT_NS] = self._put_wait_ns
        return free.pop()

    # --- the consumer -------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> Any:
        """The next item, unframed in place: its arrays and tensors are views of the slot.

        The slot stays leased until every view of it has been garbage collected, then goes
        back to the producer. Raises :class:`RingClosed` once the ring is closed and every
        item put before the close was got (at once if this side closed it), and
        ``TimeoutError`` when no item came in ``timeout`` seconds.
        """
        if self._consumer != _get_ident():
            self._claim(_CONSUMER)
        self._getting = True  # close() lets go of the fds and mapping only between calls
        try:
            if self._closed:
                raise RingClosed(f"ring {self._name!r} is closed")
            taken = self._taken
            if taken is not None:  # the previous call's slot, read out: back to the producer
                self._taken = None
                os.write(self._free_w, self._index_bytes[taken])
            pending = self._pending
            if not pending:
                self._wait_ready(timeout)
            slot = pending.popleft()
            base = self._start + slot * self._stride
            header_len, count = _SLOT_HEAD.unpack_from(self._seg, base)
            if count and count != _RAW_BYTES:
                return self._take_leased(slot, base, header_len, count)
            # no buffers: nothing points into the slot once read. It is free now and goes
            # back to the producer on the next call: the pipe write stays off the way from
            # the producer's put to this item's consumer
            try:
                header = self._seg[base + _SLOT_HEAD.size : base + _SLOT_HEAD.size + header_len]
                return bytes(header) if count else pickle.loads(header)
            finally:
                self._states[slot] = _FREE
                self._taken = slot
        finally:
            self._getting = False
            if self._closed:
                self._let_go_if_idle()

    def _wait_ready(self, timeout: float | None) -> None:
        """Block until the producer tells of a written slot (queued in ``_pending``)."""
        pending = self._pending
        if self._peer_closed:
            raise RingClosed(f"ring {self._name!r} is closed and drained")
        started = _perf()
        try:
            # awake when the producer commits: the read below finds the index, no wake-up
            spin(self._words, _W_ITEMS, self._seen, _W_CLOSED, self._spin_ns)
            while True:
                if timeout is not None and not _readable(self._ready_poll, started, timeout):
                    raise TimeoutError(f"no item came through ring {self._name!r} in {timeout} s")
                if self._read_indices(self._ready_r, pending):
                    self._peer_closed = True
                self._seen += len(pending)  # it was empty: these are the indices just read
                if self._closed:
                    raise RingClosed(f"ring {self._name!r} is closed")
                if pending:
                    return
                if self._peer_closed:
                    raise RingClosed(f"ring {self._name!r} is closed and drained")
        finally:
            self._get_wait_ns += int((_perf() - started) * 1e9)
            self._words[_W_GET_WAIT_NS] = self._get_wait_ns

    def _take_leased(self, slot: int, base: int, header_len: int, count: int) -> Any:
        """Unframe the item in ``slot`` over views of it; the views lease the slot."""
        table = struct.unpack_from(f"<{2 * count}Q", self._seg, base + _SLOT_HEAD.size)
        owner = self._array[base : base + self._stride]  # every view of the slot keeps it
        with self._lock:
            self._leased += 1
        lease = weakref.finalize(owner, self._release, slot)
        lease.atexit = False
        view = owner.data
        head_at = _SLOT_HEAD.size + 16 * count
        buffers = [view[table[k] : table[k] + table[k + 1]] for k in range(0, 2 * count, 2)]
        return unframe(view[head_at : head_at + header_len], buffers)

    def _release(self, slot: int) -> None:
        """Hand ``slot`` back to the producer: the last view of it is gone (any thread)."""
        with self._lock:
            self._leased -= 1
            if self._released:  # this side closed: nobody waits for the slot
                return
            self._states[slot] = _FREE
            os.write(self._free_w, self._index_bytes[slot])

    def _read_indices(self, fd: int, into: list[int] | deque[int]) -> bool:
        """Read the slot indices waiting in pipe ``fd`` into ``into``; whether a close came."""
        data = os.read(fd, self._read_size)
        index = self._index_of.get(data)  # the common case: one index
        if index is not None:
            into.append(index)
            return False
        if not data:  # every writer gone (cannot happen while this side holds its own)
            return True
        closed = False
        for (index,) in _INDEX.iter_unpack(data):
            if index == _CLOSE_MARK:
                closed = True
            else:
                into.append(index)
        return closed

    # --- both sides ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the ring for both sides; wakes a blocked put or get (``RingClosed``).

        This side's pipes and mapping are let go once no call is in flight; memory that views
        still point into stays mapped until the last of them is gone. Idempotent.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._words[_W_CLOSED] = 1
            for fd in (self._ready_w, self._free_w):
                with contextlib.suppress(OSError):
                    os.write(fd, _CLOSE_MARK_BYTES)
            if not self._putting and not self._getting:
                self._let_go()

    def unlink(self) -> None:
        """Remove the segment's name (the owner's last step); safe to call twice.

        Mappings that are still open (this side's leased views, the other process's) stay
        valid until they go; no new side can attach.
        """
        if not self._owner:
            raise PipelineStateError(
                f"only the owner of ring {self._name!r} (pid {self._handle.owner_pid}) "
                "unlinks it; this side attached to it"
            )
        if self._unlinked:
            return
        self._unlinked = True
        try:
            self._segment.unlink()
        except FileNotFoundError:  # removed behind our back: still drop our registration
            resource_tracker.unregister(self._segment.tracked_name, "shared_memory")

    @property
    def put_wait_ns(self) -> int:
        """Nanoseconds ``put`` has spent blocked for want of a free slot (a cheap read).

        0 once this side let go of the ring (a close from another thread may come any time).
        """
        try:
            return int(self._words[_W_PUT_WAIT_NS])
        except ValueError:  # the mapping was let go: released memoryview
            return 0

    @property
    def all_in_use(self) -> bool:
        """Whether no slot is free (each waits for ``get`` or is leased): a cheap check.

        False once this side let go of the ring.
        """
        try:
            return _FREE not in bytes(self._states)
        except ValueError:  # the mapping was let go: released memoryview
            return False

    @property
    def all_leased(self) -> bool:
        """Whether every slot is leased to views of items this side got (the consumer's).

        Then the producer waits until one of those views goes. Slots written and waiting for
        ``get`` do not count: a full ring whose consumer keeps up is not leased. Slots the
        producer put in place from a lease whose views it still holds do (the consumer cannot
        have them back either). A cheap read.
        """
        try:
            return self._leased + self._words[_W_HELD] >= self._slots
        except ValueError:  # the mapping was let go: released memoryview
            return self._leased >= self._slots

    def statistics(self) -> RingStatistics:
        """The ring's counters now (after this side closed: as they were at its close)."""
        with self._lock:
            if self._final is not None:
                return self._final
            return self._snapshot()

    def _snapshot(self) -> RingStatistics:
        words = self._words
        return RingStatistics(
            items=words[_W_ITEMS],
            bytes=words[_W_BYTES],
            slots_in_use=self._slots - bytes(self._states).count(_FREE),
            put_wait_s=words[_W_PUT_WAIT_NS] / 1e9,
            get_wait_s=words[_W_GET_WAIT_NS] / 1e9,
            zero_copy=words[_W_ZERO_COPY],
            copies=words[_W_COPIES],
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close; the owner also unlinks."""
        self.close()
        if self._owner:
            self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        side = "owner" if self._owner else "attached"
        return (
            f"<ShmRing {self._name!r} {self._slots} slots x {self._slot_bytes} bytes, "
            f"{side}, {state}>"
        )

    # --- internals ----------------------------------------------------------------------------

    def _claim(self, role: str) -> None:
        """Make the calling thread this ring's producer or consumer, or raise RingConflict.

        The first caller's pid and thread id go into the segment, so the other process sees
        them too (best effort across processes: no atomic compare-and-swap here).
        """
        with self._lock:
            if self._released:
                raise RingClosed(f"ring {self._name!r} is closed")
            word = _W_PRODUCER if role is _PRODUCER else _W_CONSUMER
            words = self._words
            mine = (os.getpid() << 32) | threading.get_native_id()
            claimed = False
            if (self._producer if role is _PRODUCER else self._consumer) is None and not words[
                word
            ]:
                words[word] = mine
                claimed = True
            first = words[word]
            if not claimed or first != mine:  # another thread, process or ring object was first
                call = "put" if role is _PRODUCER else "get"
                where = " through another ShmRing object" if first == mine else ""
                raise RingConflict(
                    f"ring {self._name!r} already has a {role} (pid {first >> 32}, thread "
                    f"{first & 0xFFFF_FFFF}); {call} called from pid {mine >> 32}, thread "
                    f"{mine & 0xFFFF_FFFF}{where}: a ring has one {role}"
                )
            if role is _PRODUCER:
                states = self._states
                self._free = [i for i in range(self._slots - 1, -1, -1) if states[i] == _FREE]
                self._items, self._bytes = words[_W_ITEMS], words[_W_BYTES]
                self._put_wait_ns = words[_W_PUT_WAIT_NS]
                self._zero_copy, self._copies = words[_W_ZERO_COPY], words[_W_COPIES]
                self._producer = _get_ident()
            else:
                self._get_wait_ns = words[_W_GET_WAIT_NS]
                self._spin_ns = words[_W_SPIN_NS]
                self._consumer = _get_ident()

    def _let_go_if_idle(self) -> None:
        """After close: let go once neither put nor get is running on this object."""
        with self._lock:
            if self._closed and not self._putting and not self._getting:
                self._let_go()

    def _let_go(self) -> None:
        """Close this side's pipes and drop its references to the mapping (under the lock)."""
        if self._released:
            return
        self._final = self._snapshot()
        self._released = True
        self._pending.clear()
        self._words.release()
        self._states.release()
        del self._seg, self._array
        self._segment.release()
        for connection in self._connections:
            connection.close()


def _raw(buffer: Buffer) -> memoryview:
    """``buffer``'s bytes as a flat byte view."""
    if isinstance(buffer, memoryview):
        return buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer
    return buffer.raw()


def _readable(poller: select.poll, started: float, timeout: float) -> bool:
    """Wait until ``poller``'s pipe has something to read, at most ``timeout`` s from
    ``started``."""
    return bool(poller.poll(max(0, math.ceil((started + timeout - time.perf_counter()) * 1000))))


def _tracker_id() -> tuple[int, int] | None:
    """This process's resource tracker, as the (device, inode) of the pipe to it."""
    try:
        resource_tracker.ensure_running()
        fd = resource_tracker.getfd()
        if fd is None:
            return None
        stat = os.fstat(fd)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


class _Segment(SharedMemory):
    """A SharedMemory whose mapping outlives ``release()`` while views of it live.

    It touches ``SharedMemory``'s private ``_buf``/``_mmap``/``_fd``/``_name`` (stable from
    3.8 to 3.13): ``close()`` raises ``BufferError`` while a buffer is exported, and so does
    the ``__del__`` of a segment dropped with views alive.
    """

    @classmethod
    def attach(cls, name: str, owner_pid: int, tracker: tuple[int, int] | None) -> "_Segment":
        """Open segment ``name``, which ``owner_pid`` created and its ``tracker`` watches.

        On 3.11 opening registers it with this process's resource tracker, which would unlink
        it when this process exits: unregister, unless that tracker is the owner's.
        """
        segment = cls(name=name)
        if owner_pid != os.getpid() and _tracker_id() != tracker:
            resource_tracker.unregister(segment.tracked_name, "shared_memory")
        return segment

    @property
    def tracked_name(self) -> str:
        """The name the resource tracker knows the segment by (with its leading slash)."""
        name: str = self.__dict__["_name"]
        return name

    def release(self) -> None:
        """Let go of this process's handle; the memory stays mapped while views of it live.

        CPython unmaps it when the last view (and with it the mmap object) is collected.
        """
        state = self.__dict__
        try:
            self.close()
        except BufferError:
            state["_buf"] = None
            state["_mmap"] = None
            fd = state.get("_fd", -1)
            if fd >= 0:
                state["_fd"] = -1
                os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at shutdown, modules may be half gone
            self.release()
