"""The CUDA IPC bridge and the slot pool: refs, stream ordering both ways, lifetime, leases,
copies and fallbacks, on `FakeCudaApi`; `TorchCuda` across processes where there is a GPU
(``bench/gpu_ipc.py`` measures it there)."""

from __future__ import annotations

import gc
import multiprocessing
import pickle
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, cast

import numpy as np
import pytest
import structlog
import torch

from rxstream._exceptions import (
    CudaDeviceError,
    CudaRefError,
    CudaUnavailableError,
    RxStreamError,
)
from rxstream.ipc import RingSpec
from rxstream.ipc._cuda import (
    CudaApi,
    CudaExporter,
    CudaImporter,
    CudaPoolReader,
    CudaPoolStatistics,
    CudaSlotPool,
    CudaSlotRef,
    CudaTensorRef,
    FakeCudaApi,
    TorchCuda,
)
from rxstream.ranks._boundary import Boundary
from rxstream.ranks._cudaxing import EXTRA_SLOTS, CudaCrossing, PoolShared

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA,
    reason="needs CUDA: torch.cuda.is_available() is False (run bench/gpu_ipc.py on a GPU)",
)


@pytest.fixture
def api() -> FakeCudaApi:
    """A fake CUDA with one producer and one consumer stream, in this process."""
    return FakeCudaApi()


def calls(api: FakeCudaApi, call: str) -> int:
    return sum(1 for name, _ in api.log if name == call)


def test_round_trip_shares_the_memory(api: FakeCudaApi) -> None:
    """The consumer's tensor has the producer's values on the same memory: a write shows."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    produced = api.to_device(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    consumed = importer.open(exporter.export(produced))
    assert torch.equal(consumed, produced)
    assert consumed.data_ptr() == produced.data_ptr()
    assert consumed.untyped_storage().nbytes() == produced.untyped_storage().nbytes()
    consumed[0, 0] = -1.0
    assert produced[0, 0].item() == -1.0


@pytest.mark.parametrize(
    "select",
    [
        lambda t: t,
        lambda t: t[1:, ::2],
        lambda t: t.T,
        lambda t: t[2],
        lambda t: t[3, 5],
    ],
    ids=["whole", "strided-crop", "transposed", "row", "scalar"],
)
def test_round_trip_keeps_the_view(
    api: FakeCudaApi, select: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """Offset, shape and strides cross unchanged: the consumer sees the producer's view."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    view = select(api.to_device(torch.arange(24, dtype=torch.int32).reshape(4, 6)))
    consumed = importer.open(exporter.export(view))
    assert torch.equal(consumed, view)
    assert consumed.stride() == view.stride()
    assert consumed.storage_offset() == view.storage_offset()
    assert consumed.data_ptr() == view.data_ptr()


@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.int64]
)
def test_round_trip_keeps_the_dtype(api: FakeCudaApi, dtype: torch.dtype) -> None:
    """Every dtype crosses by name and comes back bit for bit."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    produced = api.to_device(torch.arange(6).reshape(2, 3).to(dtype))
    consumed = importer.open(exporter.export(produced))
    assert consumed.dtype == dtype
    assert torch.equal(consumed, produced)


def test_ref_is_a_small_picklable_value(api: FakeCudaApi) -> None:
    """A ref pickles to a few hundred bytes and back unchanged: it crosses any channel."""
    ref = CudaExporter(api).export(api.to_device(torch.ones(2, 3, dtype=torch.float16)))
    data = pickle.dumps(ref)
    assert pickle.loads(data) == ref
    assert len(data) < 400
    assert ref == CudaTensorRef(1, 0, (b"mem-1", 12), 0, (2, 3), (3, 1), "float16", b"event-2")


def test_consumer_waits_on_the_producers_event_before_reading(api: FakeCudaApi) -> None:
    """Export records an event after the producer's work; open waits on it, then reads."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    produced = api.to_device(torch.zeros(4))
    produced.add_(1)
    api.launch(produced)
    importer.open(exporter.export(produced))
    assert api.log == [
        ("launch", "mem-1"),
        ("launch", "mem-1"),
        ("share", "mem-1"),
        ("record", "event-2"),
        ("open_event", "event-2"),
        ("wait", "event-2"),
        ("open", "mem-1"),
        ("read", "mem-1"),
    ]


def test_fake_refuses_a_read_before_the_wait(api: FakeCudaApi) -> None:
    """The fake catches a consumer that reads without waiting for the producer's event."""
    exporter = CudaExporter(api)
    ref = exporter.export(api.to_device(torch.zeros(4)))
    storage = api.open(ref.device, ref.storage)
    with pytest.raises(
        AssertionError,
        match=r"^read of fake CUDA memory mem-1 before the consumer's stream waited for the work "
        r"that wrote it \(written at step 1, waited up to step 0\)$",
    ):
        api.view(storage, torch.float32, ref.offset, ref.size, ref.stride)


def test_work_queued_after_export_is_not_ordered_before_the_read(api: FakeCudaApi) -> None:
    """The event covers the producer's work up to export, not what it queues afterwards."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    produced = api.to_device(torch.zeros(4))
    ref = exporter.export(produced)
    api.launch(produced)
    with pytest.raises(AssertionError, match=r"\(written at step 2, waited up to step 1\)$"):
        importer.open(ref)


def test_exporter_holds_the_storage_until_release(api: FakeCudaApi) -> None:
    """The producer may drop its tensor at once; the storage lives until the release id."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    produced = api.to_device(torch.arange(4.0))
    alive = weakref.ref(produced.untyped_storage())
    ref = exporter.export(produced)
    del produced
    assert alive() is not None
    assert exporter.pending() == 1
    consumed = importer.open(ref)
    assert consumed.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert importer.pending() == 1
    ref_id = importer.done(ref)
    assert ref_id == ref.ref_id
    assert importer.pending() == 0
    assert alive() is not None
    exporter.release(ref_id)
    assert alive() is None
    assert exporter.pending() == 0


def test_fake_refuses_memory_its_producer_freed(api: FakeCudaApi) -> None:
    """Without the exporter's hold the memory would be gone: the fake refuses to open it."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    ref = exporter.export(api.to_device(torch.zeros(4)))
    exporter.release(ref.ref_id)
    with pytest.raises(AssertionError, match=r"^fake CUDA memory mem-1 was freed by its producer$"):
        importer.open(ref)


def test_close_drops_every_hold(api: FakeCudaApi) -> None:
    """Closing the exporter drops every storage it holds; closing the importer forgets refs."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    produced = [api.to_device(torch.zeros(2)) for _ in range(3)]
    alive = [weakref.ref(t.untyped_storage()) for t in produced]
    refs = [exporter.export(t) for t in produced]
    importer.open(refs[0])
    del produced
    assert exporter.pending() == 3
    exporter.close()
    importer.close()
    assert exporter.pending() == 0
    assert importer.pending() == 0
    assert [ref() for ref in alive] == [None, None, None]


def test_second_open_of_one_allocation_hits_the_cache(api: FakeCudaApi) -> None:
    """Refs into one storage open it once; it stays open until the last of them is done."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    frames = api.to_device(torch.arange(8.0).reshape(2, 4))
    first, second = exporter.export(frames[0]), exporter.export(frames[1])
    a, b = importer.open(first), importer.open(second)
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert b.tolist() == [4.0, 5.0, 6.0, 7.0]
    assert calls(api, "open") == 1
    assert calls(api, "release_handle") == 1
    exporter.release(importer.done(first))
    third = exporter.export(frames)
    assert torch.equal(importer.open(third), frames)
    assert calls(api, "open") == 1
    exporter.release(importer.done(second))
    exporter.release(importer.done(third))
    del a, b
    assert torch.equal(importer.open(exporter.export(frames)), frames)
    assert calls(api, "open") == 2


def test_discard_gives_back_an_unopened_ref(api: FakeCudaApi) -> None:
    """A ref dropped unopened gives back its share's hold and returns its id for release."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    ref = exporter.export(api.to_device(torch.zeros(2)))
    exporter.release(importer.discard(ref))
    assert api.log[-1] == ("release_handle", "mem-1")
    assert calls(api, "open") == 0
    assert exporter.pending() == 0


def test_discard_refuses_an_open_ref(api: FakeCudaApi) -> None:
    """An opened ref ends with ``done``; discarding it is an error naming it."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    ref = exporter.export(api.to_device(torch.zeros(2)))
    importer.open(ref)
    with pytest.raises(
        CudaRefError,
        match=r"^discard takes a ref that is not open here \(done\(ref\) for an opened one\), "
        r"got ref id 1$",
    ):
        importer.discard(ref)


def test_fake_refuses_a_second_open_of_an_open_handle(api: FakeCudaApi) -> None:
    """Like CUDA, the fake refuses to open a handle that is open: the cache is needed."""
    exporter = CudaExporter(api)
    ref = exporter.export(api.to_device(torch.zeros(4)))
    storage = api.open(ref.device, ref.storage)
    with pytest.raises(
        AssertionError,
        match=r"^fake CUDA memory mem-1 is already open in this process "
        r"\(CUDA refuses to open one IPC handle twice\)$",
    ):
        api.open(ref.device, ref.storage)
    del storage


@pytest.mark.parametrize("api", [FakeCudaApi(), TorchCuda()], ids=["fake", "torch"])
def test_export_refuses_a_cpu_tensor(api: CudaApi[Any, Any]) -> None:
    """A tensor not on a CUDA device is refused with the rule and its device (a ValueError)."""
    with pytest.raises(
        CudaDeviceError,
        match=r"^export takes a tensor on a CUDA device \(CPU tensors cross through the "
        r"shared-memory ring\), got a float32 tensor of shape \(2, 3\) on cpu$",
    ) as caught:
        CudaExporter(api).export(torch.zeros(2, 3))
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, RxStreamError)


def test_export_without_cuda_is_refused() -> None:
    """A CUDA tensor in a process without CUDA is refused, naming the tensor."""
    api = FakeCudaApi(available=False)
    with pytest.raises(
        CudaUnavailableError,
        match=r"^cannot export a float32 tensor of shape \(2,\) on cuda:0: "
        r"CUDA is not available in this process$",
    ):
        CudaExporter(api).export(api.to_device(torch.zeros(2)))


@pytest.mark.parametrize(
    "api",
    [
        pytest.param(FakeCudaApi(available=False), id="fake"),
        pytest.param(
            TorchCuda(),
            id="torch",
            marks=pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here"),
        ),
    ],
)
def test_open_without_cuda_is_refused(api: CudaApi[Any, Any]) -> None:
    """A ref that reaches a process without CUDA is refused, naming the ref and its tensor."""
    producer = FakeCudaApi()
    ref = CudaExporter(producer).export(producer.to_device(torch.zeros(2, 3, dtype=torch.float16)))
    with pytest.raises(
        CudaUnavailableError,
        match=r"^cannot open CUDA tensor ref 1 \(a float16 tensor of shape \(2, 3\) on cuda:0\): "
        r"CUDA is not available in this process$",
    ):
        CudaImporter(api).open(ref)


def test_release_of_an_unknown_id_names_it(api: FakeCudaApi) -> None:
    """Releasing an id twice, or one never exported, is an error naming the id."""
    exporter = CudaExporter(api)
    ref = exporter.export(api.to_device(torch.zeros(2)))
    exporter.export(api.to_device(torch.zeros(2)))
    exporter.release(ref.ref_id)
    with pytest.raises(
        CudaRefError,
        match=r"^release takes a ref id this exporter holds \(exported, not yet released\), "
        r"got 1; it holds 1$",
    ):
        exporter.release(ref.ref_id)
    with pytest.raises(CudaRefError, match=r"got 99; it holds 1$"):
        exporter.release(99)


def test_done_and_open_check_the_ref(api: FakeCudaApi) -> None:
    """``done`` takes only an open ref, ``open`` only one that is not open yet."""
    exporter, importer = CudaExporter(api), CudaImporter(api)
    ref = exporter.export(api.to_device(torch.zeros(2)))
    with pytest.raises(
        CudaRefError,
        match=r"^done takes a ref this importer opened and is not done with, got ref id 1$",
    ):
        importer.done(ref)
    importer.open(ref)
    with pytest.raises(
        CudaRefError,
        match=r"^open takes a ref that is not open here \(done\(ref\) first\), got ref id 1$",
    ):
        importer.open(ref)
    assert importer.done(ref) == 1
    with pytest.raises(CudaRefError, match=r"got ref id 1$"):
        importer.done(ref)


def test_torch_view_rebuilds_offset_size_and_stride() -> None:
    """``TorchCuda.view`` puts a view back on a storage (checked here on a CPU storage)."""
    base = torch.arange(24, dtype=torch.int16).reshape(4, 6)
    view = base[1:, ::2]
    rebuilt = TorchCuda().view(
        base.untyped_storage(), torch.int16, int(view.storage_offset()), view.shape, view.stride()
    )
    assert torch.equal(rebuilt, view)
    assert rebuilt.data_ptr() == view.data_ptr()
    assert rebuilt.stride() == view.stride()


def _consume(conn: Connection) -> None:
    """The spawned consumer: open each ref, sum it, add one in place, send back id and sum."""
    importer = CudaImporter(TorchCuda())
    while (ref := conn.recv()) is not None:
        tensor = importer.open(ref)
        total = float(tensor.sum())
        tensor.add_(1)
        torch.cuda.current_stream().synchronize()
        del tensor
        conn.send((importer.done(ref), total))


@needs_cuda
def test_torch_cuda_round_trip_across_processes() -> None:
    """A CUDA view crosses to a spawned process on the same memory: its write comes back."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_consume, args=(child,), daemon=True)
    process.start()
    try:
        exporter = CudaExporter(TorchCuda())
        produced = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)[1:, ::2]
        expected = produced.sum().item()
        parent.send(exporter.export(produced))
        assert parent.poll(120), "the consumer did not answer"
        ref_id, total = parent.recv()
        assert total == expected
        assert produced.tolist() == [[5.0, 7.0], [9.0, 11.0]]
        exporter.release(ref_id)
        assert exporter.pending() == 0
    finally:
        parent.send(None)
        process.join(30)
    assert process.exitcode == 0


# --- the slot pool ----------------------------------------------------------------------------


class Pair:
    """A pool and its reader in one process: slots given back are queued until drained, as the
    boundary's release pipe queues them."""

    def __init__(self, api: FakeCudaApi, slots: int = 2, slot_bytes: int = 256) -> None:
        self.back: list[int] = []
        self.pool: CudaSlotPool[Any] = CudaSlotPool(api, 0, slots, slot_bytes, self.wait)
        self.reader: CudaPoolReader[Any] = CudaPoolReader(api, self.pool.share(), self.back.append)
        self.pool.open_returns(self.reader.release_events)

    def wait(self) -> None:
        """What the pool calls when every slot is in flight: take what came back."""
        if not self.back:
            raise TimeoutError("the producer would wait for good: nothing came back")
        self.drain()

    def drain(self) -> None:
        while self.back:
            self.pool.release(self.back.pop(0))


def test_pool_shares_its_slots_once_and_the_reader_opens_them_once(api: FakeCudaApi) -> None:
    """N slots and N events are made and shared at start, opened once; items add no handles."""
    pair = Pair(api, slots=3)
    before = list(api.log)
    assert [c for c, _ in before].count("allocate") == 3
    assert [c for c, _ in before].count("share") == 3
    assert [c for c, _ in before].count("open") == 3
    assert [c for c, _ in before].count("open_event") == 6  # slot events here, releases there
    for index in range(10):
        tensor = pair.reader.open(ref_of(pair, api.to_device(torch.full((4,), float(index)))))
        assert tensor.tolist() == [float(index)] * 4
        del tensor
        pair.drain()
    per_item = {c for c, _ in api.log[len(before) :]}
    assert per_item == {
        "launch",
        "copy",
        "record",
        "wait",
        "read",
        "record_release",
        "wait_release",
    }


def ref_of(pair: Pair, tensor: torch.Tensor) -> CudaSlotRef:
    ref = pair.pool.send(tensor)
    assert ref is not None
    return ref


def test_per_item_message_is_the_slot_and_the_view(api: FakeCudaApi) -> None:
    """Per item only slot, offset, shape, strides and dtype cross: no handle, a few dozen bytes."""
    pair = Pair(api, slots=2)
    crop = api.to_device(torch.arange(24, dtype=torch.int16).reshape(4, 6))[1:, ::2]
    ref = ref_of(pair, crop)
    assert ref == CudaSlotRef(0, 0, (3, 3), (3, 1), "int16")
    assert len(pickle.dumps(ref)) < 120
    assert torch.equal(pair.reader.open(ref), crop)


def test_consumer_reads_after_the_slots_event_and_producer_reuses_after_the_release(
    api: FakeCudaApi,
) -> None:
    """Copy, record, wait, read; then the release is recorded and waited before the slot's
    next write."""
    pair = Pair(api, slots=1)
    start = len(api.log)
    tensor = pair.reader.open(ref_of(pair, api.to_device(torch.zeros(4))))
    del tensor
    pair.drain()
    ref_of(pair, api.to_device(torch.ones(4)))
    share = pair.pool.share()
    slot = share.storages[0][0].decode()
    slot_event, release_event = share.events[0].decode(), pair.reader.release_events[0].decode()
    assert [
        (c, n if n.startswith("event") or n == slot else "frame") for c, n in api.log[start:]
    ] == [
        ("launch", "frame"),
        ("copy", slot),
        ("record", slot_event),
        ("wait", slot_event),
        ("read", slot),
        ("record_release", release_event),
        ("launch", "frame"),
        ("wait_release", release_event),
        ("copy", slot),
        ("record", slot_event),
    ]


def test_fake_refuses_a_slot_write_before_the_release_wait(api: FakeCudaApi) -> None:
    """A producer writing a slot the consumer read, without waiting for its release, is caught."""
    pair = Pair(api, slots=1)
    tensor = pair.reader.open(ref_of(pair, api.to_device(torch.zeros(4))))
    del tensor  # released: the release event is recorded, but the producer does not wait on it
    (slot,) = pair.pool._storages
    with pytest.raises(
        AssertionError,
        match=r"^write to fake CUDA memory mem-1 before the producer's stream waited for the "
        r"consumer's release of it \(read at consumer step 1, released up to step 0\)$",
    ):
        api.copy(torch.empty(0).set_(slot, 0, (4,), (1,)), torch.ones(4))
    pair.drain()
    back = pair.pool._returns[0]
    assert back is not None
    api.wait_release(0, back)
    api.copy(torch.empty(0).set_(slot, 0, (4,), (1,)), torch.ones(4))  # now it may


def test_a_slot_is_not_reused_while_any_consumer_view_lives(api: FakeCudaApi) -> None:
    """A crop of the consumer's tensor keeps its slot; the slot comes back with the last view."""
    pair = Pair(api, slots=2)
    tensor = pair.reader.open(ref_of(pair, api.to_device(torch.arange(8.0))))
    crop = tensor[2:4]
    del tensor
    gc.collect()
    assert pair.back == []
    assert pair.reader.pending() == 1
    ref_of(pair, api.to_device(torch.zeros(8)))  # the other slot
    with pytest.raises(TimeoutError):  # both in flight, one held by the crop: the producer waits
        pair.pool.send(api.to_device(torch.zeros(8)))
    assert crop.tolist() == [2.0, 3.0]
    del crop
    assert pair.back == [0]
    assert ref_of(pair, api.to_device(torch.zeros(8))).slot == 0


def test_reader_refuses_a_slot_its_views_still_hold(api: FakeCudaApi) -> None:
    """A ref to a slot still held here (a producer that reused it early) is an error."""
    pair = Pair(api, slots=2)
    ref = ref_of(pair, api.to_device(torch.zeros(2)))
    held = pair.reader.open(ref)
    with pytest.raises(
        CudaRefError,
        match=r"^open takes a slot ref whose slot is not held here, got slot 0 of 2 "
        r"\(a slot is reused only after its release\)$",
    ):
        pair.reader.open(ref)
    del held


def test_d2d_copy_path_counts_one_copy_per_item(api: FakeCudaApi) -> None:
    """A tensor not made in a slot is copied into one: one copy per item, the data intact."""
    pair = Pair(api, slots=2)
    produced = api.to_device(torch.arange(6.0).reshape(2, 3)).T  # strided: copied contiguous
    consumed = pair.reader.open(ref_of(pair, produced))
    assert torch.equal(consumed, produced)
    assert consumed.is_contiguous()
    assert consumed.data_ptr() != produced.data_ptr()
    assert (pair.pool.copies, pair.pool.zero_copy, pair.pool.items) == (1, 0, 1)
    assert calls(api, "copy") == 1


def test_a_lease_crosses_without_a_copy(api: FakeCudaApi) -> None:
    """A tensor produced into a lease is recognised by its memory and sent as it is."""
    pair = Pair(api, slots=2)
    out = pair.pool.lease((2, 3), torch.float32)
    assert out is not None
    assert api.device(out).type == "cuda"
    out.copy_(torch.arange(6.0).reshape(2, 3))
    api.launch(out)
    ref = ref_of(pair, out[:, 1:])  # a view of the lease goes as it is, offset and strides kept
    assert ref == CudaSlotRef(0, 1, (2, 2), (3, 1), "float32")
    consumed = pair.reader.open(ref)
    assert consumed.tolist() == [[1.0, 2.0], [4.0, 5.0]]
    assert consumed.data_ptr() == out[:, 1:].data_ptr()
    assert (pair.pool.zero_copy, pair.pool.copies) == (1, 0)
    assert calls(api, "copy") == 0


def test_a_lease_sent_twice_is_copied_the_second_time(api: FakeCudaApi) -> None:
    """A lease already in flight cannot go again as it is: the second send copies it."""
    pair = Pair(api, slots=2)
    out = pair.pool.lease((4,), torch.float32)
    assert out is not None
    first, second = ref_of(pair, out), ref_of(pair, out)
    assert (first.slot, second.slot) == (0, 1)
    assert (pair.pool.zero_copy, pair.pool.copies) == (1, 1)


def test_a_slot_comes_back_after_release_and_its_lease_dying(api: FakeCudaApi) -> None:
    """A slot is free again only once released and no producer view of its lease lives."""
    pair = Pair(api, slots=1)
    out = pair.pool.lease((4,), torch.float32)
    assert out is not None
    consumed = pair.reader.open(ref_of(pair, out))
    del consumed
    pair.drain()
    assert pair.pool.in_flight() == 0
    assert pair.pool.lease((4,), torch.float32) is None  # the producer still holds the lease
    del out
    again = pair.pool.lease((4,), torch.float32)
    assert again is not None
    del again  # an unsent lease that dies frees its slot at once
    assert pair.pool.lease((4,), torch.float32) is not None


def test_a_tensor_larger_than_a_slot_is_refused_by_the_pool(api: FakeCudaApi) -> None:
    """The pool refuses (None) a tensor or a lease larger than a slot: the caller falls back."""
    pair = Pair(api, slots=2, slot_bytes=64)
    assert pair.pool.send(api.to_device(torch.zeros(17))) is None
    assert pair.pool.lease((17,), torch.float32) is None
    assert pair.pool.send(api.to_device(torch.zeros(16))) is not None


def test_reader_copies_out_when_its_views_hold_every_slot(api: FakeCudaApi) -> None:
    """A downstream that keeps every item: the last free slot's item is copied out, so the
    producer never stalls for good."""
    pair = Pair(api, slots=2)
    kept = [pair.reader.open(ref_of(pair, api.to_device(torch.full((2,), 1.0))))]
    kept.append(pair.reader.open(ref_of(pair, api.to_device(torch.full((2,), 2.0)))))
    assert pair.back == [1]  # the second item was copied out: its slot is back already
    assert pair.reader.copies_out == 1
    pair.drain()
    kept.append(pair.reader.open(ref_of(pair, api.to_device(torch.full((2,), 3.0)))))
    assert [t.tolist() for t in kept] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert pair.reader.copies_out == 2


def test_pool_memory_stays_fixed_over_many_items(api: FakeCudaApi) -> None:
    """1,000 items through the pool allocate nothing beyond its slots and leave none in flight."""
    pair = Pair(api, slots=2)
    for index in range(1000):
        out = pair.pool.lease((4,), torch.float32)
        assert out is not None
        out.fill_(float(index))
        api.launch(out)
        ref = ref_of(pair, out)
        del out
        assert pair.reader.open(ref)[0].item() == float(index)
        pair.drain()
    assert calls(api, "allocate") == 2
    assert (pair.pool.zero_copy, pair.pool.copies, pair.pool.in_flight()) == (1000, 0, 0)


def test_release_of_a_slot_not_in_flight_names_it(api: FakeCudaApi) -> None:
    """Releasing a slot that is not in flight is an error naming the slot."""
    pair = Pair(api, slots=2)
    with pytest.raises(
        CudaRefError,
        match=r"^release takes a slot this pool sent and is not released yet, got 1; "
        r"0 of 2 are in flight$",
    ):
        pair.pool.release(1)


def test_reader_without_cuda_is_refused() -> None:
    """A pool share reaching a process without CUDA is refused, naming the pool."""
    producer = FakeCudaApi()
    pool: CudaSlotPool[Any] = CudaSlotPool(producer, 0, 2, 256, lambda: None)
    with pytest.raises(
        CudaUnavailableError,
        match=r"^cannot open a CUDA slot pool of 2 slots on cuda:0: "
        r"CUDA is not available in this process$",
    ):
        CudaPoolReader(FakeCudaApi(available=False), pool.share(), print)


# --- the crossing: pool made by the first item, fallback, backpressure ------------------------


def crossing(
    api: FakeCudaApi, spec: RingSpec, extra_slots: int = 0
) -> tuple[CudaCrossing, CudaCrossing]:
    """The writer's and the reader's crossing of one boundary, on one release pipe (pools of
    ``spec.slots`` slots, unless told more)."""
    release = multiprocessing.Pipe(duplex=False)
    writer = CudaCrossing(api, release, local=False, spec=spec, name="a>b", extra_slots=extra_slots)
    reader = CudaCrossing(api, release, local=False, spec=spec, name="a>b")
    return writer, reader


def test_first_item_carries_the_share_once_and_sizes_the_slots(api: FakeCudaApi) -> None:
    """The first CUDA tensor makes the pool (RingSpec's slots, its size if larger): its share
    crosses with that item only."""
    writer, reader = crossing(api, RingSpec(slots=3, slot_bytes=256), EXTRA_SLOTS)
    first = writer.export({"frame": api.to_device(torch.zeros(4 << 20, dtype=torch.uint8))})
    assert type(first) is PoolShared
    share, payload = first
    assert (len(share.storages), share.slot_bytes) == (3 + EXTRA_SLOTS, 4 << 20)
    assert type(payload["frame"]) is CudaSlotRef
    opened = reader.open(first)
    second = writer.export([api.to_device(torch.ones(2))])
    assert type(second) is list
    assert reader.open(second)[0].tolist() == [1.0, 1.0]
    assert calls(api, "open") == 3 + EXTRA_SLOTS
    del opened
    writer.close()
    reader.close()


def test_a_tensor_larger_than_a_slot_crosses_by_the_bridge_counted_and_logged_once(
    api: FakeCudaApi,
) -> None:
    """Larger than a slot: the per-tensor bridge, counted in fallbacks, one warning."""
    writer, reader = crossing(api, RingSpec(slots=2, slot_bytes=256))
    reader.open(writer.export(api.to_device(torch.zeros(4))))
    with structlog.testing.capture_logs() as logs:
        refs = [writer.export(api.to_device(torch.zeros(1024))) for _ in range(3)]
    assert all(type(ref) is CudaTensorRef for ref in refs)
    assert [log["event"] for log in logs] == ["cuda_pool_fallback"]
    assert (logs[0]["nbytes"], logs[0]["slot_bytes"], logs[0]["boundary"]) == (4096, 256, "a>b")
    assert writer.statistics().fallbacks == 3
    opened = [reader.open(ref) for ref in refs]
    assert [t.shape for t in opened] == [(1024,)] * 3
    del opened
    gc.collect()
    assert writer.held == 0
    writer.close()
    reader.close()


def test_statistics_count_copies_zero_copies_and_copies_out(api: FakeCudaApi) -> None:
    """The writer counts items, copies, zero copies and slots in flight; the reader copies out."""
    writer, reader = crossing(api, RingSpec(slots=2, slot_bytes=256))
    assert writer.statistics() == CudaPoolStatistics(0, 0, 0, 0, 0, 0, 0, 0, 0.0)
    kept = [reader.open(writer.export(api.to_device(torch.zeros(4))))]
    out = writer.lease((4,), torch.float32)
    assert out is not None
    kept.append(reader.open(writer.export(out)))
    del out
    writer.drain()  # the copied-out slot's release
    stats = writer.statistics()
    assert (stats.slots, stats.slot_bytes, stats.items) == (2, 256, 2)
    assert (stats.copies, stats.zero_copy, stats.fallbacks, stats.in_flight) == (1, 1, 0, 1)
    assert reader.statistics().copies_out == 1
    writer.close()
    reader.close()


def test_lease_is_a_slot_only_on_the_writers_thread_and_where_it_fits(api: FakeCudaApi) -> None:
    """``ctx.lease``: a slot for the thread whose output crosses, once the pool exists; a new
    tensor before, on other threads, for other devices, when too large, or once closed."""
    from rxstream.ranks._cudaxing import lease

    writer, reader = crossing(api, RingSpec(slots=2, slot_bytes=256))
    assert lease((4,), torch.float32).device.type == "cpu"  # no pool yet: a new (CPU) tensor
    kept = reader.open(writer.export(api.to_device(torch.zeros(4))))  # makes the pool, here
    pool = writer._pool
    assert pool is not None
    leased = lease((4,), torch.float32)
    assert leased.untyped_storage().data_ptr() in pool._slot_of
    elsewhere: list[torch.Tensor] = []
    thread = threading.Thread(target=lambda: elsewhere.append(lease((4,), torch.float32)))
    thread.start()
    thread.join(10)
    assert elsewhere[0].untyped_storage().data_ptr() not in pool._slot_of
    large = lease((1024,), torch.float32)  # larger than a slot: new memory on the pool's device
    assert api.device(large).type == "cuda"
    assert large.untyped_storage().data_ptr() not in pool._slot_of
    assert writer.lease((4,), torch.float32, "cuda:1") is None
    assert writer.lease((4,), torch.float32, "cpu") is None
    writer.close()
    assert writer.lease((4,), torch.float32) is None
    assert lease((4,), torch.float32).device.type == "cpu"  # closed: its thread is forgotten
    del kept, leased
    reader.close()


def test_writer_waits_for_a_slot_and_a_close_wakes_it(api: FakeCudaApi) -> None:
    """Every slot in flight: the writer blocks until one comes back; a close ends the wait."""
    from rxstream._exceptions import RingClosed

    writer, reader = crossing(api, RingSpec(slots=2, slot_bytes=256))
    held = reader.open(writer.export(api.to_device(torch.zeros(4))))  # slot 0, held here
    unread = writer.export(api.to_device(torch.ones(4)))  # slot 1, not opened yet
    outcomes: list[object] = []
    done = threading.Event()

    def send() -> None:
        try:
            outcomes.append(writer.export(api.to_device(torch.full((4,), 2.0))))
        except RingClosed as exc:
            outcomes.append(exc)
        done.set()

    thread = threading.Thread(target=send)
    thread.start()
    assert not done.wait(0.2)  # blocked: both slots in flight
    assert reader.open(unread).tolist() == [1.0] * 4  # the last slot: copied out, given back
    assert done.wait(10)
    thread.join(10)
    assert type(outcomes[0]) is CudaSlotRef
    assert writer.statistics().wait_s > 0
    done.clear()
    closer = threading.Thread(target=send)  # slot 0 held, slot 1 carries outcomes[0]
    closer.start()
    assert not done.wait(0.2)
    writer.close()
    assert done.wait(10)
    closer.join(10)
    assert type(outcomes[1]) is RingClosed
    del held
    reader.close()


def test_a_stage_that_leases_its_output_crosses_ranks_without_a_copy() -> None:
    """Through a run: the first frame makes the pool (one copy), leased frames then cross as
    they are, every slot comes back, and the consumer read each one after its event."""
    import time

    import rxstream
    from rxstream.transport import MemoryTransport

    api = FakeCudaApi()
    ctx = rxstream.Context(transport=MemoryTransport(keep=None), cuda_api=api)

    def render(index: int) -> torch.Tensor:
        out = ctx.lease((2, 4), torch.float32)
        if api.device(out).type != "cuda":  # no pool before the first item: mock memory
            out = api.to_device(out)
        out.fill_(float(index))
        api.launch(out)
        return cast(torch.Tensor, out)

    pipeline = (
        ctx.source(range(8), name="src")
        | ctx.pipe(render, name="render")
        | ctx.pipe(lambda t: float(t.sum()), name="check", rank=1)
        | ctx.stream("out")
    )
    pipeline.start()
    try:
        assert pipeline.wait(timeout=30)
        transport = ctx.transport
        assert isinstance(transport, MemoryTransport)
        assert transport.payloads("out") == [8.0 * i for i in range(8)]
        (edge,) = pipeline._run.boundaries.values()  # type: ignore[union-attr]
        boundary = cast(Boundary, edge)
        assert boundary.cuda is not None
        deadline = time.monotonic() + 30  # the stage threads let go of their last items
        while calls(api, "record_release") < 8 and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        assert calls(api, "record_release") == 8  # every slot was given back after its reads
        stats = boundary.cuda.statistics()
        assert (stats.items, stats.copies, stats.zero_copy, stats.fallbacks) == (8, 1, 7, 0)
    finally:
        pipeline.stop()
    # RingSpec's slots and the consumer side's, opened once
    assert calls(api, "allocate") == calls(api, "open") == 4 + EXTRA_SLOTS
    assert calls(api, "copy") == 1


def _consume_pool(conn: Connection) -> None:
    """The spawned consumer of a pool: open it once, then sum each item and give its slot back."""
    back: list[int] = []
    reader: CudaPoolReader[Any] = CudaPoolReader(TorchCuda(), conn.recv(), back.append)
    conn.send(reader.release_events)
    while (ref := conn.recv()) is not None:
        tensor = reader.open(ref)
        total = float(tensor.sum())
        ptr = tensor.data_ptr()
        del tensor
        conn.send((back.pop(), total, ptr))


@needs_cuda
def test_torch_cuda_pool_across_processes() -> None:
    """On a GPU: a pool opened once in a spawned process; leased items cross without a copy,
    others with one, every slot comes back."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_consume_pool, args=(child,), daemon=True)
    process.start()
    try:
        pool: CudaSlotPool[Any] = CudaSlotPool(TorchCuda(), 0, 2, 1 << 20, lambda: None)
        parent.send(pool.share())
        assert parent.poll(120), "the consumer did not open the pool"
        pool.open_returns(parent.recv())
        for index in range(6):
            if index % 2:
                tensor = torch.full((256, 256), float(index), device="cuda")
            else:
                leased = pool.lease((256, 256), torch.float32)
                assert leased is not None
                tensor = leased.fill_(float(index))
            ref = pool.send(tensor)
            assert ref is not None
            parent.send(ref)
            assert parent.poll(60), "the consumer did not answer"
            slot, total, _ = parent.recv()
            assert total == float(index) * 256 * 256
            pool.release(slot)
            del tensor
        assert (pool.zero_copy, pool.copies, pool.in_flight()) == (3, 3, 0)
    finally:
        parent.send(None)
        process.join(30)
    assert process.exitcode == 0


# --- examples/gpu_demo.py: the GPU path end to end -------------------------------------------


def _example() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "gpu_demo.py"
    spec = importlib.util.spec_from_file_location("gpu_demo_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_example_renders_and_decodes_with_torch_ops() -> None:
    """The example's render and decode are torch ops: uint8 RGB frames of the doc's size."""
    import rxstream

    example = _example()
    ctx = rxstream.Context(config={"height": 36, "width": 64})
    frames = example.build(ctx).drive(frames=2)
    want = example.decode_frame(
        example.render_frame(torch.empty(36, 64, 3, dtype=torch.float16), 1)
    )
    assert [frame.shape for frame in frames] == [(36, 64, 3)] * 2
    assert frames[1].dtype == np.uint8
    assert np.array_equal(frames[1], want.numpy())
    assert not np.array_equal(frames[0], frames[1])  # the plasma moves


def test_gpu_example_crosses_ranks() -> None:
    """Render on rank 0, decode on rank 1: frames cross the boundary (the CPU ring here)."""
    import time

    import rxstream
    from rxstream.transport import MemoryTransport

    example = _example()
    transport = MemoryTransport(keep=None)
    ctx = rxstream.Context(transport=transport, config={"height": 18, "width": 32})
    pipeline = example.build(ctx)
    pipeline.start()
    try:
        deadline = time.monotonic() + 30
        while len(transport.items("video")) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        items = transport.items("video")[:4]
    finally:
        pipeline.stop()
    assert [item.payload.shape for item in items] == [(18, 32, 3)] * 4
    hops = [name for name, _ in items[0].metadata.timeline]
    assert (
        hops.index("render>decode.in") < hops.index("render>decode.out") < hops.index("decode.in")
    )


def test_gpu_example_declares_its_gpu_stages_and_times_nothing_itself() -> None:
    """render and decode are declared on CUDA where there is one (the engine times them), the
    stage functions are the plain torch ops (no hand-written events)."""
    import rxstream

    example = _example()
    pipeline = example.build(rxstream.Context(config={"height": 18, "width": 32}))
    placed = {node.stage.name: node.stage.device for node in pipeline.plan.nodes}
    want = "cuda" if torch.cuda.is_available() else None
    assert (placed["render"], placed["decode"]) == (want, want)
    assert not hasattr(example, "on_gpu")


@needs_cuda
def test_gpu_example_s_stages_get_gpu_ms_from_the_engine() -> None:
    """On CUDA, the example's decode declared on CUDA gets its GPU time in each record (its
    consumer, present, took the frame off the GPU before the sink folded it)."""
    import rxstream
    from rxstream.timing import TimingRecord

    example = _example()
    records: list[TimingRecord] = []
    ctx = rxstream.Context()

    def draw(index: int) -> torch.Tensor:
        out = torch.empty(36, 64, 3, dtype=torch.float16, device="cuda")
        frame: torch.Tensor = example.render_frame(out, index)
        return frame

    pipeline = (
        ctx.input("mouse")
        | ctx.pipe(draw, name="render", device="cuda")
        | ctx.pipe(example.decode_frame, name="decode", device="cuda")
        | ctx.pipe(example.present, name="present")
        | ctx.stream("video", on_timing=records.append)
    )
    for index in (1, 2, 3):
        pipeline.feed("mouse", index)
    pipeline.drive(frames=3)
    decodes = [hop for r in records for hop in r.hops if hop.name == "decode"]
    assert len(decodes) == 3
    assert all(hop.gpu and hop.gpu_ms is not None and hop.gpu_ms > 0 for hop in decodes)


def test_stop_wakes_a_writer_waiting_for_a_slot() -> None:
    """A writer blocked because every slot is in flight wakes when the run stops, and counts
    its item as dropped (``stopped``); the consumer stays blocked meanwhile."""
    import time

    import rxstream
    from rxstream.transport import MemoryTransport

    api = FakeCudaApi()
    ctx = rxstream.Context(transport=MemoryTransport(keep=None), cuda_api=api)
    ctx.ring_spec = RingSpec(slots=1, slot_bytes=4096)
    gate = threading.Event()

    def frames() -> Any:
        index = 0
        while True:
            yield api.to_device(torch.full((4,), float(index)))
            index += 1

    def check(tensor: torch.Tensor) -> float:
        gate.wait(30)
        return float(tensor.sum())

    pipeline = (
        ctx.source(frames, name="src")
        | ctx.pipe(lambda t: t, name="up")
        | ctx.pipe(check, name="check", rank=1)
        | ctx.stream("out")
    )
    pipeline.start()
    stopper = threading.Thread(target=pipeline.stop)
    try:
        (edge,) = pipeline._run.boundaries.values()  # type: ignore[union-attr]
        boundary = cast(Boundary, edge)
        assert boundary.cuda is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pool = boundary.cuda._pool
            if pool is not None and pool.in_flight() == pool.slots:
                break
            time.sleep(0.01)
        assert pool is not None
        assert pool.in_flight() == pool.slots == 1 + EXTRA_SLOTS  # the writer waits for one
        stopper.start()
        deadline = time.monotonic() + 30
        while not pipeline.statistics()["up"].dropped and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pipeline.statistics()["up"].dropped["stopped"] >= 1  # woken by the close
        assert not gate.is_set()
    finally:
        gate.set()
        if stopper.is_alive():
            stopper.join(30)
        else:
            pipeline.stop()
    assert not stopper.is_alive()
