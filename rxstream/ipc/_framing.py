"""Framing: an object as a small pickle header plus the out-of-band buffers it points at.

Pickle protocol 5 hands the memory of contiguous numpy arrays to a buffer callback instead of
copying it into the pickle; CPU torch tensors take the same road through a numpy view of their
memory (dtypes numpy lacks, e.g. bfloat16, through an integer view of the same width) and come
back with :func:`torch.from_numpy`. Unframing over buffers that live in shared memory therefore
gives arrays and tensors that are views of that memory, not copies.

CUDA tensors are refused here: they cross ranks through the CUDA IPC bridge, without a copy.
"""

from __future__ import annotations

import io
import marshal
import pickle
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, NamedTuple, cast

import numpy as np

from rxstream._exceptions import FramingError
from rxstream.item import PipelineItem, _reduced

__all__ = ["Buffer", "Framed", "frame", "frame_array", "unframe"]

Buffer = pickle.PickleBuffer | memoryview
"""An out-of-band buffer: what :func:`frame` hands out and :func:`unframe` takes back."""


class Framed(NamedTuple):
    """An object framed: what :func:`frame` gives, and what a ring puts as it is."""

    header: bytes
    """The pickle (or, for an array, the marshalled description)."""
    buffers: list[Buffer]
    """The out-of-band buffers, in the order the header refers to them."""


_PROTOCOL = 5


def frame(obj: object) -> Framed:
    """``obj`` as a pickle header and the out-of-band buffers (array memory, not copied).

    Raises :class:`FramingError` naming the payload's type when ``obj`` cannot be pickled or
    holds a tensor that is not on the CPU.
    """
    if type(obj) is np.ndarray:
        fast = frame_array(obj)
        if fast is not None:
            return fast
    buffers: list[Buffer] = []
    try:
        if type(obj) in _PLAIN or (type(obj) is np.ndarray and not obj.dtype.hasobject):
            header = pickle.dumps(obj, protocol=_PROTOCOL, buffer_callback=buffers.append)
        else:
            file = io.BytesIO()
            _Pickler(file, buffers.append).dump(obj)
            header = file.getvalue()
    except Exception as exc:
        payload = obj.payload if isinstance(obj, PipelineItem) else obj
        raise FramingError(
            f"cannot send a payload of type {type(payload).__name__!r} across a rank "
            f"boundary: {exc}"
        ) from exc
    return Framed(header, buffers)


def unframe(header: bytes | memoryview, buffers: Iterable[Buffer]) -> Any:
    """The object :func:`frame` framed; arrays and tensors are views of ``buffers``."""
    if header[0] != _ARRAY_HEAD:
        return pickle.loads(header, buffers=buffers)
    described = marshal.loads(header)
    (buffer,) = buffers
    array = np.frombuffer(cast(memoryview, buffer), described[0]).reshape(described[1])
    return array if len(described) == 2 else (array, *described[2])


def frame_array(array: np.ndarray[Any, Any], rest: tuple[Any, ...] | None = None) -> Framed | None:
    """``array`` (or the tuple ``(array, *rest)``) framed without pickle; ``None`` if it cannot be.

    For arrays of booleans or numbers in C order. The header is ``marshal`` (version 2) of
    ``(dtype, shape)`` or ``(dtype, shape, rest)``, a tuple, whose first byte is never a
    pickle's, and several times cheaper than numpy's own pickling. marshal writes any
    object with a buffer (a numpy scalar, an array) as ``bytes``, so ``rest`` must hold only
    what marshal gives back as it was (``int``, ``float``, ``bool``, ``None``, ``str``,
    ``bytes`` and tuples of them): the caller vouches for that.
    """
    dtype = array.dtype
    if dtype.kind not in _NUMBERS or not array.flags.c_contiguous:
        return None
    try:
        if rest is None:  # a frame stream's arrays share a few shapes: described once each
            key = (dtype, array.shape)
            header = _described.get(key)
            if header is None:
                if len(_described) >= _DESCRIBED_MAX:
                    _described.clear()
                header = _described[key] = marshal.dumps((dtype.str, array.shape), 2)
        else:
            header = marshal.dumps((dtype.str, array.shape, rest), 2)
    except ValueError:  # not marshal's (or nested too deep): pickle decides
        return None
    return Framed(header, [pickle.PickleBuffer(cast(memoryview, array))])


_described: dict[tuple[np.dtype[Any], tuple[int, ...]], bytes] = {}
"""Per (dtype, shape): the header :func:`frame_array` made for a plain array of them."""
_DESCRIBED_MAX = 256
"""The most entries ``_described`` keeps (arrays of ever new shapes: it starts over)."""
_ARRAY_HEAD = marshal.dumps((), 2)[0]
"""The first byte of a header :func:`_array_frame` made (a marshalled tuple); pickle's is
0x80 (its protocol opcode)."""
_NUMBERS = frozenset("biufc")
"""The dtype kinds a header names by ``dtype.str`` alone: booleans and numbers."""
_PLAIN = frozenset({bytes, bytearray, str, int, float, complex, bool, type(None)})
"""Types that cannot hold an item or a tensor: framed by plain ``pickle.dumps``."""


class _Refused(Exception):
    """A tensor this framing will not carry; :func:`frame` turns it into a FramingError."""


class _Pickler(pickle.Pickler):
    """Protocol 5 with out-of-band buffers, cheap items, and CPU tensors through numpy.

    ``reducer_override`` sees every object but builtin containers and atoms: items are
    reduced as ``rxstream.item`` says (a lazy item stays lazy), tensors as below. Without
    torch imported no tensor can exist, and none is looked for.
    """

    def __init__(self, file: io.BytesIO, buffer_callback: Callable[[Buffer], None]) -> None:
        super().__init__(file, protocol=_PROTOCOL, buffer_callback=buffer_callback)
        torch = sys.modules.get("torch")
        self._torch = torch
        self._tensor: Any = None if torch is None else torch.Tensor

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is PipelineItem:
            return _reduced(obj)
        tensor = self._tensor
        if tensor is None or not isinstance(obj, tensor):
            return NotImplemented
        device = obj.device
        if device.type != "cpu":
            if device.type == "cuda":
                raise _Refused(
                    f"a CUDA tensor (device '{device}') cannot be framed for the "
                    "shared-memory ring; CUDA tensors cross ranks through the CUDA IPC bridge"
                )
            raise _Refused(
                f"a tensor on device '{device}' cannot be framed; only CPU tensors cross "
                "through the shared-memory ring"
            )
        torch = self._torch
        assert torch is not None
        if type(obj) is not tensor or not _dense(torch, obj):
            return NotImplemented  # subclasses, sparse, quantized...: torch's own pickling
        view = _numpy_view(torch, obj.dtype)
        if view is _UNSUPPORTED:
            return NotImplemented
        data = obj.detach()
        if data.is_conj() or data.is_neg():
            data = data.resolve_conj().resolve_neg()
        if not data.is_contiguous():
            data = data.contiguous()
        if view is not None:
            data = data.view(getattr(torch, view))
        return _rebuild_tensor, (data.numpy(), _dtype_name(obj.dtype, view), obj.requires_grad)


# --- CPU torch tensors ------------------------------------------------------------------------


def _dense(torch: ModuleType, tensor: Any) -> bool:
    """Whether ``tensor`` is a plain strided tensor (what a numpy view can carry)."""
    return bool(tensor.layout is torch.strided and not tensor.is_quantized and not tensor.is_nested)


_UNSUPPORTED = "-"
_INT_OF_WIDTH = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_views: dict[Any, str | None] = {}
"""Per torch dtype: ``None`` (numpy has it), the integer dtype to view it as, or unsupported."""


def _numpy_view(torch: ModuleType, dtype: Any) -> str | None:
    """How a tensor of ``dtype`` becomes a numpy array: as is, through a view, or not at all."""
    try:
        return _views[dtype]
    except KeyError:
        pass
    view: str | None
    try:
        torch.empty(0, dtype=dtype).numpy()
        view = None
    except (TypeError, RuntimeError):  # "unsupported ScalarType": view it as integers
        view = _INT_OF_WIDTH.get(dtype.itemsize, _UNSUPPORTED)
        if view != _UNSUPPORTED:
            try:
                torch.empty(0, dtype=dtype).view(getattr(torch, view)).numpy()
            except (TypeError, RuntimeError):
                view = _UNSUPPORTED
    _views[dtype] = view
    return view


def _dtype_name(dtype: Any, view: str | None) -> str | None:
    """The torch dtype to view the rebuilt tensor as (``None``: it is already right)."""
    return None if view is None else str(dtype).removeprefix("torch.")


def _rebuild_tensor(array: np.ndarray[Any, Any], dtype: str | None, requires_grad: bool) -> Any:
    """A tensor sharing ``array``'s memory (the unpickling side of ``_Pickler``)."""
    import torch

    if not array.flags.writeable:  # from_numpy warns on read-only memory: copy instead
        array = array.copy()
    tensor = torch.from_numpy(array)
    if dtype is not None:
        tensor = tensor.view(getattr(torch, dtype))
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor
