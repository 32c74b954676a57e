"""The boundary factories a :class:`~rxstream.runtime._run.Run` is given (one per run).

:class:`RingBoundaries` crosses every edge through a shared-memory ring — handed over by the
launcher, or made here when every rank runs in this process — plus a
:class:`~rxstream.ranks._cudaxing.CudaCrossing` for CUDA tensors when the process has CUDA.
:class:`LinkBoundaries` crosses the edges it is given a :class:`~rxstream.ranks._channel.Channel`
for over that channel (``torch.distributed``: CUDA tensors cross inside it), and the others
through its rings.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from rxstream._kernel._generations import Generations
from rxstream.ipc import RingSpec, ShmRing
from rxstream.ranks._boundary import Boundary
from rxstream.ranks._channel import Channel
from rxstream.ranks._cudaxing import CudaCrossing, default_cuda_api

__all__ = ["LinkBoundaries", "RingBoundaries"]


class RingBoundaries:
    """Boundaries over shared-memory rings.

    ``rings`` are the launcher's, by edge name, with ``releases`` (the CUDA release pipes); an
    edge without one gets a ring made here, unlinked at once (both sides use this mapping)
    and closed by the run. ``cuda_api`` (default: the real one when torch has CUDA here) makes
    a CUDA crossing for every boundary; ``in_process``: every rank runs in this process, so a
    CUDA tensor may cross by reference when the api allows it. ``spec``: the rings' geometry.
    """

    def __init__(
        self,
        *,
        rings: Mapping[str, ShmRing] | None = None,
        releases: Mapping[str, tuple[Connection, Connection]] | None = None,
        cuda_api: Any = None,
        spec: RingSpec | None = None,
        in_process: bool = False,
    ) -> None:
        self._rings = dict(rings or {})
        self._releases = dict(releases or {})
        self._cuda_api = cuda_api if cuda_api is not None else default_cuda_api()
        self._spec = spec or RingSpec()
        self._local = in_process and self._cuda_api is not None and self._cuda_api.local_refs
        self._owned: list[ShmRing] = []

    def __call__(
        self, name: str, *, timing: bool, replicas: Generations | None, cuda: bool = True
    ) -> Boundary:
        ring = self._rings.get(name)
        if ring is None:  # every rank in this process: this run owns the ring
            spec = self._spec
            ring = ShmRing.create(slots=spec.slots, slot_bytes=spec.slot_bytes)
            ring.unlink()  # both sides use this mapping: no name needed, none left behind
            self._owned.append(ring)
        crossing = None
        if self._cuda_api is not None and cuda:
            release = self._releases.get(name) or multiprocessing.Pipe(duplex=False)
            crossing = CudaCrossing(
                self._cuda_api, release, local=self._local, spec=self._spec, name=name
            )
        return Boundary(name, ring, timing=timing, cuda=crossing, replicas=replicas)

    def close(self) -> None:
        for ring in self._owned:
            ring.unlink()


class LinkBoundaries:
    """Boundaries over ``links`` where there is one for the edge, else over ``rings``."""

    def __init__(self, links: Mapping[str, Channel], rings: RingBoundaries) -> None:
        self._links = dict(links)
        self._rings = rings

    def __call__(
        self, name: str, *, timing: bool, replicas: Generations | None, cuda: bool = True
    ) -> Boundary:
        link = self._links.get(name)
        if link is None:
            return self._rings(name, timing=timing, replicas=replicas, cuda=cuda)
        # the channel's reader catches up on the generations itself; CUDA tensors cross
        # inside it, not as IPC refs
        return Boundary(name, link, timing=timing)

    def close(self) -> None:
        self._rings.close()
