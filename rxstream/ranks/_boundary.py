"""Rank boundaries: where consecutive stages sit on different ranks.

The upstream side (the *writer*) subscribes to the upstream stage's stream on that stage's
thread and puts each item into a :class:`~rxstream.ranks._channel.Channel` (a ring), stamped
``<upstream>><downstream>.in``; a full ring blocks it, which is backpressure across the
boundary. The downstream side (the *reader*) is a thread that takes items out of the ring,
stamps ``<upstream>><downstream>.out`` and hands them to the downstream stage's inbox. The
metadata crosses unchanged but for those two stamps, so a timing record shows the boundary
as one hop whose compute is the transfer. Completion crosses as an end marker; a stopping run
closes the rings, which wakes both sides.

Zero copy has one hazard: a slot stays leased while any view of it lives, so a downstream
that keeps items (a transport holding the last frames, a window) could lease every slot and
stall the producer for good. When the reader takes an item while every slot is leased, it
copies that item out of its slot (one copy, only then), and the ring keeps flowing.

The writer's side can skip its copy too: at its first item it offers the ring to its thread
(:mod:`rxstream.ranks._lease`), so the stage there can make its output in a slot with
``ctx.lease``; the ring puts such an item in place, and the stage's counters say how many
crossed in place (``zero_copy``) and how many were copied in (``copies``).

What crosses a ring for an item (:func:`pack`) is ``(payload, the metadata's fields, the
stamp chain)``: the base metadata's ten values in field order and the chain's links as they
are, the boundary's stamp one more link. With a small plain payload (``bytes``, ``str``,
numbers, ``None``) the writer marshals that tuple and the ring carries the bytes as they are;
with any other payload the ring frames the tuple (arrays and tensors out of band). A
``torch.distributed`` channel carries :func:`encode`'s portable form instead (its reader reads
the generations and moves the stamps into its host's clock).
"""

from __future__ import annotations

import marshal
import operator
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from reactivex import Observable, abc
from reactivex.disposable import Disposable

from rxstream._exceptions import FramingError, PayloadTooLarge, PipelineError, RingClosed
from rxstream._kernel._generations import Generations
from rxstream._kernel._stats import StageCounters
from rxstream.ipc import ShmRing
from rxstream.ipc._framing import frame_array
from rxstream.item import (
    Chain,
    PipelineItem,
    PipelineMetadata,
    _chain_of,
    _extended,
    _flat,
    _from_parts,
    _parts,
    _stamped,
    _trusted_metadata,
    now,
)
from rxstream.operators._core import attach
from rxstream.ranks._channel import Channel
from rxstream.ranks._cudaxing import CudaCrossing
from rxstream.ranks._lease import offer, withdraw
from rxstream.runtime._thread import charge_stall, stall_begins
from rxstream.typing import ItemStream

__all__ = ["CATCH_UP_S", "END", "Boundary", "catch_up", "decode", "encode", "pack", "unpack"]


class _End:
    """The marker a writer puts when its upstream completed (one object per process)."""

    def __reduce__(self) -> str:
        return "END"

    def __repr__(self) -> str:
        return "END"


END = _End()


def encode(item: PipelineItem) -> tuple[Any, ...]:
    """What crosses a boundary for ``item``: plain values, cheap to pickle.

    The payload, the metadata's fields but the timeline, then the timeline flat (``hop, t``…).
    Pickling the item itself costs several times more (its classes, its dict, its stamp chain;
    figures in docs/performance.md).
    """
    md, chain = _parts(item)  # the base's timeline, then the chain's stamps, oldest first
    flat = tuple(value for stamp in md.timeline for value in stamp) + _flat(chain)
    return (
        item.payload,
        md.prompt_generation,
        md.flush_generation,
        md.cutover,
        md.drop_generation,
        md.pts,
        md.idle,
        md.capture_ts,
        md.input_seq,
        md.input_at_ms,
        flat,
    )


def decode(wire: tuple[Any, ...]) -> PipelineItem:
    """The item :func:`encode` described."""
    return _from_parts(*_decoded(wire))


def _decoded(wire: tuple[Any, ...]) -> tuple[Any, PipelineMetadata, Chain]:
    """The payload, base metadata and stamp chain (one link) of :func:`encode`'s form."""
    return wire[0], _trusted_metadata(*(*wire[1:10], ())), _chain_of(wire[10])


def pack(item: PipelineItem, payload: Any, stamps: tuple[Any, ...] = ()) -> Any:
    """What a writer puts into a ring: ``item`` carrying ``payload``, ``stamps`` one more link.

    ``stamps`` is flat (``hop, t…``). The form is ``(payload, values, chain)``: the base
    metadata's values in field order (its own timeline among them) and the stamp chain as its
    links are (flattening and relinking it cost more than the rest).

    With a small plain payload the form is marshalled here, and the ring carries the bytes as
    they are: neither side frames or pickles, which is measurably faster than :func:`encode`,
    the ring's framing and :func:`decode`, and marshal than pickle (docs/performance.md, the
    ring and boundary section). With a plain array payload (numbers in C order) the form is
    framed here with marshal too, the array out of band
    (:func:`~rxstream.ipc._framing.frame_array`).

    marshal is exact for builtin values only (it writes anything with a buffer, a numpy
    scalar, as ``bytes``), and both sides of a ring run the same interpreter. Metadata values
    are plain by construction (:class:`PipelineMetadata` and ``evolve_metadata`` make a
    numpy ``pts`` an ``int``), and the engine makes the stamps (``str``, ``float``); any other
    payload is left to the ring's pickle framing (arrays and tensors out of band).
    """
    base, link = _parts(item)
    link = _extended(link, stamps)
    values = _values(base.__dict__)
    wire = (payload, values, link)
    kind = type(payload)
    if kind in _SCALARS or (kind in _BUFFERS and len(payload) <= _INLINE_BYTES):
        try:  # version 2: no object references (nothing in the form is worth sharing)
            return marshal.dumps(wire, 2)
        except ValueError:  # not marshal's (or a chain nested too deep): framed
            pass
    elif kind is np.ndarray:  # described by marshal, the array out of band
        framed = frame_array(payload, (values, link))
        if framed is not None:
            return framed
    return wire


def unpack(got: Any) -> tuple[Any, PipelineMetadata, Chain]:
    """The payload, base metadata and stamp chain of what :func:`pack` put into a ring."""
    if type(got) is bytes:
        got = marshal.loads(got)
    payload, values, link = got
    return payload, _trusted_metadata(*values), link


def _flattened(wire: tuple[Any, ...]) -> tuple[Any, ...]:
    """:func:`pack`'s form with its chain as one link: for a chain deeper than pickle nests."""
    payload, values, link = wire
    return payload, values, None if link is None else _chain_of(_flat(link))


_FIELDS = tuple(PipelineMetadata.__dataclass_fields__)
_values = operator.itemgetter(*_FIELDS)
"""A metadata's ``__dict__`` to its values in field order (the timeline last)."""
_SCALARS = frozenset({int, float, complex, bool, type(None)})
_BUFFERS = frozenset({bytes, str})  # not bytearray: marshal gives it back as bytes
_INLINE_BYTES = 64 << 10
"""The largest ``bytes``/``str`` payload :func:`pack` marshals (a larger one is framed: the
ring's raw-bytes path would copy it once more on the reader)."""


CATCH_UP_S = 1.0
"""How long an item of a newer generation waits for this rank's replicas to reach it."""


def catch_up(replicas: Generations, prompt: int, flush: int) -> None:
    """Hold an item of generations ``prompt``/``flush`` until this rank's replicas have them.

    The controller's doc write and generation change left before the item did, but over
    another connection: the item may overtake them, and a stage here would read the doc as it
    was before the steer. The doc write goes first on that connection, so once the
    generations are here, so is the doc. Waits ``CATCH_UP_S`` at most.
    """
    if replicas.prompt >= prompt and replicas.flush >= flush:
        return
    deadline = time.monotonic() + CATCH_UP_S
    while (replicas.prompt < prompt or replicas.flush < flush) and time.monotonic() < deadline:
        time.sleep(0.001)


class Boundary:
    """One edge across ranks, as seen from this process: its ring, writer and reader."""

    def __init__(
        self,
        name: str,
        ring: Channel,
        *,
        timing: bool = True,
        cuda: CudaCrossing | None = None,
        replicas: Generations | None = None,
    ) -> None:
        self.name = name
        self.ring = ring
        self.cuda = cuda
        """How CUDA tensors cross (``None``: this process has no CUDA; they cannot)."""
        self.replicas = replicas
        """This rank's replicated generations, when another rank steers (see :func:`catch_up`);
        ``None``: the generations are this process's own."""
        self._in_hop = f"{name}.in"
        self._out_hop = f"{name}.out"
        self._timing = timing
        self._reader: threading.Thread | None = None
        self._got = 0  # items (and the end marker) the reader took out of the ring
        self._dropped: StageCounters | None = None  # the reader's stage: counts what is left

    # --- the upstream side ----------------------------------------------------------------

    def write(
        self,
        upstream: ItemStream,
        counters: StageCounters,
        stage: str,
        fail: Callable[[BaseException], None],
        on_done: Callable[[], None],
        lost: StageCounters | None = None,
        on_closed: Callable[[], None] = lambda: None,
        sole: bool = True,
    ) -> abc.DisposableBase:
        """Put every item of ``upstream`` into the ring; ``on_done`` once the end marker is in.

        Items the ring refused because the run was stopping are counted as dropped (reason
        ``stopped``) on ``lost`` (the downstream stage's counters, when it runs in this
        process: the item was on its way there), else, when this boundary is the upstream's
        ``sole`` consumer, on ``counters`` (the upstream stage's: the item never left it, so it
        is not counted as emitted either); an upstream shared with other consumers did emit
        it (they had it), and the other rank's books end with the run. ``on_closed`` runs at
        the first such item (the downstream rank is going: the caller stops making items
        nobody will read). A payload that cannot cross fails the run naming ``stage`` and the
        type.
        """
        ring = self.ring
        send = self.sender(counters)
        closed = False

        def on_next(item: PipelineItem) -> None:
            nonlocal closed
            try:
                send(item)
            except RingClosed:
                if lost is not None:
                    lost.drop("stopped")
                elif sole:  # on the upstream's thread: it counted the item out a moment ago
                    counters.items_out -= 1
                    counters.drop("stopped")
                if not closed:
                    closed = True
                    on_closed()
            except (FramingError, PayloadTooLarge) as exc:
                md = item.metadata
                if isinstance(exc, PayloadTooLarge):
                    exc = self._too_large(exc)
                fail(PipelineError(stage, exc, pts=md.pts, input_seq=md.input_seq))

        def on_completed() -> None:
            try:
                ring.put(END)
            except RingClosed:
                return
            on_done()

        return attach(upstream, on_next, fail, on_completed)

    def _too_large(self, exc: PayloadTooLarge) -> PayloadTooLarge:
        """The ring's error, with what an app can do about it (ShmRing.create is not its)."""
        mib = -(-exc.size // (1 << 20))
        return PayloadTooLarge(
            f"a framed item of {exc.size:,} bytes does not fit a slot of boundary "
            f"{self.name!r} ({exc.slot_bytes:,} bytes); give boundaries larger slots where the "
            f"pipeline is built: ctx.ring_spec = rxstream.RingSpec(slot_bytes={mib} << 20)",
            size=exc.size,
            slot_bytes=exc.slot_bytes,
        )

    def sender(self, counters: StageCounters) -> Callable[[PipelineItem], None]:
        """The writer's step for one item: stamp it, pack it and put it into the ring.

        Raises :class:`RingClosed` once the ring is closed and :class:`FramingError` for a
        payload that cannot cross. A full ring blocks it (backpressure): the wait counts on
        ``counters`` as the upstream stage's stall, not as its work.
        """
        ring = self.ring
        put = ring.put
        in_hop, timing, cuda = self._in_hop, self._timing, self.cuda
        portable = ring.portable  # across hosts: encode's form
        shm = ring if isinstance(ring, ShmRing) else None  # counts zero copies and copies
        lessor = [] if shm is None else [shm]  # offered to this thread at the first item
        if shm is not None:  # a wait on the full ring: the upstream stalled, not busy
            shm.on_wait = stall_begins

        def send(item: PipelineItem) -> None:
            started = now()
            if lessor:  # the stage on this thread may lease the ring's slots from now on
                offer(lessor.pop())
            payload = item.payload if cuda is None else cuda.export(item.payload)
            stamps = (in_hop, started) if timing else ()
            if portable:
                wire = encode(_stamped(item, payload, stamps))
            else:
                wire = pack(item, payload, stamps)
            if shm is not None:
                zero, copies = shm._zero_copy, shm._copies
            try:
                waited = put(wire)
            except FramingError as exc:
                if portable or not isinstance(exc.__cause__, RecursionError):
                    raise
                waited = put(_flattened(wire))  # a chain deeper than pickle nests
            except RingClosed as exc:  # closed while it waited (a run stopping): still a stall
                charge_stall(exc.waited_ns / 1e9, counters)
                raise
            if shm is not None:
                counters.zero_copy += shm._zero_copy - zero
                counters.copies += shm._copies - copies
            if waited:  # to the thread's owner: a stage fused onto it has no thread to stall
                charge_stall(waited / 1e9, counters)

        return send

    # --- the downstream side --------------------------------------------------------------

    def read(
        self,
        halted: Callable[[], bool],
        fail: Callable[[BaseException], None],
        counters: StageCounters,
    ) -> ItemStream:
        """The items coming out of the ring, pushed by a reader thread once subscribed.

        Items still in the ring when the run stops are counted on ``counters`` (the
        downstream stage's) as dropped, reason ``stopped``.
        """
        self._dropped = counters
        ring = self.ring
        receive = self.receiver()

        def subscribe(
            observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            def pump() -> None:
                try:
                    while not halted():
                        # no timeout: a halting run closes the ring, and the close wakes this
                        got: Any = ring.get()
                        self._got += 1
                        if got is END or isinstance(got, _End):
                            observer.on_completed()
                            return
                        item = receive(got)
                        got = None  # no lease or CUDA ref outlives its stage because of us
                        observer.on_next(item)
                        del item
                except RingClosed:
                    return
                except BaseException as exc:
                    fail(exc)

            self._reader = threading.Thread(target=pump, name=f"rxstream:{self.name}", daemon=True)
            self._reader.start()
            return Disposable()

        return Observable(subscribe)

    def receiver(self) -> Callable[[Any], PipelineItem]:
        """The reader's step for what :meth:`ShmRing.get` gave: the item, stamped.

        When every slot is leased to views that downstream keeps, the payload is copied out of
        its slot (one copy, only then), so the slot goes back and the producer goes on.
        """
        ring = self.ring
        out_hop, timing, cuda, replicas = self._out_hop, self._timing, self.cuda, self.replicas
        unwire = _decoded if ring.portable else unpack  # see sender

        def receive(got: Any) -> PipelineItem:
            payload, metadata, link = unwire(got)
            if replicas is not None:
                catch_up(replicas, metadata.prompt_generation, metadata.flush_generation)
            if type(got) is not bytes and ring.all_leased:  # this item leases the last slot
                payload = pickle.loads(pickle.dumps(payload, protocol=5))
            if cuda is not None:
                payload = cuda.open(payload)
            if timing:
                link = _extended(link, (out_hop, now()))
            return _from_parts(payload, metadata, link)

        return receive

    def close(self, timeout: float) -> bool:
        """Close the ring (waking both sides) and join the reader; whether it ended."""
        self.ring.close()
        if isinstance(self.ring, ShmRing):
            withdraw(self.ring)
        if self.cuda is not None:
            self.cuda.close()
        reader = self._reader
        ended = True
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout)
            ended = not reader.is_alive()
        if self._dropped is not None:  # what the reader never took is dropped here
            unread = self.ring.statistics().items - self._got
            if unread > 0:
                self._dropped.drop("stopped", unread)
            self._dropped = None
        return ended
