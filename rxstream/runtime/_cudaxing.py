"""CUDA tensors across a rank boundary: exported as refs, opened in place, released back.

The boundary's writer swaps every CUDA tensor in a payload (the payload itself, or inside
lists, tuples and dicts) for a :class:`~rxstream.ipc.CudaTensorRef` from its
:class:`~rxstream.ipc.CudaExporter`, which holds the storage; the ring carries the small refs.
The reader opens each ref with its :class:`~rxstream.ipc.CudaImporter` (its stream waits on the
producer's event: no copy, no race) and, once the opened tensor is garbage collected, sends the
ref id back on the boundary's release pipe; the writer drains that pipe and releases the
storage. Two stages of one process that sit on different ranks cannot use CUDA IPC (a process
cannot open its own handle), so there a CUDA tensor crosses by reference through a local table.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the bridge imports torch: only a run that has CUDA loads it
    from rxstream.ipc._cuda import CudaApi, CudaExporter, CudaImporter, CudaTensorRef

__all__ = ["CudaCrossing", "LocalRef", "default_cuda_api"]


def default_cuda_api() -> Any:
    """The real CUDA api when this process has torch loaded and a GPU; else ``None``.

    A process without torch imported cannot hold a CUDA tensor, so nothing is loaded for it.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    from rxstream.ipc._cuda import TorchCuda

    return TorchCuda()


class LocalRef(tuple[int]):
    """A CUDA tensor parked in this process's table while it crosses an in-process boundary."""

    __slots__ = ()


_local: dict[int, Any] = {}
_local_ids = itertools.count(1)
_local_lock = threading.Lock()


def _map(payload: Any, fn: Callable[[Any], Any], kind: type | tuple[type, ...]) -> Any:
    """``payload`` with ``fn`` applied to every ``kind`` in it (through lists, tuples, dicts)."""
    if isinstance(payload, kind):
        return fn(payload)
    if isinstance(payload, list):
        return [_map(v, fn, kind) for v in payload]
    if isinstance(payload, tuple) and not hasattr(payload, "_fields"):
        return tuple(_map(v, fn, kind) for v in payload)
    if isinstance(payload, dict):
        return {k: _map(v, fn, kind) for k, v in payload.items()}
    return payload


class CudaCrossing:
    """The CUDA side of one boundary: export on the writer, open and release on the reader."""

    def __init__(
        self, api: CudaApi[Any, Any], release: tuple[Connection, Connection], *, local: bool
    ) -> None:
        import torch

        from rxstream.ipc._cuda import CudaExporter, CudaImporter, CudaTensorRef

        self._tensor = torch.Tensor
        self._ref = CudaTensorRef
        self._api = api
        self._local = local
        self._release_r, self._release_w = release
        self._exporter: CudaExporter[Any, Any] = CudaExporter(api)
        self._importer: CudaImporter[Any, Any] = CudaImporter(api)
        self._send_lock = threading.Lock()
        self._parked: set[int] = set()  # tensors of ours in the local table, not taken yet

    def _is_cuda(self, value: Any) -> bool:
        return isinstance(value, self._tensor) and self._api.device(value).type == "cuda"

    # --- the writer --------------------------------------------------------------------------

    def export(self, payload: Any) -> Any:
        """``payload`` with its CUDA tensors swapped for refs (releases drained first)."""
        self.drain()
        return _map(payload, self._export_one, self._tensor)

    def _export_one(self, tensor: Any) -> Any:
        if not self._is_cuda(tensor):
            return tensor
        if self._local:
            with _local_lock:
                token = next(_local_ids)
                _local[token] = tensor
                self._parked.add(token)
            return LocalRef((token,))
        return self._exporter.export(tensor)

    def drain(self) -> None:
        """Release every storage whose ref the reader has given back."""
        while self._release_r.poll():
            try:
                ref_id = self._release_r.recv()
            except (EOFError, OSError):
                return
            self._exporter.release(ref_id)

    @property
    def held(self) -> int:
        """Exported storages the reader has not given back yet."""
        self.drain()
        return self._exporter.pending()

    # --- the reader --------------------------------------------------------------------------

    def open(self, payload: Any) -> Any:
        """``payload`` with its refs opened as tensors over the producer's memory."""
        return _map(payload, self._open_one, (self._ref, LocalRef))

    def _open_one(self, ref: Any) -> Any:
        if isinstance(ref, LocalRef):
            with _local_lock:
                self._parked.discard(ref[0])
                return _local.pop(ref[0])
        tensor = self._importer.open(ref)
        weakref.finalize(tensor, self._give_back, ref)
        return tensor

    def _give_back(self, ref: CudaTensorRef) -> None:
        ref_id = self._importer.done(ref)
        # the writer's side may be gone: then its exporter dropped everything already
        with self._send_lock, contextlib.suppress(OSError):
            self._release_w.send(ref_id)

    def close(self) -> None:
        """Drop every hold and close the release pipe (at the end of the run)."""
        with _local_lock:  # tensors parked for a reader that stopped: let them go
            for token in self._parked:
                _local.pop(token, None)
            self._parked.clear()
        self._exporter.close()
        self._importer.close()
        self._release_r.close()
        self._release_w.close()
