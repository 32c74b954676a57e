"""Ranks: the code that runs one pipeline over several processes (docs/architecture.md).

Private modules; the public names are re-exported by :mod:`rxstream.launch` and
:mod:`rxstream.distributed`. Importing the package provides the runtime with the in-process
boundary factory and ``ctx.lease`` (:func:`rxstream.runtime._crossings.provide`).
"""

from __future__ import annotations

from typing import Any

from rxstream.ranks._factory import RingBoundaries as _RingBoundaries
from rxstream.ranks._lease import lease as _lease
from rxstream.runtime._crossings import provide as _provide


def _in_process(*, cuda_api: Any, spec: Any) -> _RingBoundaries:
    """The boundaries of a run whose ranks all run in this process (``Pipeline.start()``)."""
    return _RingBoundaries(cuda_api=cuda_api, spec=spec, in_process=True)


# The layers below (Pipeline.start(), ctx.lease) reach the boundaries through the runtime's
# registry, never by importing this package (docs/architecture.md, "Layers").
_provide(boundaries=_in_process, lease=_lease)
