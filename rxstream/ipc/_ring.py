"""ShmRing: one producer hands framed items to one consumer through shared-memory slots.

One :class:`~multiprocessing.shared_memory.SharedMemory` segment holds a header and N slots
(the layout, the geometry and the types both sides share: :mod:`rxstream.ipc._ringlayout`;
the segment and its traps: :mod:`rxstream.ipc._segment`). ``put`` copies every buffer once
into a free slot and writes the slot's index (4 bytes) into the *ready* pipe; ``get`` reads an
index, unframes in place (arrays and tensors are views of the slot) and, once every view is
gone, writes the index into the *free* pipe. The pipes carry indices, never payloads; a close
writes a mark into both to wake any side. Before ``get`` sleeps in the pipe's ``read`` it
watches the header's ``sent`` word for a few µs (``spin_us``, longer while items come close
together, :mod:`rxstream.ipc._wake`): an item committed meanwhile is read without a wake-up.
A producer that writes in place leases slots (:mod:`rxstream.ipc._lease`).
"""

import contextlib
import os
import pickle
import secrets
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing import Pipe, resource_tracker
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any, Self

import numpy as np

from rxstream._exceptions import PipelineStateError, RingClosed
from rxstream.ipc import _lease
from rxstream.ipc._framing import Buffer, Framed, frame, unframe
from rxstream.ipc._lease import W_COPIES, W_HELD, W_TAKEN, W_ZERO_COPY
from rxstream.ipc._ringlayout import (
    BIG_COPY,
    CLOSE_MARK_BYTES,
    COUNTS,
    FREE,
    INDEX,
    MAGIC,
    NAME_PREFIX,
    RAW_BYTES,
    READY,
    SLOT_HEAD,
    W_BYTES,
    W_CLOSED,
    W_CONSUMER,
    W_GET_WAIT_NS,
    W_ITEMS,
    W_MAGIC,
    W_PRODUCER,
    W_PUT_WAIT_NS,
    W_SENT,
    W_SLOT_BYTES,
    W_SLOTS,
    W_SPIN_NS,
    WORDS,
    RingHandle,
    RingSpec,
    RingStatistics,
    align,
    as_bytes,
    check_geometry,
    claim_word,
    read_indices,
    readable,
    slot_head,
    snapshot,
    too_large,
)
from rxstream.ipc._segment import Segment, tracker_id
from rxstream.ipc._wake import DEFAULT_SPIN_US, check_spin_us, spin, spin_budget

__all__ = ["RingHandle", "RingSpec", "RingStatistics", "ShmRing"]

_PRODUCER, _CONSUMER = "producer", "consumer"
_get_ident = threading.get_ident
_perf = time.perf_counter
_ns = time.perf_counter_ns
_IDLE_GAP_NS = 1 << 62  # a gap no backlog has: spin_budget gives the ring's spin_us alone


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
        segment: "Segment",
        handle: RingHandle,
        connections: tuple[Connection, Connection, Connection, Connection],
        *,
        owner: bool,
    ) -> None:
        """Use :meth:`create` or :meth:`attach`."""
        self._name = handle.name
        self._slots = handle.slots
        self._slot_bytes = handle.slot_bytes
        self._stride = align(handle.slot_bytes)
        self._start = align(WORDS * 8 + handle.slots)
        self._segment = segment
        self._handle = handle
        self._owner = owner
        buf = segment.buf
        assert buf is not None
        self._seg: memoryview = buf
        self._array: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(buf, np.uint8)
        self._words = buf[: WORDS * 8].cast("q")
        self._states = buf[WORDS * 8 : WORDS * 8 + handle.slots]
        self._connections = connections
        self._ready_r, self._ready_w, self._free_r, self._free_w = (c.fileno() for c in connections)
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
        self.on_wait: Callable[[], Callable[[], None]] | None = None
        """Called as a put or a lease starts to wait for a free slot (the ring is full, or
        the lease waits for the consumer's hand-back), on the producer's thread; what it
        returns is called once the wait is over (a boundary marks its upstream stage stalled,
        not busy, meanwhile)."""
        self._free_poll = select.poll()
        self._free_poll.register(self._free_r, select.POLLIN)
        self._ready_poll = select.poll()
        self._ready_poll.register(self._ready_r, select.POLLIN)
        self._taken: int | None = None  # a slot get read out and hands back on its next call
        self._leased = 0  # slots whose items' views the consumer's side still holds
        self._index_bytes = [INDEX.pack(i) for i in range(handle.slots)]
        self._index_of = {packed: i for i, packed in enumerate(self._index_bytes)}
        self._final: RingStatistics | None = None
        self._unlinked = False
        self._read_size = INDEX.size * (handle.slots + 8)
        self._seen = 0  # indices the consumer read out of the ready pipe (see _wake.spin)
        self._spin_ns = 0  # the consumer's, read from the header when it claims its role
        self._arrived_ns = self._gap_ns = 0  # the consumer's: when the last wait ended, and
        # the time between the last two (the producer's pace while the consumer keeps up)

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
        sleeps at once; while items come less than 1 ms apart, up to 1.5x their gap), see
        :mod:`rxstream.ipc._wake`.
        """
        check_geometry(slots, slot_bytes)
        check_spin_us(spin_us)
        name = name or f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        size = align(WORDS * 8 + slots) + slots * align(slot_bytes)
        segment = Segment(name=name, create=True, size=size)
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
                tracker=tracker_id(),
            )
            ring = cls(segment, handle, (ready_r, ready_w, free_r, free_w), owner=True)
        except BaseException:
            segment.release()
            segment.unlink()
            raise
        words = ring._words
        words[W_SLOTS] = slots
        words[W_SLOT_BYTES] = slot_bytes
        words[W_SPIN_NS] = round(spin_us * 1000)
        words[W_MAGIC] = MAGIC
        return ring

    @classmethod
    def attach(cls, handle: RingHandle) -> Self:
        """The other side of the ring ``handle`` describes (another process, or thread)."""
        segment = Segment.attach(handle.name, handle.owner_pid, handle.tracker)
        try:
            buf = segment.buf
            assert buf is not None
            with buf[: WORDS * 8].cast("q") as words:
                found = (words[W_MAGIC], words[W_SLOTS], words[W_SLOT_BYTES])
            if found != (MAGIC, handle.slots, handle.slot_bytes):
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
            if self._closed or self._words[W_CLOSED]:
                raise RingClosed(f"ring {self._name!r} is closed")
            if type(obj) is bytes:  # as is: no pickle on either side
                header, count = obj, RAW_BYTES
            else:  # framed already (a boundary's array item), or framed here
                header, buffers = obj if type(obj) is Framed else frame(obj)
                if buffers:
                    self._put_buffers(header, buffers, timeout)
                    return self._put_wait_ns - waited
                count = 0
            size = len(header)
            end = SLOT_HEAD.size + size
            if end > self._slot_bytes:
                raise too_large(end, self._slot_bytes)
            free = self._free
            slot = free.pop() if free else self._wait_free(timeout)
            if self._lessor is not None:
                slot = self._lessor.vet(slot, timeout)
            base = self._start + slot * self._stride
            seg = self._seg
            SLOT_HEAD.pack_into(seg, base, size, count)
            seg[base + SLOT_HEAD.size : base + end] = header
            self._commit(slot, end)
            return self._put_wait_ns - waited
        except RingClosed as exc:  # the wait so far is the caller's stall still
            exc.waited_ns = self._put_wait_ns - waited
            raise
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
        (``HEAD_ROOM``, 4 KiB), for an object dtype, when it would leave no slot outside this
        producer's leases and the slots the consumer's views hold (a copy always has a slot to
        wait for) after a bounded wait for one (``LEASE_WAIT_S``), or once this side closed
        the ring. Blocks while no slot is free (backpressure), ``TimeoutError`` after
        ``timeout`` seconds. The producer leases: the caller becomes the producer, as ``put``.
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
        raws = [as_bytes(b) for b in buffers]
        lessor = self._lessor
        if lessor is not None and lessor.pending and lessor.put(header, raws):
            return  # in place: written into a slot leased out, no copy
        count = len(raws)
        head_at = SLOT_HEAD.size + 16 * count
        end = head_at + len(header)
        table = [len(header), count]  # the slot's head, then (offset, length) per buffer
        for raw in raws:
            at = (end + 63) & -64  # align(end)
            end = at + raw.nbytes
            table += (at, raw.nbytes)
        if end > self._slot_bytes:
            raise too_large(end, self._slot_bytes)
        # a big item: first take the slots handed back since (one read: an empty free pipe
        # reads as nothing), and reuse the latest (still in cache: one frame in flight stays
        # in one slot, not in all of them)
        if end >= BIG_COPY and read_indices(
            self._free_r, self._read_size, self._index_of, self._free
        ):
            raise RingClosed(f"ring {self._name!r} is closed")
        slot = self._free.pop() if self._free else self._wait_free(timeout)
        if lessor is not None:
            slot = lessor.vet(slot, timeout)
        try:
            base = self._start + slot * self._stride
            seg = self._seg
            slot_head(count).pack_into(seg, base, *table)
            seg[base + head_at : base + head_at + len(header)] = header
            for raw, offset, size in zip(raws, table[2::2], table[3::2], strict=True):
                at = base + offset
                if size >= BIG_COPY:  # numpy lets other threads run while it copies
                    np.copyto(self._array[at : at + size], np.frombuffer(raw, np.uint8))
                else:
                    seg[at : at + size] = raw
        except BaseException:
            self._free.append(slot)
            raise
        self._copies += 1
        self._words[W_COPIES] = self._copies
        self._commit(slot, end)

    def _commit(self, slot: int, size: int) -> None:
        """Count the item written in ``slot`` and tell the consumer."""
        self._states[slot] = READY
        self._items += 1
        self._bytes += size
        COUNTS.pack_into(self._seg, W_ITEMS * 8, self._items, self._bytes)
        os.write(self._ready_w, self._index_bytes[slot])
        self._words[W_SENT] = self._items  # after the write: a spinning consumer reads at once

    def _wait_free(self, timeout: float | None) -> int:
        """Block until the consumer hands a slot back; that slot."""
        free = self._free
        started = _perf()
        resume = None if self.on_wait is None else self.on_wait()
        try:
            while not free:
                if timeout is None:
                    self._free_poll.poll()
                elif not readable(self._free_poll, started, timeout):
                    raise TimeoutError(
                        f"no slot of ring {self._name!r} came free within {timeout} s "
                        f"(all {self._slots} are written and not handed back)"
                    )
                closed = read_indices(self._free_r, self._read_size, self._index_of, free)
                if closed or self._closed or self._words[W_CLOSED]:
                    raise RingClosed(f"ring {self._name!r} is closed")
        finally:
            self._put_wait_ns += int((_perf() - started) * 1e9)
            self._words[W_PUT_WAIT_NS] = self._put_wait_ns
            if resume is not None:
                resume()
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
            header_len, count = SLOT_HEAD.unpack_from(self._seg, base)
            if count and count != RAW_BYTES:
                return self._take_leased(slot, base, header_len, count)
            # no buffers: nothing points into the slot once read. It is free now and goes
            # back to the producer on the next call: the pipe write stays off the way from
            # the producer's put to this item's consumer
            try:
                header = self._seg[base + SLOT_HEAD.size : base + SLOT_HEAD.size + header_len]
                return bytes(header) if count else pickle.loads(header)
            finally:
                self._states[slot] = FREE
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
            budget = spin_budget(self._spin_ns, self._gap_ns)
            spin(self._words, W_SENT, self._seen, W_CLOSED, budget)
            while True:
                if timeout is not None and not readable(self._ready_poll, started, timeout):
                    # the items stopped coming: the next waits spin spin_us only, not the
                    # backlog's stretched budget (a consumer polling an idle ring stays idle)
                    self._gap_ns = _IDLE_GAP_NS
                    raise TimeoutError(f"no item came through ring {self._name!r} in {timeout} s")
                if read_indices(self._ready_r, self._read_size, self._index_of, pending):
                    self._peer_closed = True
                self._seen += len(pending)  # it was empty: these are the indices just read
                if self._closed:
                    raise RingClosed(f"ring {self._name!r} is closed")
                if pending:
                    now = _ns()
                    self._gap_ns, self._arrived_ns = now - self._arrived_ns, now
                    return
                if self._peer_closed:
                    raise RingClosed(f"ring {self._name!r} is closed and drained")
        finally:
            self._get_wait_ns += int((_perf() - started) * 1e9)
            self._words[W_GET_WAIT_NS] = self._get_wait_ns

    def _take_leased(self, slot: int, base: int, header_len: int, count: int) -> Any:
        """Unframe the item in ``slot`` over views of it; the views lease the slot."""
        table = slot_head(count).unpack_from(self._seg, base)  # header_len, count, then pairs
        owner = self._array[base : base + self._stride]  # every view of the slot keeps it
        with self._lock:
            self._leased += 1
            self._words[W_TAKEN] = self._leased  # before all_leased reads the producer's
        lease = weakref.finalize(owner, self._release, slot)
        lease.atexit = False
        view = owner.data
        head_at = SLOT_HEAD.size + 16 * count
        buffers = [view[table[k] : table[k] + table[k + 1]] for k in range(2, 2 * count + 2, 2)]
        return unframe(view[head_at : head_at + header_len], buffers)

    def _release(self, slot: int) -> None:
        """Hand ``slot`` back to the producer: the last view of it is gone (any thread)."""
        with self._lock:
            self._leased -= 1
            if self._released:  # this side closed: nobody waits for the slot
                return
            self._words[W_TAKEN] = self._leased
            self._states[slot] = FREE
            os.write(self._free_w, self._index_bytes[slot])

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
            self._words[W_CLOSED] = 1
            for fd in (self._ready_w, self._free_w):
                with contextlib.suppress(OSError):
                    os.write(fd, CLOSE_MARK_BYTES)
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
            return int(self._words[W_PUT_WAIT_NS])
        except ValueError:  # the mapping was let go: released memoryview
            return 0

    @property
    def all_in_use(self) -> bool:
        """Whether no slot is free (each waits for ``get`` or is leased): a cheap check.

        False once this side let go of the ring.
        """
        try:
            return FREE not in bytes(self._states)
        except ValueError:  # the mapping was let go: released memoryview
            return False

    @property
    def all_leased(self) -> bool:
        """Whether every slot is leased to views of items this side got (the consumer's).

        Then the producer waits until one of those views goes. Slots written and waiting for
        ``get`` do not count: a full ring whose consumer keeps up is not leased. Slots the
        producer holds leased do (not put yet, or put in place with views of them still
        alive in the producer: the consumer cannot have them back either). A cheap read.
        """
        try:
            return self._leased + self._words[W_HELD] >= self._slots
        except ValueError:  # the mapping was let go: released memoryview
            return self._leased >= self._slots

    def statistics(self) -> RingStatistics:
        """The ring's counters now (after this side closed: as they were at its close)."""
        with self._lock:
            if self._final is not None:
                return self._final
            return self._snapshot()

    def _snapshot(self) -> RingStatistics:
        return snapshot(self._words, bytes(self._states))

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
            word = W_PRODUCER if role is _PRODUCER else W_CONSUMER
            words = self._words
            unclaimed = (self._producer if role is _PRODUCER else self._consumer) is None
            claim_word(words, word, unclaimed, self._name, role)
            if role is _PRODUCER:
                os.set_blocking(self._free_r, False)  # only the producer reads it (_wait_free)
                states = self._states
                self._free = [i for i in range(self._slots - 1, -1, -1) if states[i] == FREE]
                self._items, self._bytes = words[W_ITEMS], words[W_BYTES]
                self._put_wait_ns = words[W_PUT_WAIT_NS]
                self._zero_copy, self._copies = words[W_ZERO_COPY], words[W_COPIES]
                self._producer = _get_ident()
            else:
                self._get_wait_ns = words[W_GET_WAIT_NS]
                self._spin_ns = words[W_SPIN_NS]
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
