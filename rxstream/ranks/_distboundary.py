"""A rank boundary over ``torch.distributed`` point-to-point: for ranks on different hosts.

:class:`DistChannel` stands where a :class:`~rxstream.ipc.ShmRing` stands on one host: the
boundary's writer and reader (:class:`~rxstream.ranks._boundary.Boundary`) drive it through
the same ``put``/``get``/``close``/``statistics``, so an item crosses encoded exactly as it
crosses a ring (the payload, the metadata's fields and the flat stamps), stamped
``<edge>.in``/``<edge>.out`` by the boundary, its drops counted by the boundary.

On the wire, per item, in one process group of the boundary's two ranks (one group per
boundary: no two boundaries share a socket or a tag):

1. the *head*: an 8-byte length, then a pickle of the encoded item in which every large array
   or tensor (``INLINE_BYTES`` and up) is only a reference, its dtype and shape. A head that
   does not fit ``HEAD_BYTES`` sends its length alone, then the pickle as a second message;
2. one message per referenced array or tensor, its bytes as they lie (made contiguous first).

Small arrays and tensors, and every other payload, travel inside the pickle. The receiver
takes the head into a buffer it reuses, takes each tensor into memory of its own (a numpy
array comes back as numpy over that memory, a tensor as a tensor), and unpickles.

``send`` in gloo completes only once the receiver posted the matching ``recv``: a writer
waits while its reader is not taking. A writer may leave ``WINDOW`` heads in flight (an item
with arrays waits until all of it was taken: the arrays are the payload's memory); the
reader's thread takes one item ahead into a hand-off of one, and posts the next head's
receive before handing an item on. So at most four items are between the two stages, as many
as a boundary ring's slots. CUDA tensors go through the boundary's NCCL group when it has
one, else through host memory over gloo, and come back on the receiver's current CUDA device.

Stop: the writer's ``close`` sends a *close* mark after its last item, and the reader's thread
keeps taking (and dropping, counted) until that mark or the end marker arrives, so a writer
blocked in ``send`` always gets out. A broken connection while not closing means the peer
went away: ``on_lost`` fails the run with :class:`RankLost` naming the peer's rank.
"""

from __future__ import annotations

import datetime
import io
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from rxstream._exceptions import ArgumentError, FramingError, PipelineError, RankLost, RingClosed
from rxstream._kernel._generations import Generations
from rxstream.ipc import RingStatistics, ShmRing
from rxstream.ranks._boundary import CATCH_UP_S, catch_up
from rxstream.ranks._distframing import INLINE_BYTES, Pickler, Unpickler
from rxstream.ranks._factory import LinkBoundaries, RingBoundaries
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._plan import Plan
from rxstream.runtime._thread import stall_begins
from rxstream.runtime._threaded import ThreadedRun

__all__ = [
    "CATCH_UP_S",
    "HEAD_BYTES",
    "INLINE_BYTES",
    "DistChannel",
    "DistRun",
    "RankLost",
    "shift_stamps",
]

HEAD_BYTES = 4096
"""Bytes of the head message buffer; a longer pickle follows in a second message."""
WINDOW = 2
"""Heads a writer may leave in flight (items whose arrays travel wait until sent)."""
FOREVER = datetime.timedelta(days=10_000)
"""What a wait on a send or receive is given: gloo breaks the connection on a timeout."""
DRAIN_S = 1.0
"""How long a closed reader waits for its writer's close mark before it stops counting."""

_LEN = struct.Struct("<Q")
_CLOSE = (1 << 64) - 1  # the length that marks the writer's close


def _reason(exc: BaseException) -> str:
    """A gloo error's own words: without its source location and its generic advice."""
    text = str(exc)
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". This is typically", 1)[0].rstrip(".")


def shift_stamps(wire: tuple[Any, ...], shift: float) -> tuple[Any, ...]:
    """An encoded item with every stamp moved by ``shift`` seconds (into another host's clock).

    The encoding (:func:`rxstream.ranks._boundary.encode`) ends with the stamps flat:
    ``hop, t, hop, t…``.
    """
    flat = wire[-1]
    return (*wire[:-1], tuple(v + shift if i % 2 else v for i, v in enumerate(flat)))


# --- the channel ------------------------------------------------------------------------------


class _Broken(Exception):
    """A receive failed on the wire (its cause is gloo's error): the peer went away."""


def _wire(call: Callable[[list[Any], int, int], Any], tensors: list[Any], peer: int) -> Any:
    """Post a receive (``group.recv``) of ``tensors`` from ``peer``; its work."""
    try:
        return call(tensors, peer, 0)
    except RuntimeError as exc:
        raise _Broken(str(exc)) from exc


def _wait(work: Any) -> None:
    """Wait for a posted receive to complete (never timing out: gloo would break)."""
    try:
        work.wait(FOREVER)
    except RuntimeError as exc:
        raise _Broken(str(exc)) from exc


class DistChannel:
    """One side of a boundary between two ranks of a ``torch.distributed`` process group.

    ``group`` is a process group holding both ranks (gloo), ``peer`` the other side's rank in
    it; ``side`` is ``"writer"`` or ``"reader"``. ``nccl`` is an NCCL group of the same two
    ranks for CUDA tensors (``None``: they cross through host memory). ``shift`` (seconds) is
    added to every stamp the reader takes: the writer's host clock into the reader's.
    ``on_lost`` is called (once, from any thread) when the connection breaks while the channel
    is open; without it, ``put``/``get`` raise the :class:`RankLost`.
    """

    portable = True
    """It crosses hosts: a boundary puts ``encode``'s plain form (a ``Channel``)."""

    def __init__(
        self,
        name: str,
        group: Any,
        peer: int,
        *,
        side: str,
        peer_rank: int | None = None,
        nccl: Any = None,
        shift: float = 0.0,
        on_lost: Callable[[BaseException], None] | None = None,
    ) -> None:
        if side not in ("writer", "reader"):
            raise ArgumentError(f"side must be 'writer' or 'reader', got {side!r}")
        import torch

        self._torch = torch
        self.name = name
        self.side = side
        self._group = group
        self._nccl = nccl
        self._peer = peer
        self.peer_rank = peer if peer_rank is None else peer_rank
        """The other side's global rank (named in errors)."""
        self._shift = shift
        self.on_lost = on_lost
        self.catch_up: Callable[[tuple[Any, ...]], None] | None = None
        """Called by the reader's thread with each encoded item before it is handed on."""
        self._state = threading.Condition(threading.Lock())
        self._closed = False
        self._lost: BaseException | None = None
        # the writer's state
        self._sending = False
        self._ended = False  # the end marker went out: no close mark after it
        self._close_work: Any = None
        self._pending: deque[tuple[Any, Any]] = deque()  # sends posted, not yet waited for
        self._put_wait_ns = 0
        self._bytes = 0
        # the reader's state
        self._items = 0  # items (the end marker too) the reader's thread took off the wire
        self._handoff: list[Any] = []  # at most one item taken ahead, for get()
        self._get_wait_ns = 0
        self._done = False  # the reader's thread ended (end marker, close mark, or lost)
        self._thread: threading.Thread | None = None
        if side == "reader":
            self._head = torch.empty(HEAD_BYTES, dtype=torch.uint8)
            self._thread = threading.Thread(
                target=self._receive, name=f"rxstream:{name}:wire", daemon=True
            )
            self._thread.start()

    # --- the writer -----------------------------------------------------------------------

    def put(self, obj: object, timeout: float | None = None) -> int:
        """Send ``obj`` (an encoded item or the end marker); returns once the peer took it.

        Returns the nanoseconds this call waited for sends to complete. Raises
        :class:`RingClosed` once closed, :class:`FramingError` for what cannot be pickled.
        ``timeout`` is not supported (a gloo wait that times out breaks the connection): it
        must be ``None``.
        """
        if timeout is not None:
            raise ArgumentError(f"timeout must be None on a DistChannel, got {timeout!r}")
        with self._state:
            if self._closed:
                raise RingClosed(f"channel {self.name!r} is closed")
            self._sending = True
        try:
            messages = self._frame(obj)
            end = obj.__class__.__name__ == "_End"
            started = time.perf_counter_ns()
            try:
                pending = self._pending
                for group, tensor in messages:
                    pending.append((group.send([tensor], self._peer, 0), tensor))
                # a head alone is our own memory: it may stay in flight (a few at most);
                # an array's memory is the payload's, which must not change while sent
                keep = WINDOW if len(messages) == 1 and not end else 0
                if len(pending) > keep:  # waits for the peer: a stall for the watchdog
                    resume = stall_begins()
                    try:
                        while len(pending) > keep:
                            pending.popleft()[0].wait(FOREVER)
                    finally:
                        resume()
            except RuntimeError as exc:
                self._broken(exc)
            finally:
                waited = time.perf_counter_ns() - started
                self._put_wait_ns += waited
            self._bytes += sum(t.numel() for _, t in messages)
            self._ended = end
            return waited
        finally:
            with self._state:
                self._sending = False
                if self._closed:
                    self._post_close()

    def _frame(self, obj: object) -> list[tuple[Any, Any]]:
        """The messages for ``obj``: (group, uint8 tensor) each, head first."""
        torch = self._torch
        file = io.BytesIO()
        pickler = Pickler(file, torch, self._nccl is not None)
        try:
            pickler.dump(obj)
        except FramingError:
            raise
        except Exception as exc:
            payload = obj[0] if type(obj) is tuple and obj else obj
            raise FramingError(
                f"cannot send a payload of type {type(payload).__name__!r} across a rank "
                f"boundary: {exc}"
            ) from exc
        data = file.getbuffer()
        size = len(data)
        if _LEN.size + size <= HEAD_BYTES:
            head = bytearray(_LEN.size + size)
            _LEN.pack_into(head, 0, size)
            head[_LEN.size :] = data
            messages = [(self._group, torch.frombuffer(head, dtype=torch.uint8))]
        else:
            messages = [
                (self._group, torch.frombuffer(bytearray(_LEN.pack(size)), dtype=torch.uint8)),
                (self._group, torch.frombuffer(bytearray(data), dtype=torch.uint8)),
            ]
        for flat in pickler.out:
            if flat.numel():
                group = self._nccl if flat.device.type == "cuda" else self._group
                messages.append((group, flat))
        return messages

    def _post_close(self) -> None:
        """Send the close mark after the last item (under the state lock; does not block)."""
        if self.side != "writer" or self._ended or self._close_work is not None:
            return
        if self._lost is not None:
            return
        mark = self._torch.frombuffer(bytearray(_LEN.pack(_CLOSE)), dtype=self._torch.uint8)
        try:
            self._close_work = self._group.send([mark], self._peer, 0)
        except RuntimeError:  # the peer is gone already: nobody to tell
            self._close_work = False

    @property
    def put_wait_ns(self) -> int:
        """Nanoseconds ``put`` spent waiting for the peer to take (the transfer included)."""
        return self._put_wait_ns

    # --- the reader -----------------------------------------------------------------------

    def _receive(self) -> None:
        """The reader's thread: take items off the wire until the end or close mark.

        The next head's receive is posted as soon as an item is taken, before it is handed
        on: a writer's next head goes out while this one waits for ``get``.
        """
        torch, group, peer = self._torch, self._group, self._peer
        head = self._head
        head_view = head.numpy()
        try:
            posted = _wire(group.recv, [head], peer)
            while True:
                _wait(posted)
                (size,) = _LEN.unpack_from(head_view.data)
                if size == _CLOSE:
                    return
                if _LEN.size + size <= HEAD_BYTES:
                    data = head_view[_LEN.size : _LEN.size + size].tobytes()
                else:
                    body = torch.empty(size, dtype=torch.uint8)
                    _wait(_wire(group.recv, [body], peer))
                    data = body.numpy().tobytes()
                obj = Unpickler(data, self._take).load()
                self._bytes += size
                end = obj.__class__.__name__ == "_End"
                if not end:
                    posted = _wire(group.recv, [head], peer)
                if type(obj) is tuple:
                    if self._shift:
                        obj = shift_stamps(obj, self._shift)
                    if self.catch_up is not None:
                        self.catch_up(obj)
                with self._state:
                    self._items += 1
                    while self._handoff and not self._closed:
                        self._state.wait()
                    if not self._closed:
                        self._handoff.append(obj)
                        self._state.notify_all()
                del obj
                if end:
                    return
        except _Broken as exc:
            self._lose(exc.__cause__ or exc)
        except BaseException as exc:  # a payload that does not unpickle here
            with self._state:
                self._lost = exc
        finally:
            with self._state:
                self._done = True
                self._state.notify_all()

    def _take(self, nbytes: int, cuda: bool) -> Any:
        """Receive the next tensor message: ``nbytes`` bytes, on CUDA through the NCCL group."""
        torch = self._torch
        if not nbytes:  # an empty tensor sends no message
            return torch.empty(0, dtype=torch.uint8)
        if cuda and self._nccl is not None:
            flat = torch.empty(nbytes, dtype=torch.uint8, device=torch.cuda.current_device())
            _wait(_wire(self._nccl.recv, [flat], self._peer))
        else:
            flat = torch.empty(nbytes, dtype=torch.uint8)
            _wait(_wire(self._group.recv, [flat], self._peer))
        return flat

    def get(self, timeout: float | None = None) -> Any:
        """The next item taken off the wire; ``TimeoutError`` when none came in ``timeout``.

        Raises :class:`RingClosed` once closed (this side, or the writer's close mark after
        every item it sent was got).
        """
        started = time.perf_counter_ns()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with self._state:
                while not self._handoff:
                    if self._closed or self._done:
                        if self._lost is not None and not self._closed:
                            raise self._lost
                        raise RingClosed(f"channel {self.name!r} is closed")
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"no item came through channel {self.name!r}")
                    self._state.wait(remaining)
                obj = self._handoff.pop()
                self._state.notify_all()
                return obj
        finally:
            self._get_wait_ns += time.perf_counter_ns() - started

    @property
    def all_leased(self) -> bool:
        """Always false: what the reader hands on is its own memory, leased to nothing."""
        return False

    # --- both sides -----------------------------------------------------------------------

    def _broken(self, exc: RuntimeError) -> None:
        """A send failed: the peer went away (or we are closing and it closed first)."""
        with self._state:
            closing = self._closed
        if closing:
            raise RingClosed(f"channel {self.name!r} is closed") from exc
        lost = self._lose(exc)
        raise RingClosed(f"channel {self.name!r} lost its peer") from lost

    def _lose(self, exc: BaseException) -> BaseException:
        """Record the broken connection; tell ``on_lost`` unless we were closing anyway."""
        rank = self.peer_rank
        lost = PipelineError(
            f"rank {rank}",
            RankLost(
                (rank,), f"rank {rank} went away: boundary {self.name!r} broke ({_reason(exc)})"
            ),
        )
        with self._state:
            closing = self._closed
            first = self._lost is None
            if first:
                self._lost = lost
            self._state.notify_all()
        if not closing and first and self.on_lost is not None:
            self.on_lost(lost)
        return lost

    def close(self) -> None:
        """Close this side; wakes ``get``. The writer sends its close mark (without blocking);
        the reader's thread drops what still comes until that mark. Idempotent."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._handoff.clear()
            self._state.notify_all()
            if not self._sending:
                self._post_close()

    def statistics(self) -> RingStatistics:
        """Items and bytes that crossed (on a closed reader: after its drain, at most
        ``DRAIN_S``), the item handed off, and the time spent waiting on each side."""
        thread = self._thread
        if self._closed and thread is not None and thread is not threading.current_thread():
            thread.join(DRAIN_S)
        with self._state:
            return RingStatistics(
                items=self._items,
                bytes=self._bytes,
                slots_in_use=len(self._handoff),
                put_wait_s=self._put_wait_ns / 1e9,
                get_wait_s=self._get_wait_ns / 1e9,
            )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<DistChannel {self.name!r} {self.side} of rank {self.peer_rank}, {state}>"


# --- a run over channels ----------------------------------------------------------------------


class DistRun(ThreadedRun):
    """A rank's run whose boundaries named in ``links`` cross over a :class:`DistChannel`.

    The others cross over ``rings`` as in a
    :class:`~rxstream.runtime._threaded.ThreadedRun`. A channel without an ``on_lost`` fails
    this run when its connection breaks.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        links: Mapping[str, DistChannel],
        bridge: AsyncBridge,
        generations: Generations,
        timing: bool = True,
        rank: int | None = None,
        rings: Mapping[str, ShmRing] | None = None,
        releases: Mapping[str, tuple[Connection, Connection]] | None = None,
        cuda_api: Any = None,
        busy_limit_s: float | None = None,
        nvtx: bool | None = None,
    ) -> None:
        self._links = dict(links)
        for link in self._links.values():
            if link.on_lost is None:
                link.on_lost = self.fail
            if link.side == "reader":
                link.catch_up = self._catch_up
        super().__init__(
            plan,
            bridge=bridge,
            generations=generations,
            timing=timing,
            rank=rank,
            boundaries=LinkBoundaries(
                self._links, RingBoundaries(rings=rings, releases=releases, cuda_api=cuda_api)
            ),
            replica=rank is not None and rank != 0,  # rank 0 steers; rings catch up as the wire
            busy_limit_s=busy_limit_s,
            cuda_api=cuda_api,
            nvtx=nvtx,
        )

    def _catch_up(self, wire: tuple[Any, ...]) -> None:
        """Hold an item of a generation this rank has not seen until its replicas have it."""
        catch_up(self.generations, wire[1], wire[2])  # see encode: the generations
