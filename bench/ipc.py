"""The shared-memory ring between two processes, side by side with its baselines, in one run.

Every figure is a ratio to a baseline measured in the same run, repetition by repetition
(see docs/performance.md, "How to measure": absolute times on the shared machines drift 2-3x
from one hour to the next, ratios much less).

Payloads: a 1080x1920x3 uint8 frame (6.2 MB), a 512x512x4 float32 array (4.2 MB) and 1 KB of
bytes. Producer: this process. Consumer: a spawned process per transport, started once, that
takes each item, touches it (its first and last element, in place where the transport allows)
and drops it:

- ``ShmRing``: ``ring.put`` / ``ring.get`` (8 slots of 8 MiB), read in place.
- ``ShmRing``, zero copy (arrays only): the producer leases a slot (``ring.lease``), renders
  the frame into it and puts it: only the header is written, the consumer reads the slot the
  producer wrote. "Renders" is a stamp of the first and last element: what a stage would
  compute is its own cost, not the crossing's, and the row measures the crossing.
- rxstream boundary, zero copy: the same, the leased frame the payload of a ``PipelineItem``
  sent by a ``Boundary``'s sender (a stage that returns ``ctx.lease``'s array).
- rxstream boundary: the same ring carrying what a rank boundary carries: a ``PipelineItem``
  (metadata, a stamp chain of three hops and the boundary's own stamp), put by a
  ``Boundary``'s sender and, after the reader's ``get``, rebuilt by its receiver: the code a
  rank boundary runs per item.
- ``multiprocessing.Queue``: the array pickled through the queue's pipe (a feeder thread).
- ``torch.multiprocessing`` Queue, fresh tensor: each item a new CPU tensor (made before the
  clock starts), moved to shared memory by torch's reducer and mapped by the consumer.
- ``multiprocessing.Pipe`` ``send_bytes`` / ``recv_bytes`` (1 KB only): the floor for a
  message between two processes.
- ``numpy.copyto`` in one process, one thread (frames only): the physical limit, one memcpy;
  and the same into two shared-memory slots in turn, the copy a pipelined ring cannot avoid.
  Their latency is the median of single copies; their throughput, like a transport's, the
  wall time of a batch of copies back to back (pauses and interrupts in it: a rate taken as
  1 / the median copy leaves those out, and no transport could reach it; the bench prints
  the ring against that one too, for the record).
- ``DistChannel`` over gloo: the cross-host boundary's transport (``torch.distributed``
  point-to-point, gloo over 127.0.0.1) between the two processes, carrying the payload alone;
  and the same carrying the boundary's ``PipelineItem`` encoding, the cross-host counterpart
  of the shared-memory boundary row.

Every consumer acks the same way, one byte back over a bare ``multiprocessing.Pipe``, so the
transports differ on the forward path only.

Placement (``--placement``, see ``PLACEMENTS``): by default the producer runs on CPU 0 and
every consumer on CPU 1, two ranks on two cores; ``os`` leaves it to the scheduler, ``same``
puts everything on CPU 0 (the software's own cost, steady to 1%).

Measures, per payload and transport:
1. latency, one in flight: put, then wait for the consumer's ack; median round trip.
2. throughput: N items put as fast as the transport takes them; the consumer acks the last.

Run ``python bench/ipc.py`` (about a minute) or ``python bench/ipc.py --quick`` (a few
seconds, a smoke run whose ratios are indicative only).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import multiprocessing
import os
import pickle
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

# `python bench/ipc.py` from a checkout where the package is not installed: the repo root
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from rxstream._kernel._stats import StageCounters
from rxstream.distributed import DistChannel, open_group
from rxstream.ipc import RingHandle, ShmRing
from rxstream.item import PipelineItem, PipelineMetadata, _stamped
from rxstream.ranks._boundary import Boundary, decode, encode

SPAWN = multiprocessing.get_context("spawn")
STOP = None
LAT, TPUT = "latency", "throughput"
DASH = "\N{EN DASH}"

FRAME, TENSOR, SMALL = "1080x1920x3 uint8 (6.2 MB)", "512x512x4 float32 (4.2 MB)", "1 KB bytes"
MEMCPY = "numpy.copyto, one process (memcpy)"
SLOTS_COPY = "numpy.copyto into 2 shared-memory slots in turn (info)"
SLOTS_MEDIAN = "the same, its rate taken as 1 / the median copy"
RING = "ShmRing, read in place"
LEASE = "ShmRing, zero copy: rendered into a leased slot"
BOUNDARY_LEASE = "rxstream boundary, zero copy: PipelineItem of a leased frame"
BOUNDARY = "rxstream boundary: PipelineItem in ShmRing"
QUEUE = "multiprocessing.Queue"
TORCH = "torch.multiprocessing Queue, fresh tensor"
PIPE = "multiprocessing.Pipe send_bytes"
GLOO = "DistChannel over gloo, loopback"
GLOO_BOUNDARY = "rxstream boundary: PipelineItem over gloo, loopback"


def make_payload(name: str) -> Any:
    """The payload ``name`` stands for (non-zero, so a lazy copy cannot cheat)."""
    if name == FRAME:
        return (
            (np.arange(1080 * 1920 * 3, dtype=np.uint32) % 251)
            .astype(np.uint8)
            .reshape(1080, 1920, 3)
        )
    if name == TENSOR:
        return np.linspace(0, 1, 512 * 512 * 4, dtype=np.float32).reshape(512, 512, 4)
    return bytes(range(256)) * 4


def nbytes(payload: Any) -> int:
    return payload.nbytes if isinstance(payload, np.ndarray) else len(payload)


def touch(item: Any) -> int:
    """Read the first and last element of ``item`` (array, tensor or bytes)."""
    if isinstance(item, bytes):
        return item[0] + item[-1]
    flat = item.reshape(-1) if isinstance(item, np.ndarray) else item.view(-1)  # or a tensor
    return int(flat[0]) + int(flat[-1])


PLACEMENTS = {"cross": (0, 1), "os": None, "same": (0, 0)}
"""Where the producer and the consumers run: ``cross`` (the default) pins the producer to CPU 0
and every consumer to CPU 1, as two ranks on two cores; ``os`` leaves it to the scheduler;
``same`` puts them all on CPU 0 (no cross-core wake-up: the software's own cost).

Placement moves a round trip more than any transport does: on these 2-core VMs the same
Pipe round trip takes ~11 µs on one core and 40-60 µs across cores, and unpinned processes
land either way, each consumer its own way and from one repetition to the next (the
scheduler moves a woken process next to its waker, or not), so with ``os`` a baseline and a
transport are often not measured under the same conditions."""
_PLACEMENT = "RXSTREAM_BENCH_CONSUMER_CPU"
"""The environment variable that tells spawned consumers their CPU (empty: anywhere)."""


def pin(cpu: int | None) -> None:
    """Run this process on ``cpu`` only (``None``, or a CPU the machine lacks: anywhere)."""
    if cpu is not None and hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def consumer_cpu() -> int | None:
    """The CPU this run's consumers go to (from the environment the producer set)."""
    value = os.environ.get(_PLACEMENT, "")
    return int(value) if value else None


HOP = "b>c"
"""The boundary's name: between stages ``b`` (this process) and ``c`` (the consumer)."""


def upstream_item() -> PipelineItem:
    """An item as it reaches a boundary: metadata and the stamps of three stages before it."""
    t = time.monotonic()
    head = PipelineItem(None, PipelineMetadata(pts=7, input_seq=3, input_at_ms=1))
    for stage in ("src", "a", "b"):
        head = _stamped(head, None, (f"{stage}.in", t, f"{stage}.out", t))
    return head


# --- consumers (spawned) --------------------------------------------------------------------


def serve(get: Callable[[], Any], acks: Connection) -> None:
    """The consumer loop every transport shares: a command, then its items; acks on a Pipe."""
    gc.disable()
    pin(consumer_cpu())
    ack = acks.send_bytes
    ack(b"k")  # ready: imports done
    while True:
        command = get()
        if command is STOP:
            return
        mode, count = command
        for _ in range(count):
            item = get()
            touch(item)
            del item
            if mode == LAT:
                ack(b"k")
        if mode == TPUT:
            ack(b"k")


def ring_consumer(data: RingHandle, acks: Connection) -> None:
    ring = ShmRing.attach(data)
    try:
        serve(ring.get, acks)
    finally:
        ring.close()


def boundary_consumer(data: RingHandle, acks: Connection) -> None:
    ring = ShmRing.attach(data)
    receive = Boundary(HOP, ring).receiver()

    def get() -> Any:  # what the boundary's reader does: get, then its receiver
        value = ring.get()
        if type(value) is not bytes and not (isinstance(value, tuple) and len(value) == 3):
            return value  # a command: a 2-tuple, or STOP
        return receive(value).payload

    try:
        serve(get, acks)
    finally:
        ring.close()


def gloo_consumer(data: tuple[int, bool], acks: Connection) -> None:
    """The reader side of a DistChannel, rank 1 of a gloo group made with the producer."""
    port, items = data
    group = open_group(1, 2, port=port, timeout=60)
    channel = DistChannel("bench", group, 0, side="reader")

    def get() -> Any:
        value = channel.get()
        wire = items and isinstance(value, tuple) and len(value) == 11  # commands: 2-tuples
        return decode(value).payload if wire else value

    try:
        serve(get, acks)
    finally:
        channel.close()


def queue_consumer(data: Any, acks: Connection) -> None:
    serve(data.get, acks)


def torch_consumer(data: Any, acks: Connection) -> None:
    import torch.multiprocessing  # noqa: F401  (the tensor reducers)

    serve(data.get, acks)


def pipe_consumer(data: Connection, acks: Connection) -> None:
    def get() -> Any:  # commands are pickles (b"\x80..."); the 1 KB payload starts with 0
        message = data.recv_bytes()
        return message if message[:1] != b"\x80" else pickle.loads(message)

    serve(get, acks)


# --- the producer's side of each transport --------------------------------------------------


class Transport:
    """Put an item or a command; the consumer process behind it acks over a bare Pipe."""

    put: Callable[[Any], object]
    """Hand one item (or command) to the consumer."""

    def __init__(self, name: str, context: Any, target: Callable[..., None], data: Any) -> None:
        self.name = name
        self.acks, theirs = context.Pipe(duplex=False)
        self.ack = self.acks.recv_bytes
        """Wait for the consumer's next ack."""
        self.process = context.Process(target=target, args=(data, theirs), daemon=True)

    def started(self) -> None:
        """Called once the consumer process started (before its ready ack)."""

    def command(self, value: Any) -> None:
        self.put(value)

    def close(self) -> None:
        self.command(STOP)
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.acks.close()


class RingTransport(Transport):
    def __init__(self) -> None:
        self.ring = ShmRing.create(slots=8, slot_bytes=8 << 20)
        super().__init__(RING, SPAWN, ring_consumer, self.ring.handle())
        self.put = self.ring.put

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.ring.close()
            self.ring.unlink()


Render = Callable[[np.ndarray[Any, Any], Any], None]
"""``render(frame, payload)``: fill a leased ``frame`` shaped as the ``payload`` array."""


def stamp_render() -> Render:
    """This bench's render: a stamp of the first and last element (the payload unread)."""
    stamp = itertools.count()

    def render(frame: np.ndarray[Any, Any], _payload: Any) -> None:
        flat = frame.reshape(-1)
        flat[0] = flat[-1] = next(stamp) % 100

    return render


def leasing(ring: ShmRing, render: Render | None = None) -> Callable[[Any], None]:
    """A put that leases a slot of its payload's shape and dtype, renders into it (by default
    :func:`stamp_render`'s stamp) and puts it; a payload that is no array goes as it is."""
    put = ring.put
    lease = ring.lease
    fill = stamp_render() if render is None else render

    def put_leased(payload: Any) -> None:
        if not isinstance(payload, np.ndarray):  # a command
            put(payload)
            return
        frame = lease(payload.shape, payload.dtype)
        assert frame is not None, "the frame does not fit a slot"
        fill(frame, payload)
        put(frame)

    return put_leased


def leased_sender(ring: ShmRing, render: Render | None = None) -> Callable[[Any], None]:
    """A ``Boundary``'s sender on ``ring`` whose every (array) payload is rendered into a
    leased slot (by default :func:`stamp_render`'s stamp) and sent as a ``PipelineItem``:
    what a stage that returns ``ctx.lease``'s array makes the boundary do."""
    send = Boundary(HOP, ring).sender(StageCounters("b", "pipe"))
    head = upstream_item()
    lease = ring.lease
    fill = stamp_render() if render is None else render

    def put_leased(payload: Any) -> None:
        frame = lease(payload.shape, payload.dtype)
        assert frame is not None, "the frame does not fit a slot"
        fill(frame, payload)
        send(_stamped(head, frame, ()))

    return put_leased


class LeaseTransport(RingTransport):
    """The ring, every array rendered into a leased slot (zero copy)."""

    def __init__(self) -> None:
        self.ring = ShmRing.create(slots=8, slot_bytes=8 << 20)
        Transport.__init__(self, LEASE, SPAWN, ring_consumer, self.ring.handle())
        self.put = leasing(self.ring)


class BoundaryTransport(RingTransport):
    """The ring with items sent by a boundary's writer (commands go as they are)."""

    def __init__(self) -> None:
        self.ring = ShmRing.create(slots=8, slot_bytes=8 << 20)
        Transport.__init__(self, BOUNDARY, SPAWN, boundary_consumer, self.ring.handle())
        send = Boundary(HOP, self.ring).sender(StageCounters("b", "pipe"))
        head = upstream_item()
        made: dict[int, PipelineItem] = {}  # per payload, the item the upstream stage made

        def put_item(payload: Any) -> None:
            item = made.get(id(payload))
            if item is None or item.payload is not payload:
                made.clear()
                made[id(payload)] = item = _stamped(head, payload, ())
            send(item)

        self.put = put_item

    def command(self, value: Any) -> None:
        self.ring.put(value)


class BoundaryLeaseTransport(BoundaryTransport):
    """The boundary, every array payload rendered into a leased slot (zero copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = BOUNDARY_LEASE
        self.put = leased_sender(self.ring)


class GlooTransport(Transport):
    """A DistChannel writer to the consumer over gloo; with ``items``, boundary-encoded."""

    def __init__(self, items: bool) -> None:
        with socket.socket() as probe:  # a free port for the store
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.items = items
        super().__init__(GLOO_BOUNDARY if items else GLOO, SPAWN, gloo_consumer, (self.port, items))
        self.channel: DistChannel | None = None

    def started(self) -> None:
        """Join the group (the consumer joins it as it starts) and open the channel."""
        channel = DistChannel(
            "bench", open_group(0, 2, port=self.port, timeout=60), 1, side="writer"
        )
        self.channel = channel
        if not self.items:
            self.put = channel.put
            return
        head = upstream_item()
        put = channel.put

        def put_item(payload: Any) -> None:
            put(encode(_stamped(head, payload, ("b>c.in", time.monotonic()))))

        self.put = put_item

    def command(self, value: Any) -> None:
        assert self.channel is not None
        self.channel.put(value)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.channel is not None:
                self.channel.close()


class QueueTransport(Transport):
    def __init__(self, name: str, context: Any, target: Callable[..., None]) -> None:
        self.queue = context.Queue()
        super().__init__(name, context, target, self.queue)
        self.put = self.queue.put

    def close(self) -> None:
        super().close()
        self.queue.close()
        self.queue.join_thread()


class PipeTransport(Transport):
    def __init__(self) -> None:
        theirs, self.data = SPAWN.Pipe(duplex=False)
        super().__init__(PIPE, SPAWN, pipe_consumer, theirs)
        self.put = self.data.send_bytes

    def command(self, value: Any) -> None:
        self.data.send_bytes(pickle.dumps(value))

    def close(self) -> None:
        super().close()
        self.data.close()


# --- measuring ------------------------------------------------------------------------------

_perf = time.perf_counter


def latency(transport: Transport, items: Callable[[], Any], trips: int) -> float:
    """Median seconds from put to the consumer's ack, one item in flight."""
    warm = max(3, trips // 10)
    transport.command((LAT, warm + trips))
    samples: list[float] = []
    put, ack = transport.put, transport.ack
    for i in range(warm + trips):
        item = items()
        started = _perf()
        put(item)
        ack()
        if i >= warm:
            samples.append(_perf() - started)
        del item
    return statistics.median(samples)


def throughput(transport: Transport, batch: list[Any]) -> float:
    """Items per second through ``transport``: ``batch`` put back to back, the last acked."""
    transport.command((TPUT, len(batch)))
    put = transport.put
    started = _perf()
    for item in batch:
        put(item)
    transport.ack()
    return len(batch) / (_perf() - started)


def memcpy(payload: np.ndarray[Any, Any], trips: int, batch: int) -> tuple[float, float]:
    """One ``numpy.copyto`` of ``payload`` into a warm buffer: the median seconds of
    ``trips`` copies, and copies per second over ``batch`` back to back (see
    :func:`_copies`)."""
    target = np.empty_like(payload)
    return _copies(payload, [target], trips, batch)


def slots_copy(payload: np.ndarray[Any, Any], trips: int, batch: int) -> tuple[float, float]:
    """``numpy.copyto`` of ``payload`` into two shared-memory buffers in turn: what a
    pipelined ring's writer must do (its reader still holds the other slot), with no
    transport around it. The median seconds of one and the copies per second, as
    :func:`_copies`."""
    data = payload.reshape(-1).view(np.uint8)
    with ShmRing.create(slots=2, slot_bytes=data.nbytes) as ring:
        whole = ring._array  # the segment: two slots after the header
        starts = (ring._start, ring._start + ring._stride)
        slots = [whole[at : at + data.nbytes] for at in starts]
        try:
            return _copies(data, slots, trips, batch)
        finally:
            del slots, whole


def _copies(
    payload: np.ndarray[Any, Any], targets: list[Any], trips: int, batch: int
) -> tuple[float, float]:
    """The median seconds of one copy into ``targets`` in turn (``trips`` timed one by one),
    and the copies per second of ``batch`` made back to back on one clock: a rate measured
    as :func:`throughput` measures a transport's (the wall time of the whole batch, pauses
    and interrupts in it), so the ratio of the two compares like with like."""
    for target in targets:
        np.copyto(target, payload)
    samples = []
    for i in range(trips):
        target = targets[i % len(targets)]
        started = _perf()
        np.copyto(target, payload)
        samples.append(_perf() - started)
    count = len(targets)
    started = _perf()
    for i in range(batch):
        np.copyto(targets[i % count], payload)
    return statistics.median(samples), batch / (_perf() - started)


@dataclass(frozen=True)
class Plan:
    """How many items each measure takes, per transport, for a payload size."""

    trips: int
    batch: int
    slow_trips: int
    slow_batch: int


QUICK = {"big": Plan(20, 20, 4, 4), "small": Plan(300, 1_000, 40, 40)}
FULL = {"big": Plan(300, 300, 30, 30), "small": Plan(3_000, 20_000, 1_000, 200)}


def run(
    reps: int, plans: dict[str, Plan], placement: str
) -> dict[tuple[str, str, str], list[float]]:
    """Every transport once per repetition, interleaved; the raw figures by key."""
    import torch.multiprocessing as tmp

    cpus = PLACEMENTS[placement]
    os.environ[_PLACEMENT] = "" if cpus is None else str(cpus[1])  # the consumers read it
    pin(None if cpus is None else cpus[0])  # the consumers inherit it, then go to theirs
    transports: list[Transport] = [
        RingTransport(),
        LeaseTransport(),
        BoundaryTransport(),
        BoundaryLeaseTransport(),
        QueueTransport(QUEUE, SPAWN, queue_consumer),
        QueueTransport(TORCH, tmp.get_context("spawn"), torch_consumer),
        PipeTransport(),
        GlooTransport(items=False),
        GlooTransport(items=True),
    ]
    got: dict[tuple[str, str, str], list[float]] = {}
    try:
        for transport in transports:
            transport.process.start()
            transport.started()
        for transport in transports:
            transport.ack()  # "ready": the consumer imported what it needs
        for rep in range(reps + 1):  # repetition 0 warms the slots, pages and code paths
            for name in (FRAME, TENSOR, SMALL):
                figures = measure(name, plans["small" if name == SMALL else "big"], transports)
                for (variant, what), value in figures.items():
                    if rep:
                        got.setdefault((name, variant, what), []).append(value)
    finally:
        for transport in transports:
            transport.close()
    return got


def measure(name: str, plan: Plan, transports: list[Transport]) -> dict[tuple[str, str], float]:
    """Latency and throughput of payload ``name`` through every transport (and memcpy)."""
    import torch

    payload = make_payload(name)
    as_array = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, np.uint8)
    fresh = torch.from_numpy(as_array.copy())
    figures: dict[tuple[str, str], float] = {}
    if isinstance(payload, np.ndarray):
        gc.collect()
        figures[MEMCPY, LAT], figures[MEMCPY, TPUT] = memcpy(payload, plan.trips, plan.batch)
        seconds, rate = slots_copy(payload, plan.trips, plan.batch)
        figures[SLOTS_COPY, LAT], figures[SLOTS_COPY, TPUT] = seconds, rate
        figures[SLOTS_MEDIAN, TPUT] = 1 / seconds  # the rate as 1 / the median copy (info)
    for transport in transports:
        if transport.name == PIPE and name != SMALL:
            continue
        if transport.name in (LEASE, BOUNDARY_LEASE) and name == SMALL:
            continue  # a lease is an array's
        slow = transport.name in (QUEUE, TORCH, GLOO, GLOO_BOUNDARY)
        trips = plan.slow_trips if slow else plan.trips
        count = plan.slow_batch if slow else plan.batch
        if transport.name == TORCH:
            items: Callable[[], Any] = fresh.clone
            batch = [fresh.clone() for _ in range(count)]
        else:
            items = itertools.repeat(payload).__next__
            batch = [payload] * count
        gc.collect()
        gc.disable()
        try:
            figures[transport.name, LAT] = latency(transport, items, trips)
            figures[transport.name, TPUT] = throughput(transport, batch)
        finally:
            gc.enable()
        del batch
    return figures


# --- reporting ------------------------------------------------------------------------------


def _span(values: Sequence[float], scale: float, digits: int) -> str:
    """``median (min-max)`` of ``values`` times ``scale`` (an en dash between min and max)."""
    low, median, high = (v * scale for v in (min(values), statistics.median(values), max(values)))
    return f"{median:,.{digits}f} ({low:,.{digits}f}{DASH}{high:,.{digits}f})"


def _ratio(values: Sequence[float], base: Sequence[float]) -> float:
    """The median over repetitions of value / baseline (same repetition)."""
    return statistics.median(v / b for v, b in zip(values, base, strict=True))


def report(got: dict[tuple[str, str, str], list[float]]) -> tuple[list[str], list[str]]:
    """The markdown table and the target lines."""
    lines = [
        f"| payload | transport | latency median µs (min{DASH}max) | latency vs baseline "
        f"| throughput /s median (min{DASH}max) | GB/s | throughput vs baseline |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for payload_name in (FRAME, TENSOR, SMALL):
        size = nbytes(make_payload(payload_name))
        base = PIPE if payload_name == SMALL else MEMCPY
        extra = [SLOTS_COPY] if base == MEMCPY else []
        zero = [LEASE, BOUNDARY_LEASE] if base == MEMCPY else []
        order = [base, *extra] + [
            t for t in (RING, *zero, BOUNDARY, GLOO, GLOO_BOUNDARY, QUEUE, TORCH) if t != base
        ]
        base_lat, base_tput = got[(payload_name, base, LAT)], got[(payload_name, base, TPUT)]
        for transport in order:
            lat, tput = got[(payload_name, transport, LAT)], got[(payload_name, transport, TPUT)]
            is_base = transport == base
            lat_vs = "baseline" if is_base else f"{_ratio(lat, base_lat):.2f}x"
            tput_vs = (
                "baseline"
                if is_base
                else f"{_ratio(tput, base_tput):.0%}"
                if base == MEMCPY
                else f"{_ratio(tput, base_tput):.2f}x"
            )
            gbs = statistics.median(tput) * size / 1e9
            lines.append(
                f"| {payload_name} | {transport} | {_span(lat, 1e6, 1)} | {lat_vs} "
                f"| {_span(tput, 1, 0)} | {gbs:.2f} | {tput_vs} |"
            )
    small_lat = _ratio(got[(SMALL, RING, LAT)], got[(SMALL, PIPE, LAT)])
    b_small_lat = _ratio(got[(SMALL, BOUNDARY, LAT)], got[(SMALL, PIPE, LAT)])
    targets = []
    for who, copying, leasing in (("ring", RING, LEASE), ("boundary", BOUNDARY, BOUNDARY_LEASE)):
        c_lat = _ratio(got[(FRAME, copying, LAT)], got[(FRAME, MEMCPY, LAT)])
        c_tput = _ratio(got[(FRAME, copying, TPUT)], got[(FRAME, SLOTS_COPY, TPUT)])
        z_lat = _ratio(got[(FRAME, leasing, LAT)], got[(FRAME, MEMCPY, LAT)])
        z_tput = _ratio(got[(FRAME, leasing, TPUT)], got[(FRAME, MEMCPY, TPUT)])
        targets += [
            _target(f"6.2 MB frame latency, {who} / one memcpy", f"{c_lat:.2f}x", "≤ 1.5x",
                    c_lat <= 1.5),
            _target(f"6.2 MB frame throughput, {who} / the copy into 2 shared-memory slots",
                    f"{c_tput:.0%}", "≥ 90%", c_tput >= 0.9),
            _target(f"6.2 MB frame latency, {who} zero copy (leased slot) / one memcpy",
                    f"{z_lat:.2f}x", "≤ 0.5x", z_lat <= 0.5),
            _target(f"6.2 MB frame rate, {who} zero copy (leased slot) / memcpy's frame rate",
                    f"{z_tput:.2f}x", "≥ 2x", z_tput >= 2.0),
        ]  # fmt: skip
    targets += [
        _target("1 KB latency, ring / bare Pipe round trip", f"{small_lat:.2f}x", "≤ 1.2x",
                small_lat <= 1.2),
        _target("1 KB latency, boundary / bare Pipe round trip", f"{b_small_lat:.2f}x",
                "≤ 1.2x", b_small_lat <= 1.2),
    ]  # fmt: skip
    for who, copying in (("ring", RING), ("boundary", BOUNDARY)):
        old = _ratio(got[(FRAME, copying, TPUT)], got[(FRAME, SLOTS_MEDIAN, TPUT)])
        targets.append(
            f"- 6.2 MB frame throughput, {who} / the two-slot copy's rate taken as 1 / its "
            f"median copy (the old baseline): {old:.0%} (info)"
        )
    floor = _ratio(got[(FRAME, SLOTS_COPY, TPUT)], got[(FRAME, MEMCPY, TPUT)])
    targets.append(
        f"- 6.2 MB frame, a copy into 2 shared-memory slots in turn / memcpy bandwidth: "
        f"{floor:.0%}; ring / that copy: "
        f"{_ratio(got[(FRAME, RING, TPUT)], got[(FRAME, SLOTS_COPY, TPUT)]):.0%}, boundary / "
        f"that copy: {_ratio(got[(FRAME, BOUNDARY, TPUT)], got[(FRAME, SLOTS_COPY, TPUT)]):.0%} "
        "(info: the copy a pipelined ring cannot avoid, alone)"
    )
    for payload_name in (FRAME, TENSOR, SMALL):  # what crossing hosts costs, no target
        g_lat = _ratio(got[(payload_name, GLOO_BOUNDARY, LAT)], got[(payload_name, BOUNDARY, LAT)])
        g_tput = _ratio(
            got[(payload_name, GLOO_BOUNDARY, TPUT)], got[(payload_name, BOUNDARY, TPUT)]
        )
        targets.append(
            f"- {payload_name}, boundary over gloo / boundary over the ring: latency "
            f"{g_lat:.2f}x, throughput {g_tput:.0%} (info)"
        )
    return lines, targets


def _target(what: str, got: str, target: str, met: bool) -> str:
    return f"- {what}: {got} (target {target}): {'met' if met else 'MISSED'}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ShmRing vs its baselines, process to process")
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every variant")
    parser.add_argument(
        "--placement",
        choices=sorted(PLACEMENTS),
        default="cross",
        help="cross: producer on CPU 0, consumers on CPU 1 (default); os: the scheduler "
        "places the processes; same: all on CPU 0 (the software's own cost)",
    )
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 7)
    plans = QUICK if args.quick else FULL

    import torch

    began = _perf()
    got = run(reps, plans, args.placement)
    took = _perf() - began
    command = " ".join(["python bench/ipc.py", *(sys.argv[1:] if argv is None else argv)])
    big, small = plans["big"], plans["small"]
    print(
        f"# {command}: {reps} repetitions (after one warm-up), interleaved; latency "
        f"{big.trips}/{small.trips} round trips (frames/1 KB; Queue, torch, gloo: "
        f"{big.slow_trips}/{small.slow_trips}), throughput {big.batch}/{small.batch} items "
        f"({big.slow_batch}/{small.slow_batch}); took {took:.0f} s"
    )
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
        f"numpy {np.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"{platform.machine()}; placement {args.placement}"
    )
    print()
    lines, targets = report(got)
    print("\n".join(lines))
    print()
    print("\n".join(targets))


if __name__ == "__main__":
    main()
