"""``ctx.lease``: an output buffer for the calling stage, in the slot its output crosses in.

A boundary's writer runs on the thread of the stage whose output crosses (a pipe's, a
source's); at its first item it offers that thread its ring (:func:`offer`). From then on a
``ctx.lease(shape, dtype)`` on that thread is an array (or a CPU tensor) over a free slot of
the ring, and the writer sends the stage's output without copying it (``ShmRing.lease``). A
CUDA tensor lease is the slot pool's (:mod:`rxstream.ranks._cudaxing`); anywhere else, or when
the ring has no slot to lease, the stage gets a new array or tensor, so the same code runs
everywhere. A lease that waits for a slot (the consumer is behind) is the stage's stall, as a
put on the full ring is: marked for the watchdog (the ring's ``on_wait``) and charged as its
``stalled_s``, not its ``work_s``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from rxstream._exceptions import ArgumentError, ArgumentTypeError
from rxstream.ipc import RingConflict, ShmRing
from rxstream.runtime._thread import charge_stall

__all__ = ["lease", "offer", "withdraw"]

_rings: weakref.WeakValueDictionary[int, ShmRing] = weakref.WeakValueDictionary()
"""Per thread (``threading.get_ident``): the ring whose slots that thread's stage leases (a
ring nobody else holds any more is forgotten; a closed one leases nothing)."""
_numpy_dtypes: dict[Any, np.dtype[Any] | None] = {}
"""Per torch dtype: the numpy dtype a leased array has (``None``: a tensor of it cannot)."""


def offer(ring: ShmRing) -> None:
    """Let the calling thread's stage lease ``ring``'s slots (the first ring offered wins)."""
    _rings.setdefault(threading.get_ident(), ring)


def withdraw(ring: ShmRing) -> None:
    """No thread leases ``ring``'s slots any more (its boundary closed)."""
    for thread, offered in list(_rings.items()):
        if offered is ring:
            _rings.pop(thread, None)


def lease(shape: Sequence[int], dtype: Any, device: Any = None) -> Any:
    """An empty array (numpy ``dtype``) or tensor (torch ``dtype``) for the stage's output.

    Over a free slot of the ring the calling thread's output crosses when there is one (see
    the module docstring), else new: a numpy array; a tensor on ``device`` (default: the CUDA
    slot pool's device, else ``cuda`` when available, else the CPU).
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(dtype, torch.dtype):
        if device is not None and str(device) != "cpu":
            raise ArgumentError(
                f"device must be None or 'cpu' for a numpy dtype (dtype {dtype!r}), got "
                f"{device!r}; pass a torch dtype for a tensor on another device"
            )
        try:
            kind = np.dtype(dtype)
        except TypeError as exc:
            raise ArgumentTypeError(
                f"dtype must be a numpy or torch dtype, got {dtype!r} ({type(dtype).__name__})"
            ) from exc
        size = tuple(int(n) for n in shape)
        leased = _ring_lease(_rings.get(threading.get_ident()), size, kind)
        return leased if leased is not None else np.empty(size, kind)
    from rxstream.ranks import _cudaxing

    thread = threading.get_ident()
    ring = _rings.get(thread)
    if device is None:  # the CUDA slot pool's device if there is one, else the default
        cpu = thread not in _cudaxing._leases and not torch.cuda.is_available()
    else:
        cpu = str(device) == "cpu"
    if ring is not None and cpu:
        tensor = _tensor_lease(torch, ring, shape, dtype)
        if tensor is not None:
            return tensor
    return _cudaxing.lease(shape, dtype, device)


def _tensor_lease(torch: Any, ring: ShmRing, shape: Sequence[int], dtype: Any) -> Any:
    """A CPU tensor of ``dtype`` over a leased slot of ``ring``, or ``None``."""
    try:
        kind = _numpy_dtypes[dtype]
    except KeyError:
        from rxstream.ipc._framing import _UNSUPPORTED, _numpy_view

        view = _numpy_view(torch, dtype)
        if view == _UNSUPPORTED:
            kind = None
        else:
            kind = torch.empty(0, dtype=dtype if view is None else getattr(torch, view)).numpy()
            kind = kind.dtype
        _numpy_dtypes[dtype] = kind
    if kind is None:
        return None
    array = _ring_lease(ring, tuple(int(n) for n in shape), kind)
    if array is None:
        return None
    tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def _ring_lease(
    ring: ShmRing | None, size: tuple[int, ...], kind: np.dtype[Any]
) -> np.ndarray[Any, Any] | None:
    """An array over a free slot of ``ring``, or ``None``: no ring, no room, closed, or this
    thread is not the ring's producer (a thread id reused after a boundary's thread ended)."""
    if ring is None:
        return None
    waited = ring._put_wait_ns
    try:
        return ring.lease(size, kind)
    except RingConflict:
        return None
    finally:  # a wait for a slot is the stage's stall, not its work (a put charges its own)
        if ring._put_wait_ns > waited:
            charge_stall((ring._put_wait_ns - waited) / 1e9)
