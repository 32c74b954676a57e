"""A ring's shared-memory layout, its geometry and the types both sides of it share.

One segment holds a header and N slots::

    [ 16 int64 words | one state byte per slot ]  padded to 64 bytes
    [ slot 0 ][ slot 1 ] ... [ slot N-1 ]         slot_bytes each, padded to 64 bytes

A slot holds one item as :func:`~rxstream.ipc.frame` made it: ``header_len, n_buffers``, an
``(offset, length)`` pair per buffer, the pickle header, then each buffer at a 64-byte aligned
offset (a ``bytes`` item is stored as is, unpickled). The header's words are named ``W_*``
here (the zero-copy ones used by :mod:`rxstream.ipc._lease`); the pipes carry slot indices packed
as ``INDEX``, and ``CLOSE_MARK`` when a side closes.
"""

import math
import os
import pickle
import select
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection

from rxstream._exceptions import ArgumentError, ArgumentTypeError, PayloadTooLarge, RingConflict
from rxstream.ipc._framing import Buffer

__all__ = [
    "ALIGN",
    "BIG_COPY",
    "CLOSE_MARK",
    "CLOSE_MARK_BYTES",
    "COUNTS",
    "FREE",
    "INDEX",
    "MAGIC",
    "MAX_SLOTS",
    "MIN_SLOT_BYTES",
    "NAME_PREFIX",
    "RAW_BYTES",
    "READY",
    "SLOT_HEAD",
    "WORDS",
    "W_BYTES",
    "W_CLOSED",
    "W_CONSUMER",
    "W_COPIES",
    "W_GET_WAIT_NS",
    "W_HELD",
    "W_ITEMS",
    "W_MAGIC",
    "W_PRODUCER",
    "W_PUT_WAIT_NS",
    "W_SENT",
    "W_SLOTS",
    "W_SLOT_BYTES",
    "W_SPIN_NS",
    "W_TAKEN",
    "W_ZERO_COPY",
    "RingHandle",
    "RingSpec",
    "RingStatistics",
    "align",
    "as_bytes",
    "check_geometry",
    "claim_word",
    "read_indices",
    "readable",
    "slot_head",
    "snapshot",
    "too_large",
]

NAME_PREFIX = "rxs_"
"""The prefix of the segment names :meth:`ShmRing.create` makes up: ``rxs_<pid>_<hex>``, the
creating process's pid, so a process (a test) can tell its own segments from others'."""
MAX_SLOTS = 1024
"""The most slots a ring takes: the pipes hold every index in flight without blocking."""
MIN_SLOT_BYTES = 256
"""The smallest slot a ring takes."""

ALIGN = 64
MAGIC = int.from_bytes(b"RXSRING1", "little")
# the header's int64 words
W_MAGIC, W_SLOTS, W_SLOT_BYTES, W_CLOSED = 0, 1, 2, 3
W_PRODUCER, W_CONSUMER = 4, 5  # (pid << 32) | native thread id of the first caller
W_ITEMS, W_BYTES, W_PUT_WAIT_NS, W_GET_WAIT_NS = 6, 7, 8, 9
W_ZERO_COPY, W_COPIES, W_HELD = 10, 11, 12
"""The words for the items put in place, the items copied in, and the slots the producer
holds leased (:mod:`rxstream.ipc._lease`): not put yet, or put with views of them alive in
the producer (``ShmRing.all_leased`` counts them: the consumer cannot have those back)."""
W_SENT = 13  # items told of: the ready pipe written (the consumer's spin watches it)
W_TAKEN = 14
"""The word for the slots whose items' views the consumer holds (its ``get``'s leases; a
producer's ``lease`` reads it)."""
W_SPIN_NS = 15  # how long the consumer spins before it sleeps (rxstream.ipc._wake)
WORDS = 16
# slot states: written (and maybe leased) until the consumer hands the slot back
FREE, READY = 0, 1

INDEX = struct.Struct("<I")
CLOSE_MARK = 0xFFFF_FFFF
CLOSE_MARK_BYTES = INDEX.pack(CLOSE_MARK)
SLOT_HEAD = struct.Struct("<QQ")  # header_len, n_buffers; then (offset, length) per buffer
COUNTS = struct.Struct("<qq")  # the words items, bytes
RAW_BYTES = (1 << 64) - 1  # n_buffers of a ``bytes`` item, stored as is instead of pickled
BIG_COPY = 1 << 16
"""Buffers from this size on are copied by numpy, which lets other threads run meanwhile."""


def align(n: int) -> int:
    return (n + ALIGN - 1) & -ALIGN


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
        check_geometry(self.slots, self.slot_bytes)


def check_geometry(slots: int, slot_bytes: int) -> None:
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


_heads: dict[int, struct.Struct] = {}


def slot_head(count: int) -> struct.Struct:
    """The struct of a slot's head and table for ``count`` buffers: ``header_len, count``,
    then an ``(offset, length)`` pair per buffer (one pack per item, made once per count)."""
    head = _heads.get(count)
    if head is None:
        head = _heads[count] = struct.Struct(f"<{2 + 2 * count}Q")
    return head


def as_bytes(buffer: Buffer) -> memoryview:
    """``buffer``'s bytes as a flat byte view."""
    if type(buffer) is pickle.PickleBuffer:  # what framing hands out: flat bytes already
        return buffer.raw()
    if isinstance(buffer, memoryview):
        return buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer
    return buffer.raw()


def readable(poller: select.poll, started: float, timeout: float) -> bool:
    """Wait until ``poller``'s pipe has something to read, at most ``timeout`` s from
    ``started``."""
    return bool(poller.poll(max(0, math.ceil((started + timeout - time.perf_counter()) * 1000))))


def read_indices(
    fd: int, size: int, index_of: dict[bytes, int], into: list[int] | deque[int]
) -> bool:
    """Read the slot indices waiting in pipe ``fd`` (at most ``size`` bytes) into ``into``;
    whether a close came. ``index_of`` maps one packed index to its slot. A non-blocking
    ``fd`` with nothing in it reads as nothing (the producer's free pipe)."""
    try:
        data = os.read(fd, size)
    except BlockingIOError:
        return False
    index = index_of.get(data)  # the common case: one index
    if index is not None:
        into.append(index)
        return False
    if not data:  # every writer gone (cannot happen while this side holds its own)
        return True
    closed = False
    for (index,) in INDEX.iter_unpack(data):
        if index == CLOSE_MARK:
            closed = True
        else:
            into.append(index)
    return closed


def too_large(size: int, slot_bytes: int) -> PayloadTooLarge:
    """The error for a framed item of ``size`` bytes in a ring of ``slot_bytes`` slots."""
    return PayloadTooLarge(
        f"a framed item of {size:,} bytes does not fit a ring slot of "
        f"{slot_bytes:,} bytes; create the ring with a larger slot_bytes= "
        f"(at least {size:,})",
        size=size,
        slot_bytes=slot_bytes,
    )


def claim_word(words: memoryview, word: int, unclaimed: bool, name: str, role: str) -> None:
    """Claim the role in header word ``word`` (``W_PRODUCER``/``W_CONSUMER``) for the calling
    thread, or raise :class:`RingConflict`; ``unclaimed``: this ring object has no one in it.

    The first caller's pid and native thread id go into the segment, so the other process sees
    them too (best effort across processes: no atomic compare-and-swap here).
    """
    mine = (os.getpid() << 32) | threading.get_native_id()
    claimed = False
    if unclaimed and not words[word]:
        words[word] = mine
        claimed = True
    first = words[word]
    if not claimed or first != mine:  # another thread, process or ring object was first
        call = "put" if word == W_PRODUCER else "get"
        where = " through another ShmRing object" if first == mine else ""
        raise RingConflict(
            f"ring {name!r} already has a {role} (pid {first >> 32}, thread "
            f"{first & 0xFFFF_FFFF}); {call} called from pid {mine >> 32}, thread "
            f"{mine & 0xFFFF_FFFF}{where}: a ring has one {role}"
        )


def snapshot(words: memoryview, states: bytes) -> RingStatistics:
    """A ring's statistics from its header ``words`` and slot ``states``."""
    return RingStatistics(
        items=words[W_ITEMS],
        bytes=words[W_BYTES],
        slots_in_use=len(states) - states.count(FREE),
        put_wait_s=words[W_PUT_WAIT_NS] / 1e9,
        get_wait_s=words[W_GET_WAIT_NS] / 1e9,
        zero_copy=words[W_ZERO_COPY],
        copies=words[W_COPIES],
    )
