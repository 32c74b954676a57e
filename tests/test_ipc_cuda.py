"""The CUDA IPC bridge: refs, stream ordering, lifetime and the open cache, on `FakeCudaApi`;
`TorchCuda` across processes where there is a GPU (``bench/gpu_ipc.py`` measures it there)."""

from __future__ import annotations

import multiprocessing
import pickle
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import pytest
import torch

from rxstream._exceptions import (
    CudaDeviceError,
    CudaRefError,
    CudaUnavailableError,
    RxStreamError,
)
from rxstream.ipc._cuda import (
    CudaApi,
    CudaExporter,
    CudaImporter,
    CudaTensorRef,
    FakeCudaApi,
    TorchCuda,
)

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
