"""A CUDA stage on rank 0 (on the mocked CUDA API, fake kernels of ``KERNEL_MS``) and the sink on
rank 1, for the test that its ``gpu_ms`` travels to the other rank's records.

A counter source steers every ``steer_every`` frames (each cutover is a timing record);
``denoise`` (``device="cuda"``, rank 0) queues one fake kernel a call; ``post``
(``device="cpu"``, rank 1: the boundary is the ring alone, as the fake api is one process's)
and the ``video`` sink run on rank 1, which folds the records.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import rxstream
from rxstream.ipc._cudafake import FakeCudaApi

KERNEL_MS = 7.5


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank; each rank has its own fake CUDA api."""
    api = FakeCudaApi()
    ctx.cuda_api = api
    doc = ctx.doc("control", defaults={"gain": 0, "steer_every": 4})
    every = doc.desired.steer_every.value

    def counter() -> Iterator[int]:
        for index in itertools.count():
            if index and index % every == 0:
                doc.steer(gain=doc.desired.gain.value + 1)
            yield index

    def denoise(index: int) -> int:
        api.kernel(KERNEL_MS)
        return index

    def post(index: int) -> int:
        return index + 1

    return (
        ctx.source(counter, rank=0)
        | ctx.pipe(denoise, rank=0, device="cuda")
        | ctx.pipe(post, rank=1, device="cpu")
        | ctx.stream("video", rank=1)
    )
