"""Zero-copy frames: a producer leases a ring slot, fills it, and the consumer reads that slot.

torch is imported inside the tests that use it: spawned children import this module.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import rxstream
from rxstream.ipc import RingClosed, RingHandle, ShmRing, _lease
from rxstream.ipc._lease import W_HELD
from rxstream.ranks._boundary import Boundary
from rxstream.ranks._lease import lease as stage_lease
from rxstream.ranks._lease import offer, withdraw
from rxstream.transport import MemoryTransport

PREFIX = f"rxs_lease{os.getpid()}_"
_names = itertools.count()
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(autouse=True)
def no_leaked_segments_or_processes() -> Iterator[None]:
    """Fail a test that leaves a /dev/shm segment of this session or a child process behind."""
    yield
    gc.collect()
    assert sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX)) == []
    assert multiprocessing.active_children() == []


@pytest.fixture
def pair() -> Iterator[tuple[ShmRing, ShmRing]]:
    """An owner ring (2 slots of 1 MiB) and a ring attached to it in this process."""
    owner = ShmRing.create(slots=2, slot_bytes=1 << 20, name=f"{PREFIX}{next(_names)}")
    other = ShmRing.attach(owner.handle())
    yield owner, other
    other.close()
    owner.close()
    owner.unlink()


def offset(ring: ShmRing, array: Any) -> int:
    """Where ``array``'s memory starts in ``ring``'s segment (each side maps it elsewhere)."""
    return int(np.asarray(array).ctypes.data) - int(ring._array.ctypes.data)


def test_a_leased_array_is_the_consumers_array(pair: tuple[ShmRing, ShmRing]) -> None:
    """The consumer's array lies at the leased array's offset: no copy, counted zero_copy."""
    producer, consumer = pair
    leased = producer.lease((120, 160, 3), np.uint8)
    assert leased is not None
    leased[...] = 7
    producer.put(leased)
    got = consumer.get()
    assert offset(consumer, got) == offset(producer, leased)
    assert (got.shape, got.dtype, int(got.sum())) == ((120, 160, 3), np.uint8, 7 * got.size)
    leased[0, 0, 0] = 9  # one memory: the producer's write shows through the consumer's view
    assert got[0, 0, 0] == 9
    stats = producer.statistics()
    assert (stats.items, stats.zero_copy, stats.copies) == (1, 1, 0)


def test_a_lease_inside_an_object_and_a_tensor_cross_in_place(
    pair: tuple[ShmRing, ShmRing],
) -> None:
    """A leased CPU tensor in a dict, next to a small array that is copied into the room."""
    import torch

    producer, consumer = pair
    array = producer.lease((64, 64), np.float32)
    assert array is not None
    tensor = torch.from_numpy(array)
    tensor.fill_(2.5)
    producer.put({"frame": tensor, "small": np.arange(5), "n": 3})
    got = consumer.get()
    assert offset(consumer, got["frame"].numpy()) == offset(producer, array)
    assert float(got["frame"].sum()) == 2.5 * 64 * 64
    assert (got["small"].tolist(), got["n"]) == ([0, 1, 2, 3, 4], 3)
    assert producer.statistics().zero_copy == 1


def test_anything_else_is_copied_and_counted(pair: tuple[ShmRing, ShmRing]) -> None:
    """A plain array, and a lease sent a second time, take the copy path (``copies``)."""
    producer, consumer = pair
    producer.put(np.ones(1000))
    assert float(consumer.get().sum()) == 1000.0
    leased = producer.lease((1000,), np.float64)
    assert leased is not None
    leased[...] = 1.0
    producer.put(leased)
    first = consumer.get()
    producer.put(leased)  # its slot was put already: the consumer may be reading it
    second = consumer.get()
    assert offset(consumer, first) == offset(producer, leased)
    assert offset(consumer, second) != offset(producer, leased)
    stats = producer.statistics()
    assert (stats.items, stats.zero_copy, stats.copies) == (3, 1, 2)
    assert consumer.statistics().copies == 2  # the counters live in the segment


def slot_of(ring: ShmRing, array: Any) -> int:
    """The slot ``array``'s memory lies in."""
    return (offset(ring, array) - ring._start) // ring._stride


def test_a_slot_is_not_reused_while_a_producer_view_lives(pair: tuple[ShmRing, ShmRing]) -> None:
    """The consumer handed the slot back, but the producer still holds its lease: items go
    to the other slot, and the lease's slot comes back once its last view is gone."""
    producer, consumer = pair
    kept = producer.lease((1000,), np.float64)
    assert kept is not None
    kept[...] = 5.0
    producer.put(kept)
    got = consumer.get()
    leased_slot = slot_of(consumer, got)
    del got
    gc.collect()  # the consumer's views are gone: it handed the slot back
    for value in range(6):
        producer.put(np.full(1000, float(value)), timeout=10)
        item = consumer.get(timeout=10)
        assert slot_of(consumer, item) != leased_slot  # never the kept one
        del item
    assert float(kept.sum()) == 5000.0  # untouched
    view = kept[10:]
    del kept
    gc.collect()
    assert len(cast(Any, producer._lessor).slots) == 1  # a view of it still holds the slot
    del view
    gc.collect()
    assert cast(Any, producer._lessor).slots == {}
    seen = set()
    for value in range(4):
        leased = producer.lease((1000,), np.float64)
        assert leased is not None
        leased[...] = value
        producer.put(leased, timeout=10)
        del leased
        item = consumer.get(timeout=10)
        seen.add(slot_of(consumer, item))
        assert float(item[0]) == value
        del item
    assert leased_slot in seen  # back in use


def test_all_leased_counts_the_slots_the_producer_keeps(pair: tuple[ShmRing, ShmRing]) -> None:
    """A lease put in place and kept by the producer counts for ``all_leased``: a consumer
    holding the rest then sees every slot leased (a boundary's reader copies out), and does
    not once the producer let go."""
    producer, consumer = pair
    kept = producer.lease((100,), np.uint8)
    assert kept is not None
    producer.put(kept)
    first = consumer.get()
    del first
    gc.collect()  # the consumer handed it back; the producer's view keeps it
    producer.put(np.ones(100))
    second = consumer.get()
    assert consumer.all_leased  # one slot the consumer holds, one the producer keeps
    del kept
    gc.collect()
    assert not consumer.all_leased
    del second


def test_a_slot_is_not_reused_while_a_consumer_view_lives() -> None:
    """A frame the consumer holds keeps its slot: the next leases are elsewhere, and a lease
    waits (backpressure) while the other slots are in flight (3 slots: with the consumer
    holding one and a lease out, one is left for the copy path)."""
    producer = ShmRing.create(slots=3, slot_bytes=1 << 20, name=f"{PREFIX}{next(_names)}")
    consumer = ShmRing.attach(producer.handle())
    try:
        _consumer_view_keeps_its_slot(producer, consumer)
    finally:
        consumer.close()
        producer.close()
        producer.unlink()


def _consumer_view_keeps_its_slot(producer: ShmRing, consumer: ShmRing) -> None:
    first = producer.lease((1000,), np.float64)
    assert first is not None
    first[...] = 1.0
    producer.put(first)
    del first
    held = consumer.get()
    second = producer.lease((1000,), np.float64)
    assert second is not None
    assert slot_of(producer, second) != slot_of(consumer, held)
    second[...] = 2.0
    producer.put(second)
    del second
    producer.put(np.ones(1000))  # the third slot, copied
    with pytest.raises(TimeoutError):
        producer.lease((1000,), np.float64, timeout=0.05)  # the other two in flight
    # the lease that timed out is not counted as the producer's (the consumer's copy-out)
    assert producer._words[W_HELD] == len(cast(Any, producer._lessor).slots)
    for _ in range(2):
        other = consumer.get()
        del other
    gc.collect()
    third = producer.lease((1000,), np.float64, timeout=10)
    assert third is not None
    third[...] = 3.0
    assert float(held.sum()) == 1000.0  # still the first frame


def test_a_lease_leaves_a_slot_the_consumer_does_not_hold(pair: tuple[ShmRing, ShmRing]) -> None:
    """With the consumer keeping an item, leasing the one other slot would leave the copy
    path none: the lease is refused (a plain array then, copied) once its bounded wait for a
    hand-back ran out, and the copy goes through."""
    producer, consumer = pair
    producer.put(np.ones(1000))
    kept = consumer.get()  # downstream keeps it: its slot stays the consumer's
    assert producer.lease((1000,), np.float64) is None
    producer.put(np.full(1000, 2.0), timeout=10)
    second = consumer.get(timeout=10)
    assert (float(kept.sum()), float(second.sum())) == (1000.0, 2000.0)


def test_a_lease_waits_for_the_consumer_to_hand_a_slot_back(
    pair: tuple[ShmRing, ShmRing], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease that would leave the copy path no slot waits for the consumer's hand-back (a
    reader catching up) and is granted then, in place, instead of being refused at once."""
    producer, consumer = pair
    waiting = threading.Event()
    handed_back = _lease.Lessor._handed_back

    def spied(self: _lease.Lessor, seconds: float) -> bool:
        waiting.set()
        return handed_back(self, seconds)

    monkeypatch.setattr(_lease.Lessor, "_handed_back", spied)
    monkeypatch.setattr(_lease, "LEASE_WAIT_S", 60.0)  # the hand-back ends the wait, not this
    holding = threading.Event()
    got: list[Any] = []

    def produce() -> None:  # the producer's thread: a put, then (once it is held) a lease
        producer.put(np.ones(1000))
        assert holding.wait(10)
        leased = producer.lease((1000,), np.float64)
        got.append(leased)
        if leased is not None:
            leased[...] = 5.0
            producer.put(leased, timeout=10)

    thread = threading.Thread(target=produce)
    thread.start()
    kept = consumer.get(timeout=10)  # the reader holds one slot of two
    holding.set()
    assert waiting.wait(10)  # the lease waits: granting it would leave the copy path no slot
    del kept
    gc.collect()  # the reader let go: its slot goes back through the free pipe
    thread.join(10)
    assert not thread.is_alive()
    (leased,) = got
    assert leased is not None
    again = consumer.get(timeout=10)
    assert offset(consumer, again) == offset(producer, leased)
    assert (producer.statistics().zero_copy, float(again.sum())) == (1, 5000.0)


def test_a_lease_whose_wait_ran_out_is_refused_at_once_after(
    pair: tuple[ShmRing, ShmRing], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer that keeps its item (until more come) lets the first such lease wait its
    bounded time and be refused; the producer's later ones are refused without a wait."""
    producer, consumer = pair
    waits = _spy_on_waits(monkeypatch)
    monkeypatch.setattr(_lease, "LEASE_WAIT_S", 0.05)
    producer.put(np.ones(1000))
    kept = consumer.get()
    assert producer.lease((1000,), np.float64) is None
    assert waits
    assert all(0 < s <= 0.05 for s in waits)
    assert producer._lessor is not None
    assert producer._lessor.patience == 0
    count = len(waits)
    assert producer.lease((1000,), np.float64) is None
    assert len(waits) == count  # no second wait
    del kept


def test_a_lease_waits_no_longer_than_its_timeout_and_keeps_its_patience(
    pair: tuple[ShmRing, ShmRing], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease whose caller's ``timeout`` is shorter than ``LEASE_WAIT_S`` waits at most that
    timeout for a hand-back; its running out leaves the ring's later leases their wait."""
    producer, consumer = pair
    waits = _spy_on_waits(monkeypatch)
    monkeypatch.setattr(_lease, "LEASE_WAIT_S", 1.0)
    producer.put(np.ones(1000))
    kept = consumer.get()
    assert producer.lease((1000,), np.float64, timeout=0.01) is None
    assert waits
    assert all(0 < s <= 0.01 for s in waits)
    assert producer._lessor is not None
    assert producer._lessor.patience == 1.0
    count = len(waits)
    assert producer.lease((1000,), np.float64, timeout=0.0) is None
    assert len(waits) == count  # a zero timeout: refused without a wait
    assert producer._lessor.patience == 1.0
    del kept


def test_a_lease_not_put_yet_counts_for_the_consumers_copy_out(
    pair: tuple[ShmRing, ShmRing],
) -> None:
    """A producer holding a lease not put yet sends another array first (copied into the
    other slot): the consumer then sees every slot leased, so a boundary's reader copies that
    item out, and the lease itself still crosses in place afterwards."""
    producer, consumer = pair
    leased = producer.lease((1000,), np.uint8)
    assert leased is not None
    leased[...] = 3
    producer.put(np.full(1000, 2.0), timeout=10)  # e.g. a mask made apart: the copy path
    got = consumer.get(timeout=10)
    assert consumer.all_leased  # the reader must not keep this slot: no slot would be left
    copied = np.array(got)  # what a boundary's reader does then
    del got
    gc.collect()
    producer.put(leased, timeout=10)  # the lease itself, in place
    again = consumer.get(timeout=10)
    assert offset(consumer, again) == offset(producer, leased)
    assert (float(copied.sum()), int(again.sum())) == (2000.0, 3000)
    stats = producer.statistics()
    assert (stats.zero_copy, stats.copies) == (1, 1)


def test_a_lease_never_put_goes_back(pair: tuple[ShmRing, ShmRing]) -> None:
    """A dropped lease frees its slot; a lease that would leave the copy path no slot and an
    oversized one are refused (``None``), and a closed ring leases nothing."""
    producer, _ = pair
    leased = producer.lease((10,), np.float32)
    assert leased is not None
    assert producer.statistics().slots_in_use == 1
    assert producer.lease((10,), np.float32) is None  # one slot stays for the copy path
    del leased
    gc.collect()
    assert producer.statistics().slots_in_use == 0
    assert producer.lease((1 << 20,), np.uint8) is None  # no room left for the header
    assert producer.lease((3,), object) is None
    for _ in range(5):  # leased and dropped over and over: never runs out
        assert producer.lease((100,), np.uint8, timeout=10) is not None
        gc.collect()
    producer.close()
    assert producer.lease((10,), np.float32) is None


@pytest.mark.parametrize("closing", ["consumer", "producer"])
def test_a_blocked_lease_wakes_on_close(pair: tuple[ShmRing, ShmRing], closing: str) -> None:
    """A lease waiting for a slot (both wait for the consumer) gets ``None`` when either side
    closes; closed from the producer's side (another thread), its pipes and mapping are let go
    only after the lease returned."""
    producer, consumer = pair
    got: list[Any] = []
    full = threading.Event()

    def produce() -> None:
        producer.put(np.ones(10))
        producer.put(np.ones(10))
        full.set()
        got.append(producer.lease((10,), np.float32))

    thread = threading.Thread(target=produce)
    thread.start()
    assert full.wait(10)
    (producer if closing == "producer" else consumer).close()
    thread.join(10)
    assert not thread.is_alive()
    assert got == [None]
    if closing == "producer":
        assert producer._released  # let go once the lease returned


def _child_offsets(handle: RingHandle, answers: Connection, count: int) -> None:
    """Get ``count`` frames; answer each one's offset in the segment and its first value."""
    ring = ShmRing.attach(handle)
    try:
        for _ in range(count):
            frame = ring.get(timeout=30)
            answers.send((int(frame.ctypes.data) - int(ring._array.ctypes.data), int(frame[0, 0])))
            del frame
    except RingClosed:
        pass
    finally:
        ring.close()
        answers.close()


def test_frames_cross_processes_in_their_leased_slots() -> None:
    """Across processes: every frame the child gets lies where the producer wrote it."""
    ring = ShmRing.create(slots=4, slot_bytes=1 << 20, name=f"{PREFIX}{next(_names)}")
    ours, theirs = SPAWN.Pipe(duplex=False)
    child = SPAWN.Process(target=_child_offsets, args=(ring.handle(), theirs, 6))
    child.start()
    theirs.close()
    try:
        written = []
        for index in range(6):
            leased = ring.lease((100, 100), np.uint16, timeout=30)
            assert leased is not None
            leased[...] = index
            written.append((offset(ring, leased), index))
            ring.put(leased, timeout=30)
            del leased
        assert [ours.recv() for _ in range(6)] == written
        assert ring.statistics().zero_copy == 6
    finally:
        ring.close()
        child.join(30)
        ring.unlink()
        ours.close()


def test_stage_lease_outside_a_boundary_is_a_new_array() -> None:
    """With no ring offered to this thread: a new numpy array, or a CPU tensor; bad dtypes
    and devices are named."""
    import torch

    array = stage_lease((2, 3), np.int16)
    assert (type(array), array.shape, array.dtype) == (np.ndarray, (2, 3), np.int16)
    tensor = stage_lease((2, 3), torch.float32, device="cpu")
    assert isinstance(tensor, torch.Tensor)
    assert tensor.device.type == "cpu"
    with pytest.raises(rxstream.RxStreamError, match=r"device must be None or 'cpu'.*'cuda'"):
        stage_lease((2,), np.uint8, device="cuda")
    with pytest.raises(TypeError, match=r"dtype must be a numpy or torch dtype.*'nope'"):
        stage_lease((2,), "nope")


def test_stage_lease_from_a_closed_or_foreign_ring_is_a_new_array(
    pair: tuple[ShmRing, ShmRing],
) -> None:
    """A ring offered to this thread that closed since (a boundary never closed by its run),
    or whose producer is another thread, leases nothing: the stage gets a new array."""
    producer, _ = pair
    other = threading.Thread(target=producer.put, args=(b"x",))
    other.start()
    other.join()  # that thread is the ring's producer now
    offer(producer)
    try:
        array = stage_lease((4,), np.uint8)
        assert type(array) is np.ndarray
        assert not segment_start(producer) <= int(array.ctypes.data) < segment_end(producer)
        producer.close()
        assert type(stage_lease((4,), np.uint8)) is np.ndarray
    finally:
        withdraw(producer)


def segment_start(ring: ShmRing) -> int:
    """Where ``ring``'s segment starts in this process."""
    return int(ring._array.ctypes.data)


def segment_end(ring: ShmRing) -> int:
    """Where ``ring``'s segment ends in this process."""
    return int(ring._array.ctypes.data) + int(ring._array.size)


def test_a_stage_that_leases_its_output_crosses_ranks_without_a_copy() -> None:
    """Through a run on two ranks: from the second item on, the stage's leased frames cross
    in place (numpy and torch), the first is copied, and the books balance."""
    import torch

    ctx = rxstream.Context(transport=MemoryTransport(keep=None))
    # slots enough for what the consumer's side holds (reader, inbox, stage): no copy-out
    ctx.ring_spec = rxstream.RingSpec(slots=8, slot_bytes=1 << 20)
    made: dict[int, int] = {}  # per item: where the stage's array lies
    places: dict[int, int] = {}  # per item: where the consumer's array lies

    def render(index: int) -> Any:
        if index % 2:
            out = ctx.lease((64, 64), torch.float32, device="cpu")
            out.fill_(float(index))
            made[index] = int(out.data_ptr())
            return out
        array = ctx.lease((64, 64), np.float32)
        array[...] = index
        made[index] = int(array.ctypes.data)
        return array

    def check(frame: Any) -> float:
        array = frame.numpy() if isinstance(frame, torch.Tensor) else frame
        places[int(array[0, 0])] = int(array.ctypes.data)
        return float(array.sum())

    pipeline = (
        ctx.source(range(8), name="src")
        | ctx.pipe(render, name="render")
        | ctx.pipe(check, name="check", rank=1)
        | ctx.stream("out")
    )
    pipeline.start()
    try:
        assert pipeline.wait(timeout=30)
        transport = ctx.transport
        assert isinstance(transport, MemoryTransport)
        assert transport.payloads("out") == [64.0 * 64 * i for i in range(8)]
        (edge,) = pipeline._run.boundaries.values()  # type: ignore[union-attr]
        ring = cast(Boundary, edge).ring
        assert isinstance(ring, ShmRing)
        stats = ring.statistics()
        assert (stats.items, stats.copies, stats.zero_copy) == (9, 1, 7)  # and the end mark
        render_stats = pipeline.statistics()["render"]  # the stage whose output crosses
        assert (render_stats.zero_copy, render_stats.copies) == (7, 1)
        table = rxstream.format_statistics(pipeline.statistics()).splitlines()
        assert table[0].split()[-2:] == ["zero", "copy"]
        assert [row.split()[-1] for row in table[1:]] == ["-", "7/8", "-", "-"]
        # one mapping on both sides of an in-process ring: the same address, item 0 aside
        assert [places[i] == made[i] for i in range(8)] == [False] + [True] * 7
    finally:
        pipeline.stop()


@pytest.mark.slow
def test_leased_frames_cross_rank_processes_in_place() -> None:
    """``rxstream run --ranks 2``: rank 0's render leases its frames, rank 1 reads them whole,
    and rank 0's table counts every frame but the first crossed in place (the ring is offered
    with it): while rank 1 holds every slot but the lease's, the lease waits for it to catch
    up instead of being refused."""
    app = Path(__file__).resolve().parent / "apps" / "lease_app.py"
    done = subprocess.run(
        [sys.executable, "-m", "rxstream", "run", str(app), "--ranks", "2", "--frames", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "20 items egressed on 2 rank(s)" in done.stdout
    rank0 = done.stdout.split("rank 0", 1)[1].split("rank 1", 1)[0].splitlines()
    assert rank0[1].split()[-2:] == ["zero", "copy"]
    (render,) = [row.split() for row in rank0 if row.startswith("render ")]
    zero, sent = (int(n) for n in render[-1].split("/"))
    assert sent >= 20
    assert zero == sent - 1  # the first frame is copied (the ring is offered with it)


def _spy_on_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds of every wait a lease makes for a slot handed back, in order."""
    waits: list[float] = []
    handed_back = _lease.Lessor._handed_back

    def spied(self: _lease.Lessor, seconds: float) -> bool:
        waits.append(seconds)
        return handed_back(self, seconds)

    monkeypatch.setattr(_lease.Lessor, "_handed_back", spied)
    return waits
