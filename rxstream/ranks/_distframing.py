"""How a :class:`~rxstream.ranks._distboundary.DistChannel` frames an item: a pickle
(protocol 5) in which every large array or tensor (``INLINE_BYTES`` and up) is only a
reference, its dtype and shape, sent after the pickle as a message of its own; the receiver
takes each referenced tensor as the pickle reaches its reference."""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from rxstream._exceptions import FramingError

__all__ = ["INLINE_BYTES", "Pickler", "Unpickler", "tensor_from"]

INLINE_BYTES = 16 << 10
"""Arrays and tensors smaller than this travel inside the pickle, not as messages of their own."""


class Pickler(pickle.Pickler):
    """Protocol 5; large arrays and tensors leave the pickle as references, collected in order."""

    def __init__(self, file: io.BytesIO, torch: Any, nccl: bool) -> None:
        super().__init__(file, protocol=5)
        self.out: list[Any] = []  # the tensors to send after the head, in reference order
        self._torch = torch
        self._tensor = None if torch is None else torch.Tensor
        self._nccl = nccl
        self._seen: dict[int, int] = {}  # id of an object sent already -> its index
        self._keep: list[Any] = []  # the objects behind _seen, alive while it holds their ids

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is np.ndarray:
            if obj.nbytes < INLINE_BYTES or obj.dtype.hasobject:
                return None
            ref = self._ref(obj)
            if ref is None:
                array = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
                if not array.flags.writeable:  # torch warns on read-only memory: copy it
                    array = array.copy()
                ref = self._add(obj, self._torch.from_numpy(array.reshape(-1).view(np.uint8)))
            return ("np", ref, obj.dtype, obj.shape)
        if kind is not self._tensor or self._tensor is None:
            return None
        torch = self._torch
        if obj.layout is not torch.strided or obj.is_quantized or obj.is_nested:
            return None  # torch's own pickling
        data = obj.detach()
        if data.is_conj() or data.is_neg():
            data = data.resolve_conj().resolve_neg()
        data = data.contiguous()
        cuda = data.device.type == "cuda"
        if data.device.type not in ("cpu", "cuda"):
            raise FramingError(
                f"cannot send a tensor on device '{data.device}' across hosts; "
                "only CPU and CUDA tensors cross"
            )
        flat = data.reshape(-1).view(torch.uint8)
        dtype = str(obj.dtype).removeprefix("torch.")
        if not cuda and flat.numel() < INLINE_BYTES:  # raw bytes inside the pickle
            return ("ti", flat.numpy().tobytes(), dtype, tuple(obj.shape), obj.requires_grad)
        ref = self._ref(obj)
        if ref is None:
            ref = self._add(obj, flat if (cuda and self._nccl) else flat.cpu())
        return ("t", ref, dtype, tuple(obj.shape), obj.requires_grad, cuda)

    def _ref(self, obj: Any) -> int | None:
        """The index of ``obj`` if it was sent already (one object referenced twice)."""
        return self._seen.get(id(obj))

    def _add(self, obj: Any, flat: Any) -> int:
        self._seen[id(obj)] = len(self.out)
        self._keep.append(obj)
        self.out.append(flat)
        return len(self.out) - 1


class Unpickler(pickle.Unpickler):
    """Takes each referenced tensor (in order) as the pickle reaches its reference.

    ``take(nbytes, cuda)`` receives the next tensor message: ``nbytes`` bytes, on the CUDA
    device when the writer sent it through the NCCL group.
    """

    def __init__(self, data: bytes, take: Callable[[int, bool], Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._take = take
        self._got: list[Any] = []

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "ti":
            return tensor_from(pid[1], pid[2], pid[3], pid[4])
        import torch

        ref = pid[1]
        if kind == "np":
            if ref == len(self._got):
                self._got.append(self._take(pid[2].itemsize * math.prod(pid[3]), False))
            return self._got[ref].numpy().view(pid[2]).reshape(pid[3])
        _, _, dtype_name, shape, grad, cuda = pid
        dtype = getattr(torch, dtype_name)
        if ref == len(self._got):
            self._got.append(self._take(dtype.itemsize * math.prod(shape), cuda))
        tensor = self._got[ref].view(dtype).reshape(shape)
        if cuda and tensor.device.type != "cuda":  # crossed through host memory
            if not torch.cuda.is_available():
                raise FramingError(
                    "a CUDA tensor arrived on a rank without CUDA; move it to the CPU before "
                    "the boundary"
                )
            tensor = tensor.to(f"cuda:{torch.cuda.current_device()}")
        if grad:
            tensor.requires_grad_(True)
        return tensor


def tensor_from(raw: bytes, dtype: str, shape: tuple[int, ...], grad: bool) -> Any:
    """A tensor of ``dtype`` and ``shape`` over a writable copy of ``raw``."""
    import torch

    if raw:
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    else:
        flat = torch.empty(0, dtype=torch.uint8)
    tensor = flat.view(getattr(torch, dtype)).reshape(shape)
    if grad:
        tensor.requires_grad_(True)
    return tensor
