"""Rank boundaries on one host: framing items for shared memory, and the ring that carries them.

``frame``/``unframe`` turn an object into a pickle header plus out-of-band buffers (array and
CPU tensor memory, not copied) and back; :class:`ShmRing` moves framed items from one producer
to one consumer through fixed slots of one shared-memory segment, read in place.
"""

from rxstream._exceptions import (
    CudaDeviceError,
    CudaIpcError,
    CudaRefError,
    CudaUnavailableError,
    FramingError,
    PayloadTooLarge,
    RingClosed,
    RingConflict,
)
from rxstream._util import fixup_module_metadata
from rxstream.ipc._framing import Framed, frame, unframe
from rxstream.ipc._ring import RingHandle, RingSpec, RingStatistics, ShmRing

__all__ = [
    "CudaApi",
    "CudaDeviceError",
    "CudaExporter",
    "CudaImporter",
    "CudaIpcError",
    "CudaPoolReader",
    "CudaPoolShare",
    "CudaPoolStatistics",
    "CudaRefError",
    "CudaSlotPool",
    "CudaSlotRef",
    "CudaTensorRef",
    "CudaUnavailableError",
    "FakeCudaApi",
    "Framed",
    "FramingError",
    "PayloadTooLarge",
    "RingClosed",
    "RingConflict",
    "RingHandle",
    "RingSpec",
    "RingStatistics",
    "ShmRing",
    "TorchCuda",
    "frame",
    "unframe",
]

fixup_module_metadata(__name__, globals())


_CUDA = frozenset(
    {
        "CudaApi",
        "CudaExporter",
        "CudaImporter",
        "CudaPoolReader",
        "CudaPoolShare",
        "CudaPoolStatistics",
        "CudaSlotPool",
        "CudaSlotRef",
        "CudaTensorRef",
        "FakeCudaApi",
        "TorchCuda",
    }
)


def __getattr__(name: str) -> object:
    # The CUDA bridge imports torch: load it on first use, not with the package.
    if name in _CUDA:
        from rxstream.ipc import _cuda

        value = getattr(_cuda, name)
        fixup_module_metadata(__name__, {name: value}, [name])
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
