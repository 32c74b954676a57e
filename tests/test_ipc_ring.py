"""ShmRing: slots in one shared-memory segment, read in place, leased, closed, across processes.

torch is imported inside the tests that use it: spawned children import this module.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from rxstream import PipelineItem, PipelineMetadata, PipelineStateError
from rxstream.ipc import (
    FramingError,
    PayloadTooLarge,
    RingClosed,
    RingConflict,
    RingHandle,
    RingStatistics,
    ShmRing,
    frame,
)
from rxstream.item import _is_lazy, _stamped
from rxstream.testing import assert_same

PREFIX = f"rxs_test{os.getpid()}_"
_names = itertools.count()
SPAWN = multiprocessing.get_context("spawn")
CHILD_S = 10.0


def shm_names() -> list[str]:
    """This test session's segments in /dev/shm."""
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX))


@pytest.fixture(autouse=True)
def no_leaked_segments_or_processes() -> Iterator[None]:
    """Fail a test that leaves a /dev/shm segment of this session or a child process behind."""
    yield
    gc.collect()
    assert shm_names() == []
    assert multiprocessing.active_children() == []


@pytest.fixture
def ring_name() -> str:
    """A segment name unique to this test (this session's prefix)."""
    return f"{PREFIX}{next(_names)}"


@pytest.fixture
def pair(ring_name: str) -> Iterator[tuple[ShmRing, ShmRing]]:
    """An owner ring (4 slots of 1 MiB) and a ring attached to it in this process."""
    owner = ShmRing.create(slots=4, slot_bytes=1 << 20, name=ring_name)
    other = ShmRing.attach(owner.handle())
    yield owner, other
    other.close()
    owner.close()
    owner.unlink()


def segment_range(ring: ShmRing) -> tuple[int, int]:
    """The addresses ``ring``'s mapping of its segment spans in this process."""
    whole = ring._array
    return whole.ctypes.data, whole.ctypes.data + whole.nbytes


def framed_size(obj: object) -> int:
    """Bytes ``obj`` takes in a slot: (header_len, n) + (offset, length) per buffer + header,
    then each buffer at a 64-byte aligned offset; ``bytes`` go as is, without pickle."""
    if type(obj) is bytes:
        return 16 + len(obj)
    header, buffers = frame(obj)
    end = 16 + 16 * len(buffers) + len(header)
    for buffer in buffers:
        end = -(-end // 64) * 64 + memoryview(buffer).nbytes
    return end


# --- payloads -------------------------------------------------------------------------------


def _bfloat16() -> Any:
    import torch

    return torch.linspace(-3, 3, 64).to(torch.bfloat16).reshape(8, 8)


def _transposed_tensor() -> Any:
    import torch

    return torch.arange(60.0).reshape(6, 10).t()


def _tensor_0d() -> Any:
    import torch

    return torch.tensor(1.25)


def _nested() -> Any:
    return {
        "frames": [np.full((8, 8, 3), i, np.uint8) for i in range(3)],
        "pair": (np.arange(5, dtype=np.int64), "label"),
        "none": None,
    }


def _item() -> PipelineItem:
    first = PipelineItem(b"", PipelineMetadata(pts=12, input_seq=3, timeline=(("src.in", 1.0),)))
    return _stamped(first, np.arange(16, dtype=np.float32), ("a.in", 2.0, "a.out", 3.0))


PAYLOADS: dict[str, Callable[[], Any]] = {
    "uint8-frame": lambda: np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3),
    "float32": lambda: np.linspace(0, 1, 1000, dtype=np.float32),
    "float64-fortran": lambda: np.asfortranarray(np.arange(20.0).reshape(4, 5)),
    "int16": lambda: np.arange(-50, 50, dtype=np.int16),
    "complex128": lambda: np.arange(4) + 1j,
    "bool": lambda: np.array([True, False, True]),
    "0d": lambda: np.array(7.5),
    "empty": lambda: np.empty((0, 3), np.float32),
    "strided": lambda: np.arange(30.0)[::4],
    "bfloat16-tensor": _bfloat16,
    "transposed-tensor": _transposed_tensor,
    "0d-tensor": _tensor_0d,
    "nested": _nested,
    "bytes-1k": lambda: bytes(range(256)) * 4,
    "empty-bytes": lambda: b"",
    "none": lambda: None,
}


@pytest.mark.parametrize("make", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_payloads_round_trip(pair: tuple[ShmRing, ShmRing], make: Callable[[], Any]) -> None:
    """Arrays, tensors, nested structures and plain values come out of the ring equal."""
    owner, other = pair
    payload = make()
    owner.put(payload)
    assert_same(other.get(timeout=5), payload)


def test_pipeline_item_crosses_with_its_lazy_metadata(pair: tuple[ShmRing, ShmRing]) -> None:
    """A hot-path item keeps its base metadata and stamps; its metadata reads back equal."""
    owner, other = pair
    item = _item()
    owner.put(item)
    got = other.get(timeout=5)
    assert _is_lazy(got)
    assert got.metadata == item.metadata
    assert got.metadata.timeline == (("src.in", 1.0), ("a.in", 2.0), ("a.out", 3.0))
    assert_same(got.payload, item.payload)


# --- in place -------------------------------------------------------------------------------


def test_consumer_array_lies_inside_the_segment(pair: tuple[ShmRing, ShmRing]) -> None:
    """The consumer's array is a view of the slot: its data lies in the segment, 64-aligned."""
    owner, other = pair
    owner.put({"a": np.ones((100, 100)), "b": np.arange(7, dtype=np.uint8)})
    got = other.get(timeout=5)
    low, high = segment_range(other)
    for array in got.values():
        assert low <= array.ctypes.data
        assert array.ctypes.data + array.nbytes <= high
        assert array.ctypes.data % 64 == 0
        assert array.flags.writeable


def test_consumer_tensor_lies_inside_the_segment(pair: tuple[ShmRing, ShmRing]) -> None:
    """A CPU tensor (bfloat16 too) arrives as a view of the slot, not a copy."""
    owner, other = pair
    owner.put(_bfloat16())
    got = other.get(timeout=5)
    low, high = segment_range(other)
    assert low <= got.data_ptr() < high
    assert_same(got, _bfloat16())


# --- leases ---------------------------------------------------------------------------------


def test_slot_is_leased_until_every_view_is_gone(pair: tuple[ShmRing, ShmRing]) -> None:
    """The slot goes back only when the last view of it (a derived slice too) is collected."""
    owner, other = pair
    owner.put(np.arange(64.0).reshape(8, 8))
    assert owner.statistics().slots_in_use == 1
    got = other.get(timeout=5)
    row = got[3]
    del got
    assert other.statistics().slots_in_use == 1
    assert row[0] == 24.0
    del row
    assert other.statistics().slots_in_use == 0


def test_one_big_item_in_flight_keeps_reusing_one_slot(pair: tuple[ShmRing, ShmRing]) -> None:
    """A big item goes into the slot handed back last (cache-hot), not round the ring."""
    owner, other = pair
    addresses = set()
    for i in range(6):
        owner.put(np.full(1 << 17, i, np.uint8))
        got = other.get(timeout=5)
        assert got[0] == i
        addresses.add(got.ctypes.data)
        del got
    assert len(addresses) == 1


def test_a_big_put_reads_the_free_pipe_without_polling_it(
    pair: tuple[ShmRing, ShmRing], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer's free pipe does not block (the consumer's ready pipe does): a big item
    takes the slots handed back with one read, none when nothing came, without a poll."""
    owner, other = pair
    big = np.zeros(1 << 17, np.uint8)
    owner.put(big)
    assert (os.get_blocking(owner._free_r), os.get_blocking(other._ready_r)) == (False, True)
    polls: list[object] = []
    poller = owner._free_poll

    class Spy:
        def poll(self, timeout: float | None = None) -> object:
            polls.append(timeout)
            return poller.poll(timeout)

    monkeypatch.setattr(owner, "_free_poll", Spy())
    owner.put(big + 1)  # nothing handed back yet: a free slot from the start
    got = other.get(timeout=5)
    del got  # handed back: the next big put reads it and reuses that slot
    gc.collect()
    owner.put(big + 2)
    assert polls == []
    assert [int(other.get(timeout=5)[0]) for _ in range(2)] == [1, 2]


def test_items_without_buffers_are_not_leased(pair: tuple[ShmRing, ShmRing]) -> None:
    """Bytes and scalars are copied out by unpickling: their slot goes back at once."""
    owner, other = pair
    owner.put(b"x" * 1024)
    got = other.get(timeout=5)
    assert got == b"x" * 1024
    assert other.statistics().slots_in_use == 0


def test_a_read_out_slot_goes_back_on_the_consumers_next_get(ring_name: str) -> None:
    """A slot whose item was copied out is free at once, and handed back by the next get.

    Not during the get that read it: that pipe write would sit between the producer's put and
    the consumer's item.
    """
    with (
        ShmRing.create(slots=1, slot_bytes=4096, name=ring_name) as owner,
        ShmRing.attach(owner.handle()) as other,
    ):
        taken = threading.Event()
        seen: list[Any] = []

        def produce() -> None:
            seen.append(owner.put(b"first"))
            taken.wait(5)
            try:
                owner.put(b"second", timeout=0.05)
            except TimeoutError as exc:  # the consumer has not handed the slot back yet
                seen.append(exc)
            seen.append(owner.put(b"second", timeout=5))  # waits for the next get

        producer = threading.Thread(target=produce)
        producer.start()
        assert other.get(timeout=5) == b"first"
        assert other.statistics().slots_in_use == 0  # free, though not handed back
        taken.set()
        time.sleep(0.2)  # the producer's first try times out meanwhile
        assert other.get(timeout=5) == b"second"  # hands the slot back, then takes it
        producer.join(5)
        assert seen[0] == 0
        assert isinstance(seen[1], TimeoutError)
        assert seen[2] > 0  # put says how long it waited for its slot


def test_all_leased_counts_views_held_not_items_waiting(ring_name: str) -> None:
    """A full ring is not leased; it is once views of every slot are held, until one goes."""
    with (
        ShmRing.create(slots=2, slot_bytes=4096, name=ring_name) as owner,
        ShmRing.attach(owner.handle()) as other,
    ):
        owner.put(np.zeros(4))
        owner.put(np.ones(4))
        assert owner.all_in_use
        assert not other.all_leased  # both written, neither got
        first = other.get(timeout=5)
        assert not other.all_leased
        second = other.get(timeout=5)
        assert other.all_leased
        del first
        gc.collect()
        assert not other.all_leased
        del second


def test_producer_blocks_while_the_consumer_holds_both_views(ring_name: str) -> None:
    """With 2 slots the third put waits until the consumer drops one of its two views."""
    with ShmRing.create(slots=2, slot_bytes=4096, name=ring_name) as owner:
        done: list[int] = []

        def produce() -> None:
            for i in range(3):
                owner.put(np.full(8, i, np.int64))
                done.append(i)

        producer = threading.Thread(target=produce)
        producer.start()
        with ShmRing.attach(owner.handle()) as other:
            first = other.get(timeout=5)
            second = other.get(timeout=5)
            time.sleep(0.2)
            assert done == [0, 1]
            assert other.statistics().slots_in_use == 2
            del first
            third = other.get(timeout=5)
            producer.join(5)
            assert done == [0, 1, 2]
            assert (second[0], third[0]) == (1, 2)
            assert other.statistics().put_wait_s >= 0.1
            del second, third


def test_put_times_out_when_no_slot_comes_free(ring_name: str) -> None:
    """put(timeout=) raises TimeoutError naming the ring when every slot stays leased."""
    with ShmRing.create(slots=2, slot_bytes=4096, name=ring_name) as ring:
        ring.put(np.zeros(4))
        ring.put(np.zeros(4))
        held = [ring.get(), ring.get()]
        with pytest.raises(
            TimeoutError,
            match=(
                rf"^no slot of ring '{ring_name}' came free within 0.05 s "
                r"\(all 2 are written and not handed back\)$"
            ),
        ):
            ring.put(np.zeros(4), timeout=0.05)
        del held


def test_get_times_out_on_an_empty_ring(pair: tuple[ShmRing, ShmRing]) -> None:
    """get(timeout=) raises TimeoutError naming the ring when nothing comes."""
    _, other = pair
    with pytest.raises(
        TimeoutError, match=rf"^no item came through ring '{other.name}' in 0.05 s$"
    ):
        other.get(timeout=0.05)


def test_order_is_kept_under_a_fast_producer_and_slow_consumer(
    pair: tuple[ShmRing, ShmRing],
) -> None:
    """300 items through 4 slots arrive in order although the consumer keeps stalling."""
    owner, other = pair

    def produce() -> None:
        for i in range(300):
            owner.put(np.full(16, i, np.int64))
        owner.close()

    producer = threading.Thread(target=produce)
    producer.start()
    got: list[int] = []
    while True:
        try:
            item = other.get(timeout=5)
        except RingClosed:
            break
        got.append(int(item[0]))
        if len(got) % 60 == 0:
            time.sleep(0.02)
    producer.join(5)
    assert got == list(range(300))
    del item  # the last view
    stats = other.statistics()
    assert (stats.items, stats.slots_in_use) == (300, 0)
    assert stats.put_wait_s > 0


# --- close ----------------------------------------------------------------------------------


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``call`` in a thread; what it raised lands in the returned list."""
    raised: list[BaseException] = []

    def body() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    return thread, raised


def test_blocked_get_wakes_with_ring_closed_when_the_producer_closes(
    pair: tuple[ShmRing, ShmRing],
) -> None:
    """A get blocked on an empty ring raises RingClosed once the other side closes."""
    owner, other = pair
    thread, raised = _in_thread(other.get)
    time.sleep(0.1)
    owner.close()
    thread.join(5)
    assert [type(e) for e in raised] == [RingClosed]
    assert str(raised[0]) == f"ring '{owner.name}' is closed and drained"


def test_blocked_get_wakes_when_its_own_side_closes(pair: tuple[ShmRing, ShmRing]) -> None:
    """close() from another thread of the consumer's side wakes its blocked get."""
    _, other = pair
    thread, raised = _in_thread(other.get)
    time.sleep(0.1)
    other.close()
    thread.join(5)
    assert [type(e) for e in raised] == [RingClosed]


def test_blocked_put_wakes_with_ring_closed_when_the_consumer_closes(ring_name: str) -> None:
    """A put blocked on a full ring raises RingClosed once the consumer's side closes."""
    with ShmRing.create(slots=2, slot_bytes=4096, name=ring_name) as owner:

        def fill() -> None:
            for i in range(3):
                owner.put(i)

        thread, raised = _in_thread(fill)
        other = ShmRing.attach(owner.handle())
        time.sleep(0.1)
        other.close()
        thread.join(5)
        assert [type(e) for e in raised] == [RingClosed]
        assert str(raised[0]) == f"ring '{ring_name}' is closed"


def test_get_drains_what_was_put_before_close(pair: tuple[ShmRing, ShmRing]) -> None:
    """After the producer closes, get returns every item put before, then raises RingClosed."""
    owner, other = pair
    for i in range(3):
        owner.put(np.full(4, i))
    owner.close()
    with pytest.raises(RingClosed, match=rf"^ring '{owner.name}' is closed$"):
        owner.put(3)
    assert [int(other.get(timeout=5)[0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RingClosed, match=rf"^ring '{owner.name}' is closed and drained$"):
        other.get(timeout=5)


def test_closing_the_consumer_side_discards_what_it_did_not_get(
    pair: tuple[ShmRing, ShmRing],
) -> None:
    """A side that closed itself refuses get at once; the producer's next put is refused."""
    owner, other = pair
    owner.put(1)
    other.close()
    other.close()
    with pytest.raises(RingClosed, match=rf"^ring '{owner.name}' is closed$"):
        other.get()
    with pytest.raises(RingClosed, match=rf"^ring '{owner.name}' is closed$"):
        owner.put(2)


def test_views_stay_valid_after_both_sides_closed_and_unlinked(ring_name: str) -> None:
    """Close and unlink while a view lives: the view's memory stays mapped and readable."""
    owner = ShmRing.create(slots=2, slot_bytes=1 << 16, name=ring_name)
    other = ShmRing.attach(owner.handle())
    owner.put(np.arange(1000, dtype=np.int32))
    got = other.get(timeout=5)
    other.close()
    owner.close()
    owner.unlink()
    assert shm_names() == []
    gc.collect()
    assert int(got.sum()) == sum(range(1000))
    got[:] = 1
    assert int(got.sum()) == 1000
    assert other.statistics().slots_in_use == 1  # frozen at close, as it was then
    del got


# --- sizes ----------------------------------------------------------------------------------


def test_payload_too_large_names_both_sizes_and_the_knob(pair: tuple[ShmRing, ShmRing]) -> None:
    """An item larger than a slot raises PayloadTooLarge (a ValueError); nothing is written."""
    owner, other = pair
    big = np.zeros(1 << 20, np.uint8)
    size = framed_size(big)
    with pytest.raises(
        PayloadTooLarge,
        match=(
            rf"^a framed item of {size:,} bytes does not fit a ring slot of 1,048,576 bytes; "
            rf"create the ring with a larger slot_bytes= \(at least {size:,}\)$"
        ),
    ) as caught:
        owner.put(big)
    assert isinstance(caught.value, ValueError)
    assert owner.statistics() == RingStatistics(0, 0, 0, 0.0, other.statistics().get_wait_s)
    owner.put(np.ones(3))
    assert_same(other.get(timeout=5), np.ones(3))


def test_largest_payload_that_fits_round_trips(ring_name: str) -> None:
    """An array of exactly slot size minus the framing fits and round trips; a byte more fails."""
    slot_bytes = 1 << 16
    with ShmRing.create(slots=2, slot_bytes=slot_bytes, name=ring_name) as ring:
        overhead = framed_size(np.zeros(slot_bytes // 2, np.uint8)) - slot_bytes // 2
        largest = np.arange(slot_bytes - overhead, dtype=np.uint64).astype(np.uint8)
        assert framed_size(largest) == slot_bytes
        ring.put(largest)
        assert_same(ring.get(timeout=5), largest)
        with pytest.raises(PayloadTooLarge):
            ring.put(np.zeros(largest.size + 1, np.uint8))
        assert ring.statistics().slots_in_use == 0


def test_unframable_payload_raises_and_leaves_the_ring_usable(
    pair: tuple[ShmRing, ShmRing],
) -> None:
    """A generator raises FramingError naming its type; the next put goes through."""
    owner, other = pair
    with pytest.raises(FramingError, match=r"^cannot send a payload of type 'generator'"):
        owner.put(x for x in range(2))
    owner.put("next")
    assert other.get(timeout=5) == "next"


# --- one producer, one consumer -------------------------------------------------------------


def _ids() -> tuple[int, int]:
    return os.getpid(), threading.get_native_id()


def test_second_producer_thread_raises_ring_conflict(pair: tuple[ShmRing, ShmRing]) -> None:
    """A put from a second thread raises RingConflict naming both callers."""
    owner, _ = pair
    owner.put(1)
    pid, tid = _ids()
    thread, raised = _in_thread(lambda: owner.put(2))
    thread.join(5)
    assert [type(e) for e in raised] == [RingConflict]
    assert isinstance(raised[0], RuntimeError)
    pattern = (
        rf"^ring '{owner.name}' already has a producer \(pid {pid}, thread {tid}\); put called "
        rf"from pid {pid}, thread (\d+): a ring has one producer$"
    )
    match = re.match(pattern, str(raised[0]))
    assert match is not None
    assert int(match[1]) != tid


def test_second_consumer_raises_ring_conflict(pair: tuple[ShmRing, ShmRing]) -> None:
    """A get from a second thread, or through a second ring object, raises RingConflict."""
    owner, other = pair
    owner.put(1)
    owner.put(2)
    assert other.get(timeout=5) == 1
    thread, raised = _in_thread(lambda: other.get(timeout=1))
    thread.join(5)
    assert [type(e) for e in raised] == [RingConflict]
    pid, tid = _ids()
    with pytest.raises(
        RingConflict,
        match=(
            rf"^ring '{owner.name}' already has a consumer \(pid {pid}, thread {tid}\); get "
            rf"called from pid {pid}, thread {tid} through another ShmRing object: "
            r"a ring has one consumer$"
        ),
    ):
        owner.get(timeout=1)
    assert other.get(timeout=5) == 2


# --- lifecycle ------------------------------------------------------------------------------


def test_create_validates_its_sizes() -> None:
    """slots and slot_bytes out of range raise ValueError naming the rule and the value."""
    with pytest.raises(ValueError, match=r"^slots must be between 1 and 1024, got 0$"):
        ShmRing.create(slots=0)
    with pytest.raises(ValueError, match=r"^slot_bytes must be >= 256, got 100$"):
        ShmRing.create(slot_bytes=100)


def test_default_name_and_unlink_twice() -> None:
    """create() names the segment rxs_<pid>_<hex>; unlink removes it and is safe to repeat."""
    ring = ShmRing.create(slots=1, slot_bytes=1024)
    try:
        assert ring.name.startswith(f"rxs_{os.getpid()}_")
        assert os.path.exists(f"/dev/shm/{ring.name}")
        assert repr(ring) == f"<ShmRing '{ring.name}' 1 slots x 1024 bytes, owner, open>"
    finally:
        ring.close()
        ring.unlink()
    ring.unlink()
    assert not os.path.exists(f"/dev/shm/{ring.name}")


def test_only_the_owner_unlinks_and_nobody_attaches_after(ring_name: str) -> None:
    """unlink on an attached ring raises PipelineStateError; after unlink attach fails."""
    owner = ShmRing.create(slots=1, slot_bytes=1024, name=ring_name)
    handle = owner.handle()
    with (
        ShmRing.attach(handle) as other,
        pytest.raises(
            PipelineStateError,
            match=(
                rf"^only the owner of ring '{ring_name}' \(pid {os.getpid()}\) unlinks it; "
                r"this side attached to it$"
            ),
        ),
    ):
        other.unlink()
    owner.close()
    owner.unlink()
    with pytest.raises(FileNotFoundError):
        ShmRing.attach(handle)
    with pytest.raises(RingClosed):
        owner.handle()


def test_statistics_count_items_bytes_and_slots(pair: tuple[ShmRing, ShmRing]) -> None:
    """statistics() counts items and their framed bytes, the same from both sides."""
    owner, other = pair
    payloads = [np.zeros(100), b"abc", {"k": np.ones(3, np.int8)}]
    for payload in payloads:
        owner.put(payload)
    stats = other.statistics()
    assert stats.items == 3
    assert stats.bytes == sum(framed_size(p) for p in payloads)
    assert stats.slots_in_use == 3
    assert owner.statistics() == stats
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.items = 0  # type: ignore[misc]


# --- across processes -----------------------------------------------------------------------


def _child_check_arrays(source_handle: RingHandle, sink_handle: RingHandle, count: int) -> None:
    """Spawned child: read ``count`` arrays, check them, report each back through ``sink``."""
    source = ShmRing.attach(source_handle)
    sink = ShmRing.attach(sink_handle)
    try:
        try:
            source.put("intruder")
        except RingConflict as exc:
            sink.put(str(exc))
        low, high = segment_range(source)
        for i in range(count):
            array = source.get(timeout=CHILD_S)
            inside = low <= array.ctypes.data and array.ctypes.data + array.nbytes <= high
            sink.put((i, array.shape, bool((array == i).all()), inside))
            del array
        item = source.get(timeout=CHILD_S)
        sink.put(item)
    finally:
        source.close()
        sink.close()


def test_round_trip_with_a_spawned_child(ring_name: str) -> None:
    """A spawned child attaches, reads arrays in place, checks them and answers on a 2nd ring."""
    count = 12
    source = ShmRing.create(slots=3, slot_bytes=1 << 20, name=ring_name)
    # room for every answer: the parent reads them only once it has put everything
    sink = ShmRing.create(slots=count + 2, slot_bytes=1 << 16, name=f"{ring_name}b")
    try:
        source.put(np.full((120, 160, 3), 0, np.uint8))  # the producer role is ours first
        child = SPAWN.Process(
            target=_child_check_arrays, args=(source.handle(), sink.handle(), count)
        )
        child.start()
        for i in range(1, count):
            source.put(np.full((120, 160, 3), i, np.uint8), timeout=CHILD_S)
        item = _item()
        source.put(item, timeout=CHILD_S)
        conflict = sink.get(timeout=CHILD_S)
        results = [sink.get(timeout=CHILD_S) for _ in range(count)]
        echoed = sink.get(timeout=CHILD_S)
        child.join(CHILD_S)
        assert child.exitcode == 0
    finally:
        source.close()
        sink.close()
        source.unlink()
        sink.unlink()
    assert conflict.startswith(f"ring '{ring_name}' already has a producer (pid {os.getpid()}")
    assert results == [(i, (120, 160, 3), True, True) for i in range(count)]
    assert echoed.metadata == item.metadata
    assert_same(echoed.payload, item.payload)


def _child_hold_a_lease(source_handle: RingHandle, sink_handle: RingHandle) -> None:
    """Spawned child: take one array, say so, and hold the view until killed."""
    source = ShmRing.attach(source_handle)
    sink = ShmRing.attach(sink_handle)
    held = source.get(timeout=CHILD_S)
    sink.put(int(held[0]))
    time.sleep(CHILD_S)


def test_child_killed_holding_a_lease_leaves_no_segment(ring_name: str) -> None:
    """SIGKILL a child that holds a leased view: owner.unlink() still leaves /dev/shm clean."""
    source = ShmRing.create(slots=2, slot_bytes=1 << 16, name=ring_name)
    sink = ShmRing.create(slots=2, slot_bytes=4096, name=f"{ring_name}b")
    child = SPAWN.Process(target=_child_hold_a_lease, args=(source.handle(), sink.handle()))
    child.start()
    try:
        source.put(np.full(100, 42, np.int64), timeout=CHILD_S)
        assert sink.get(timeout=CHILD_S) == 42
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join(CHILD_S)
        assert child.exitcode == -signal.SIGKILL
        assert source.statistics().slots_in_use == 1  # never handed back
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        source.close()
        sink.close()
        source.unlink()
        sink.unlink()
    assert not os.path.exists(f"/dev/shm/{ring_name}")
    assert not os.path.exists(f"/dev/shm/{ring_name}b")


def test_process_with_its_own_resource_tracker_does_not_unlink_on_exit(ring_name: str) -> None:
    """A process that is not our child (own tracker) attaches and exits: the segment stays."""
    with ShmRing.create(slots=1, slot_bytes=1024, name=ring_name) as ring:
        handle = ring.handle()
        code = (
            "from rxstream.ipc._segment import Segment\n"
            f"segment = Segment.attach({ring_name!r}, {handle.owner_pid}, {handle.tracker!r})\n"
            "assert bytes(segment.buf[:8]) == b'RXSRING1'\n"
            "segment.release()\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert (result.returncode, result.stderr) == (0, "")
        assert os.path.exists(f"/dev/shm/{ring_name}")
        ring.put(1)
        assert ring.get(timeout=5) == 1


# --- a boundary's reader on a rank that replicates the generations -----------------------------


def _boundary_pair(ring_name: str, replicas: Any) -> tuple[ShmRing, ShmRing, Any, Any]:
    """A ring, its other side, a boundary writer's send and a reader's receive over them."""
    from rxstream._kernel._stats import StageCounters
    from rxstream.ranks._boundary import Boundary

    owner = ShmRing.create(slots=2, slot_bytes=4096, name=ring_name)
    other = ShmRing.attach(owner.handle())
    send = Boundary("a>b", owner).sender(StageCounters("a", "pipe"))
    receive = Boundary("a>b", other, replicas=replicas).receiver()
    return owner, other, send, receive


def test_reader_holds_a_newer_generation_until_the_replicas_reach_it(ring_name: str) -> None:
    """An item of a generation this rank has not seen waits for its replicas (the doc with them).

    The controller's steer goes to the rank over another connection than the item, which may
    overtake it; a stage here would then read the doc as it was before the steer.
    """
    from rxstream._kernel._generations import Generations

    replicas = Generations()
    owner, other, send, receive = _boundary_pair(ring_name, replicas)
    try:
        send(PipelineItem(b"old", PipelineMetadata()))
        assert receive(other.get(timeout=5)).payload == b"old"  # generation 0: no wait
        send(PipelineItem(b"new", PipelineMetadata(prompt_generation=1)))
        steer = threading.Timer(0.1, replicas.steer)
        steer.start()
        got = receive(other.get(timeout=5))
        seen = replicas.prompt  # what a stage reading the doc now would see
        steer.join()
        assert (got.payload, got.metadata.prompt_generation, seen) == (b"new", 1, 1)
    finally:
        other.close()
        owner.close()
        owner.unlink()


def test_reader_waits_for_replicas_a_bounded_time(
    ring_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas that never come do not hold the item for good: it goes on after CATCH_UP_S."""
    from rxstream._kernel._generations import Generations
    from rxstream.ranks import _boundary

    monkeypatch.setattr(_boundary, "CATCH_UP_S", 0.05)
    owner, other, send, receive = _boundary_pair(ring_name, Generations())
    try:
        send(PipelineItem(b"x", PipelineMetadata(prompt_generation=3, flush_generation=2)))
        got = receive(other.get(timeout=5))
        assert (got.payload, got.metadata.prompt_generation) == (b"x", 3)
    finally:
        other.close()
        owner.close()
        owner.unlink()
