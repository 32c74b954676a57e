"""The producer's side of a ring's zero copy: a slot leased out to be written in place.

:meth:`ShmRing.lease <rxstream.ipc.ShmRing.lease>` takes a free slot and hands out a numpy
array over the end of it; the producer fills it and puts it (as the item, or inside it).
``put`` finds the array's memory in a leased slot of its own ring, writes the item's header
(and any other, small, buffer) into the room before it, and commits that slot: the consumer's
views are views of the very memory the producer wrote, and nothing is copied.

A slot is reused only when no view of it lives on either side: the consumer's views hand it
back as before (the free pipe), and while views of the lease live in the producer, ``put``
sets a slot the consumer gave back aside (:meth:`Lessor.vet`) until the last of them goes; a
lease that is never put (the stage dropped it, or failed) goes back to the free pipe when its
last view goes.

The copy path must always have a slot to wait for, one that neither side keeps: a lease is
refused (``None``: the stage gets a plain array, its item is copied) when it would leave no
slot outside the producer's leases and the consumer's held items (the ``W_TAKEN`` word), and
the consumer copies an item out of its slot when keeping it would (``ShmRing.all_leased``
counts the producer's leases, put or not, in ``W_HELD``). Each side writes its own word before
it reads the other's, so of a lease and a ``get`` that cross, at least one sees the other.
Such a lease is not refused at once: it first waits (``LEASE_WAIT_S`` at most, or the
caller's ``timeout`` if shorter) for the consumer to hand a slot back, which a reader a few
frames behind does as it catches up (a rank boundary's reading side holds items in its
inboxes). The copy path never waits on it: the lease took nothing yet. A wait that runs
out means the consumer keeps its items until more come (a window): that producer's leases
are refused at once from then on (a wait cut short by the caller's ``timeout`` says nothing
of the kind).

This module is the ring's friend: it works on :class:`ShmRing`'s internals.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rxstream._exceptions import RingClosed
from rxstream.ipc._ringlayout import (
    W_COPIES,
    W_HELD,
    W_PUT_WAIT_NS,
    W_TAKEN,
    W_ZERO_COPY,
    read_indices,
    readable,
    slot_head,
)

if TYPE_CHECKING:
    from rxstream.ipc._ring import ShmRing

__all__ = [
    "HEAD_ROOM",
    "LEASE_WAIT_S",
    "W_COPIES",
    "W_HELD",
    "W_TAKEN",
    "W_ZERO_COPY",
    "Lessor",
]


HEAD_ROOM = 4096
"""The bytes a lease leaves before its array in the slot: the slot's table and the item's
pickle header (a boundary's metadata and stamps take a few hundred)."""

LEASE_WAIT_S = 0.2
"""How long a lease that would leave the copy path no slot waits, the first time, for the
consumer to hand one back (a reader a few frames behind does within a frame or two)."""

_ALIGN = 64
_LEASED = 2  # the slot state of a slot leased out and not put yet (0 free, 1 written)


class _Lease:
    """One leased slot: where its array starts, how long it is, whether it was put."""

    __slots__ = ("at", "nbytes", "returned", "sent")

    def __init__(self, at: int, nbytes: int) -> None:
        self.at = at
        self.nbytes = nbytes
        self.sent = False  # put: the consumer hands the slot back through the free pipe
        self.returned = False  # the consumer handed it back while producer views lived


class Lessor:
    """The leases of one ring's producer; made by the ring's first ``lease``."""

    def __init__(self, ring: ShmRing) -> None:
        self._ring = ring
        self._address = ring._array.ctypes.data + ring._start  # slot 0, in this mapping
        self.slots: dict[int, _Lease] = {}
        """The slots whose leased arrays (or views of them) live in this process."""
        self.pending = 0
        """Leases not put yet: ``put`` looks for its buffers in them only then."""
        self.patience = LEASE_WAIT_S
        """How long a lease that would leave the copy path no slot waits for the consumer to
        hand one back (0 once such a wait ran out: refused at once)."""

    def lease(
        self, shape: Sequence[int], dtype: Any, timeout: float | None
    ) -> np.ndarray[Any, Any] | None:
        """An array over a free slot, or ``None`` (it does not fit, or enough are leased)."""
        ring = self._ring
        kind = np.dtype(dtype)
        size = tuple(int(n) for n in shape)
        nbytes = math.prod(size) * kind.itemsize
        at = (ring._slot_bytes - nbytes) & -_ALIGN
        if kind.hasobject or at < HEAD_ROOM:
            return None
        words = ring._words
        if not self._room(timeout):
            return None
        try:
            slot = self.vet(ring._free.pop() if ring._free else ring._wait_free(timeout), timeout)
        except BaseException as exc:  # closed, timed out: no lease, the count as it was
            with ring._lock:
                if not ring._released:
                    words[W_HELD] = len(self.slots)
            if isinstance(exc, RingClosed):
                return None
            raise
        base = ring._start + slot * ring._stride
        owner = ring._array[base : base + ring._stride]  # every view of the lease keeps it
        with ring._lock:
            self.slots[slot] = _Lease(at, nbytes)
            self.pending += 1
            words[W_HELD] = len(self.slots)  # a lease gone while this one waited rewrote it
        ring._states[slot] = _LEASED
        lease = weakref.finalize(owner, self._gone, slot)
        lease.atexit = False
        return np.frombuffer(owner.data[at : at + nbytes], kind).reshape(size)

    def _room(self, timeout: float | None) -> bool:
        """Count one more lease in ``W_HELD`` if that leaves the copy path a slot (whether it
        did); else wait up to ``patience`` s (the caller's ``timeout`` if shorter) for the
        consumer to hand slots back.

        The wait ends at the consumer's first hand-back that makes room. One that runs its
        whole ``patience`` out tells this producer that its consumer keeps its items (it waits
        for more to come): from then on such a lease is refused at once. A wait cut short by
        the caller's ``timeout`` tells nothing: it leaves ``patience`` as it was.
        """
        ring = self._ring
        words = ring._words
        deadline = 0.0
        patient = True  # the wait is bounded by ``patience``, not by the caller's timeout
        while True:
            with ring._lock:
                held = len(self.slots) + 1
                words[W_HELD] = held  # first: a get crossing this lease sees it (docstring)
                taken = words[W_TAKEN]
                if held + taken < ring._slots:
                    return True
                words[W_HELD] = held - 1  # leave the copy path a slot
            if self.patience <= 0 or not taken or ring._closed:
                return False  # (the producer's own leases fill the ring: nothing to wait for)
            now = time.perf_counter()
            if not deadline:
                wait = self.patience
                if timeout is not None and timeout < wait:
                    wait, patient = max(timeout, 0.0), False
                deadline = now + wait
            # ``min``: ``(now + wait) - now`` may round above ``wait`` (the clock reads ~1e4 s)
            if now >= deadline or not self._handed_back(min(deadline - now, wait)):
                if patient:
                    self.patience = 0.0
                return False

    def _handed_back(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for slot indices in the free pipe; read them (whether any
        came; not when the ring closed). The wait is the producer's, as a full ring's
        (``on_wait`` marks it, ``_put_wait_ns`` counts it)."""
        ring = self._ring
        started = time.perf_counter()
        resume = None if ring.on_wait is None else ring.on_wait()
        try:
            if not readable(ring._free_poll, started, seconds):
                return False
            return not read_indices(ring._free_r, ring._read_size, ring._index_of, ring._free)
        finally:
            ring._put_wait_ns += int((time.perf_counter() - started) * 1e9)
            ring._words[W_PUT_WAIT_NS] = ring._put_wait_ns
            if resume is not None:
                resume()

    def vet(self, slot: int, timeout: float | None) -> int:
        """``slot``, taken from the free ones, or the next: not one whose lease lives here.

        A slot the consumer handed back while views of its lease live here is set aside;
        the last of those views hands it back again (:meth:`_gone`).
        """
        ring = self._ring
        while True:
            with ring._lock:
                lease = self.slots.get(slot)
                if lease is None:
                    return slot
                lease.returned = True
            slot = ring._free.pop() if ring._free else ring._wait_free(timeout)

    def _gone(self, slot: int) -> None:
        """The last view of ``slot``'s lease is gone here (any thread)."""
        ring = self._ring
        with ring._lock:
            lease = self.slots.pop(slot)
            if not lease.sent:
                self.pending -= 1
            if ring._released:
                return
            ring._words[W_HELD] = len(self.slots)
            if lease.sent and not lease.returned:  # the consumer's hand-back frees it
                return
            ring._states[slot] = 0
            os.write(ring._free_w, ring._index_bytes[slot])

    def put(self, header: bytes, raws: list[memoryview]) -> bool:
        """Commit the item whose buffers lie in a lease not put yet, in place; whether it did.

        Buffers outside that lease are copied into the room before it; an item that does not
        fit there (or lies in no lease) is left to the copy path.
        """
        ring = self._ring
        stride, address = ring._stride, self._address
        slot = -1
        places: list[int | None] = []
        for raw in raws:
            offset = np.frombuffer(raw, np.uint8).ctypes.data - address
            within = offset % stride if 0 <= offset < stride * ring._slots else -1
            lease = self.slots.get(offset // stride) if within >= 0 else None
            if (
                lease is not None
                and not lease.sent
                and slot in (-1, offset // stride)
                and lease.at <= within
                and within + raw.nbytes <= lease.at + lease.nbytes
            ):
                slot = offset // stride
                places.append(within)
            else:
                places.append(None)
        if slot < 0:
            return False
        lease = self.slots[slot]
        count = len(raws)
        head_at = 16 + 16 * count  # the slot's head, then the buffer table
        end = head_at + len(header)
        table: list[int] = []
        for raw, place in zip(raws, places, strict=True):
            if place is None:
                place = (end + _ALIGN - 1) & -_ALIGN
                end = place + raw.nbytes
            table += (place, raw.nbytes)
        if end > lease.at:
            return False
        base = ring._start + slot * stride
        seg = ring._seg
        slot_head(count).pack_into(seg, base, len(header), count, *table)
        seg[base + head_at : base + head_at + len(header)] = header
        for raw, place, k in zip(raws, places, range(0, 2 * count, 2), strict=True):
            if place is None:
                seg[base + table[k] : base + table[k] + raw.nbytes] = raw
        with ring._lock:
            lease.sent = True
            self.pending -= 1
        ring._zero_copy += 1
        ring._words[W_ZERO_COPY] = ring._zero_copy
        ring._commit(slot, lease.at + lease.nbytes)
        return True
