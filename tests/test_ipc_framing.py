"""frame/unframe: pickle protocol 5 with array and CPU tensor memory out of band."""

from __future__ import annotations

import marshal
import pickle
import subprocess
import sys
import typing
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rxstream.ipc
from rxstream import PipelineItem, PipelineMetadata
from rxstream.ipc import FramingError, _framing, frame, unframe
from rxstream.ipc._framing import frame_array
from rxstream.item import _is_lazy, _stamped
from rxstream.testing import assert_same


def round_trip(obj: object) -> Any:
    """``obj`` framed and unframed over the very buffers frame handed out."""
    header, buffers = frame(obj)
    return unframe(header, buffers)


def data_address(buffer: pickle.PickleBuffer | memoryview) -> int:
    """Where ``buffer``'s bytes start in memory."""
    raw = buffer.raw() if isinstance(buffer, pickle.PickleBuffer) else buffer
    return int(np.frombuffer(raw, np.uint8).ctypes.data)


# --- numpy ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    ["uint8", "int16", "int64", "float16", "float32", "float64", "complex128", "bool"],
)
def test_numpy_arrays_round_trip_out_of_band(dtype: str) -> None:
    """A contiguous array of a plain dtype crosses as one out-of-band buffer, not in the pickle."""
    array = (np.arange(4096) % 7).astype(dtype).reshape(64, 64)
    header, buffers = frame(array)
    assert len(header) < 300
    assert [pickle.PickleBuffer(b).raw().nbytes for b in buffers] == [array.nbytes]
    assert_same(unframe(header, buffers), array)


@pytest.mark.parametrize(
    "array",
    [
        np.array(3.5),
        np.array(7, dtype=np.int8),
        np.empty(0, np.float32),
        np.empty((3, 0, 2), np.uint8),
        np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        np.arange(20.0)[::3],
        np.array([1, "two", None], dtype=object),
        np.arange(3).astype("<M8[ns]"),
    ],
    ids=["0d-float", "0d-int8", "empty", "empty-3d", "fortran", "strided", "object", "datetime"],
)
def test_numpy_edge_shapes_round_trip(array: np.ndarray[Any, Any]) -> None:
    """0-d, empty, Fortran-ordered, strided, object and datetime arrays come back equal."""
    got = round_trip(array)
    assert_same(got, array)
    assert got.flags.f_contiguous or not array.flags.f_contiguous


def test_array_headers_are_described_once_per_dtype_and_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain array's header is marshalled once per dtype and shape (a frame stream's are
    all alike), arrays that differ in byte order or shape alone still come back as they are,
    and the memo starts over past its bound."""
    dumped: list[object] = []
    dumps = marshal.dumps

    class Marshal:
        loads = staticmethod(marshal.loads)

        @staticmethod
        def dumps(value: Any, version: int) -> bytes:
            dumped.append(value)
            return dumps(value, version)

    monkeypatch.setattr(_framing, "marshal", Marshal)
    monkeypatch.setattr(_framing, "_described", {})
    little = np.arange(12, dtype="<u2").reshape(3, 4)
    arrays = [little, little + 1, little.astype(">u2"), little.reshape(4, 3), little * 2]
    for array in arrays:
        assert_same(unframe(*frame(array)), array)
    assert dumped == [("<u2", (3, 4)), (">u2", (3, 4)), ("<u2", (4, 3))]
    monkeypatch.setattr(_framing, "_DESCRIBED_MAX", 3)
    frame(np.zeros(5))
    assert len(_framing._described) == 1


def test_unframed_array_is_a_view_of_the_buffer() -> None:
    """Unframing does not copy: the array is a view of the buffer it was given."""
    array = np.arange(1000, dtype=np.float64)
    header, buffers = frame(array)
    got = unframe(header, buffers)
    assert got.ctypes.data == data_address(buffers[0]) == array.ctypes.data
    got[0] = -1.0
    assert array[0] == -1.0


def test_unframe_over_memoryviews_of_foreign_memory() -> None:
    """Buffers may be any memoryviews (e.g. of shared memory): the array views that memory."""
    array = np.arange(24, dtype=np.int32).reshape(4, 6)
    header, buffers = frame(array)
    elsewhere = bytearray(pickle.PickleBuffer(buffers[0]).raw())
    got = unframe(header, [memoryview(elsewhere)])
    assert_same(got, array)
    assert got.ctypes.data == data_address(memoryview(elsewhere))


# --- torch ----------------------------------------------------------------------------------

TENSORS: dict[str, Callable[[], torch.Tensor]] = {
    "float32": lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "bfloat16": lambda: torch.linspace(-2, 2, 10).to(torch.bfloat16),
    "float16": lambda: torch.linspace(-2, 2, 10).to(torch.float16),
    "int64": lambda: torch.arange(-5, 5),
    "bool": lambda: torch.tensor([True, False, True]),
    "complex64": lambda: torch.complex(torch.ones(3), torch.arange(3.0)),
    "float8": lambda: torch.linspace(-2, 2, 8).to(torch.float8_e4m3fn),
    "uint16": lambda: torch.tensor([0, 1, 65535], dtype=torch.uint16),
    "0d": lambda: torch.tensor(2.5),
    "0d-bfloat16": lambda: torch.tensor(2.5, dtype=torch.bfloat16),
    "empty": lambda: torch.empty(0, 3),
    "empty-bfloat16": lambda: torch.empty(2, 0, dtype=torch.bfloat16),
    "transposed": lambda: torch.arange(12.0).reshape(3, 4).t(),
    "strided-bfloat16": lambda: torch.arange(20.0).to(torch.bfloat16)[::3],
    "requires-grad": lambda: torch.ones(3, requires_grad=True),
    "conj": lambda: torch.complex(torch.ones(2), torch.ones(2)).conj(),
}


@pytest.mark.parametrize("make", TENSORS.values(), ids=TENSORS.keys())
def test_cpu_tensors_round_trip(make: Callable[[], torch.Tensor]) -> None:
    """CPU tensors of every dtype, shape and layout come back equal, with their dtype."""
    tensor = make()
    got = round_trip(tensor)
    assert_same(got, tensor.resolve_conj())
    assert got.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_contiguous_tensor_crosses_out_of_band_as_a_view(dtype: torch.dtype) -> None:
    """A contiguous tensor's memory is one out-of-band buffer; the unframed tensor views it."""
    tensor = torch.arange(1000).to(dtype)
    header, buffers = frame(tensor)
    assert len(header) < 300
    assert [pickle.PickleBuffer(b).raw().nbytes for b in buffers] == [
        2000 if dtype.itemsize == 2 else 4000
    ]
    got = unframe(header, buffers)
    assert got.data_ptr() == data_address(buffers[0]) == tensor.data_ptr()


def test_tensor_view_frames_only_its_own_elements() -> None:
    """A view into a larger storage crosses with its elements only, not the whole storage."""
    storage = torch.arange(1000, dtype=torch.float32)
    view = storage[100:110]
    _, buffers = frame(view)
    assert [pickle.PickleBuffer(b).raw().nbytes for b in buffers] == [40]
    assert_same(round_trip(view), view)


def test_tensor_requires_grad_crosses_as_a_leaf() -> None:
    """A tensor in an autograd graph crosses as a leaf with its values and requires_grad."""
    leaf = torch.ones(3, requires_grad=True)
    got = round_trip(leaf * 2)
    assert got.requires_grad
    assert got.is_leaf
    assert torch.equal(got.detach(), torch.full((3,), 2.0))


def test_read_only_buffers_give_a_writable_tensor_copy() -> None:
    """Unframed over read-only memory, a tensor is a private copy (torch needs writable memory)."""
    tensor = torch.arange(4, dtype=torch.int32)
    header, buffers = frame(tensor)
    frozen = bytes(pickle.PickleBuffer(buffers[0]).raw())
    got = unframe(header, [memoryview(frozen)])
    assert_same(got, tensor)


def test_torch_sparse_and_parameter_fall_back_to_torch_pickling() -> None:
    """Tensors numpy cannot view (sparse, subclasses) still cross, through torch's pickling."""
    sparse = torch.eye(3).to_sparse()
    got = round_trip(sparse)
    assert got.is_sparse
    assert torch.equal(got.to_dense(), torch.eye(3))
    parameter = torch.nn.Parameter(torch.ones(2))
    assert isinstance(round_trip(parameter), torch.nn.Parameter)


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0 (this machine has no CUDA)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def test_cuda_tensor_is_refused_pointing_at_the_cuda_bridge() -> None:
    """A CUDA tensor raises FramingError: CUDA tensors cross through the CUDA IPC bridge."""
    fake = torch.Tensor._make_subclass(_FakeCuda, torch.ones(2))
    with pytest.raises(
        FramingError,
        match=(
            r"^cannot send a payload of type 'dict' across a rank boundary: a CUDA tensor "
            r"\(device 'cuda:0'\) cannot be framed for the shared-memory ring; CUDA tensors "
            r"cross ranks through the CUDA IPC bridge$"
        ),
    ):
        frame({"frame": fake})


def test_tensor_on_another_device_is_refused() -> None:
    """A tensor on a device other than the CPU (here: meta) raises FramingError naming it."""
    with pytest.raises(
        FramingError,
        match=(
            r"^cannot send a payload of type 'Tensor' across a rank boundary: a tensor on "
            r"device 'meta' cannot be framed; only CPU tensors cross through the "
            r"shared-memory ring$"
        ),
    ):
        frame(torch.empty(3, device="meta"))


# --- structures and items -------------------------------------------------------------------


def test_nested_structures_round_trip() -> None:
    """Dicts, lists and tuples of arrays, tensors, bytes and scalars come back equal."""
    obj = {
        "frames": [np.full((4, 4, 3), i, np.uint8) for i in range(3)],
        "latents": (torch.randn(2, 8).to(torch.bfloat16), torch.arange(3)),
        "meta": {"id": 7, "name": "cam0", "blob": b"\x00\x01", "none": None, "ratio": 0.5},
        "empty": [],
    }
    header, buffers = frame(obj)
    assert len(buffers) == 5
    assert_same(unframe(header, buffers), obj)


def test_pipeline_item_with_lazy_timeline_keeps_its_metadata() -> None:
    """A hot-path item (metadata kept as base + stamps) crosses lazily and reads back equal."""
    metadata = PipelineMetadata(
        prompt_generation=2, pts=41, capture_ts=1.5, input_seq=9, timeline=(("src.in", 1.0),)
    )
    first = PipelineItem(np.zeros(4, np.float32), metadata)
    item = _stamped(first, np.arange(4, dtype=np.float32), ("a.in", 2.0, "a.out", 3.0))
    assert _is_lazy(item)
    got = round_trip(item)
    assert isinstance(got, PipelineItem)
    assert _is_lazy(got)
    assert got.metadata == item.metadata
    assert got.metadata.timeline == (("src.in", 1.0), ("a.in", 2.0), ("a.out", 3.0))
    assert_same(got.payload, item.payload)


def test_pipeline_item_with_plain_metadata_round_trips() -> None:
    """An item built with its metadata crosses with that metadata, equal."""
    item = PipelineItem(torch.ones(2), PipelineMetadata(pts=3, cutover=True))
    got = round_trip(item)
    assert got.metadata == item.metadata
    assert_same(got.payload, item.payload)


def test_unpicklable_payload_names_its_type() -> None:
    """A payload pickle refuses raises FramingError (also a TypeError) naming its type."""
    with pytest.raises(
        FramingError,
        match=(
            r"^cannot send a payload of type 'generator' across a rank boundary: "
            r"cannot pickle 'generator' object$"
        ),
    ) as caught:
        frame(x for x in range(3))
    assert isinstance(caught.value, TypeError)
    assert isinstance(caught.value.__cause__, TypeError)


def test_unpicklable_item_payload_names_the_payload_type() -> None:
    """For a PipelineItem the message names the payload's type, not PipelineItem."""

    def local() -> None: ...

    item = PipelineItem(local, PipelineMetadata())
    with pytest.raises(
        FramingError,
        match=r"^cannot send a payload of type 'function' across a rank boundary: .*local",
    ):
        frame(item)


def test_empty_and_scalar_payloads_have_no_buffers() -> None:
    """Payloads without array memory frame to a header alone."""
    for obj in (b"", None, 0, "", (), np.float32(1.5)):
        header, buffers = frame(obj)
        assert buffers == []
        assert unframe(header, []) == obj


def test_ipc_all_is_sorted_and_names_the_public_module() -> None:
    """rxstream.ipc declares a sorted __all__; the ring's classes say rxstream.ipc."""
    exported = list(rxstream.ipc.__all__)
    assert exported == sorted(exported)
    for name in ("RingHandle", "RingStatistics", "ShmRing", "frame", "unframe"):
        assert name in exported
        value = getattr(rxstream.ipc, name)
        if isinstance(value, type):
            assert value.__module__ == "rxstream.ipc", name
            typing.get_type_hints(value)


def test_importing_ipc_does_not_import_torch() -> None:
    """rxstream.ipc frames tensors only where torch is already imported; it never imports it."""
    code = "import sys, rxstream.ipc; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


# --- properties -----------------------------------------------------------------------------

dtypes = st.sampled_from(["u1", "i2", "<i8", "<f4", "<f8", "<c16", "?", ">f8"])
arrays = dtypes.flatmap(
    lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0))
)
scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=16)
values = st.recursive(
    scalars | arrays,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def assert_equal_nan(got: Any, want: Any) -> None:
    """Deep equality where NaN equals NaN (arrays from hypothesis hold NaNs)."""
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc")
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_equal_nan(got[key], want[key])
    elif isinstance(want, list | tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_equal_nan(g, w)
    else:
        assert got == want


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(values)
def test_frame_unframe_round_trips_any_structure(obj: Any) -> None:
    """unframe(frame(x)) == x for nested structures of scalars and arrays of any shape."""
    assert_equal_nan(round_trip(obj), obj)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays("<f4", hnp.array_shapes(min_dims=0, max_dims=3, min_side=0)),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int32]),
    st.booleans(),
)
def test_frame_unframe_round_trips_tensors(
    array: np.ndarray[Any, Any], dtype: torch.dtype, transpose: bool
) -> None:
    """Tensors of any shape, numpy-less dtypes and layouts come back bit-identical."""
    tensor = torch.from_numpy(np.asarray(np.nan_to_num(array, posinf=1.0, neginf=-1.0)))
    tensor = tensor.to(dtype)
    if transpose and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)
    got = round_trip(tensor)
    assert got.dtype == tensor.dtype
    assert got.shape == tensor.shape
    assert torch.equal(got, tensor)


# --- arrays framed without pickle -------------------------------------------------------------

PICKLE_HEAD = 0x80  # pickle's PROTO opcode: the first byte of every protocol-2+ pickle


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.arange(6, dtype=">i4"),  # byte order is part of the description
        np.array([True, False, True]),
        np.array([1 + 2j, -3j], dtype=np.complex64),
        np.array(3.5),  # 0-d
        np.empty((0, 3), dtype=np.uint16),
    ],
    ids=["float32-3d", "big-endian", "bool", "complex64", "0-d", "empty"],
)
def test_plain_arrays_are_described_not_pickled(array: np.ndarray) -> None:
    """A C-order array of numbers frames as a marshalled description and comes back as a view."""
    header, buffers = frame(array)
    assert header[0] != PICKLE_HEAD
    got = unframe(header, buffers)
    assert type(got) is np.ndarray
    assert (got.dtype, got.shape) == (array.dtype, array.shape)
    np.testing.assert_array_equal(got, array)
    if array.size:
        assert got.ctypes.data == data_address(buffers[0])  # a view, not a copy


@pytest.mark.parametrize(
    "array",
    [
        np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
        np.arange(12, dtype=np.int64)[::2],
        np.array([1, "a", None], dtype=object),
        np.zeros(3, dtype=[("x", "<f4"), ("y", "<i2")]),
        np.array(["2026-11-30"], dtype="datetime64[D]"),
    ],
    ids=["fortran", "strided", "object", "structured", "datetime"],
)
def test_other_arrays_take_numpys_pickling(array: np.ndarray) -> None:
    """Arrays a dtype string and a shape cannot describe exactly are pickled, and round-trip."""
    header, buffers = frame(array)
    assert header[0] == PICKLE_HEAD
    got = unframe(header, buffers)
    assert got.dtype == array.dtype
    assert got.shape == array.shape
    assert got.tolist() == array.tolist()


def test_frame_array_carries_the_values_beside_the_array() -> None:
    """frame_array(array, rest) comes back as ``(array, *rest)``, the array out of band."""
    array = np.arange(8, dtype=np.uint8)
    rest = (7, "hop.in", (1.5, None, True), b"raw")
    framed = frame_array(array, rest)
    assert framed is not None
    got = unframe(framed.header, framed.buffers)
    assert type(got) is tuple
    assert len(got) == 1 + len(rest)
    np.testing.assert_array_equal(got[0], array)
    assert got[1:] == rest


def test_frame_array_declines_what_marshal_does_not_take() -> None:
    """A companion marshal cannot write, or an array it cannot describe, gives ``None``."""
    array = np.arange(4, dtype=np.float64)
    assert frame_array(array, (object(),)) is None
    assert frame_array(np.array([1, None], dtype=object)) is None
