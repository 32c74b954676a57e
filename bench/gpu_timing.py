"""The engine's GPU-true stage time on a real GPU: ``gpu_ms`` against a hand-made CUDA-event
measurement of the same kernel, and ``compute_ms`` as the launch.

A stage declared ``device="cuda"`` runs ``--matmuls`` float32 matmuls of ``--size`` squared
(a kernel of known size) and returns without synchronising; the stage after it takes the
result off the GPU (the consumer), then the sink folds the record. Before the pipeline, the
same work is timed by hand: CUDA events around it, ``end.synchronize()``, ``elapsed_time``
(median of ``--rounds`` after warm-ups). Checks (any failure exits 1, printing why):

1. CUDA is available (else ``gpu_timing: FAILED``: this check must not pass by skipping);
2. every record's hop of the stage has ``gpu_ms`` (none unresolved), and its median is within
   ``--tolerance`` (15 %) of the hand-made median;
3. the stage's median ``compute_ms`` is under half the hand-made GPU time: the host stamps time
   the launch, the GPU work lands in ``gpu_ms``;
4. with ``RXSTREAM_NVTX=1``, the same pipeline runs (its NVTX ranges pushed and popped through
   torch) and still resolves every ``gpu_ms``.

Run ``python bench/gpu_timing.py`` on a machine with CUDA (seconds on an H200);
``bench/gpu_check.sh`` runs it as a step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import rxstream
from rxstream.timing import TimingRecord
from rxstream.timing._gpu import NVTX_ENV


def operands(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float32 matrices of ``size`` squared on the GPU."""
    a = torch.randn(size, size, device="cuda")
    return a, a.clone()


def kernel(a: torch.Tensor, b: torch.Tensor, matmuls: int) -> torch.Tensor:
    """``matmuls`` matmuls of ``a`` by ``b`` on the current stream (returns at launch)."""
    out = a
    for _ in range(matmuls):
        out = torch.mm(a, b)
    return out


def by_hand(a: torch.Tensor, b: torch.Tensor, matmuls: int, rounds: int) -> float:
    """The median GPU ms of ``kernel``: CUDA events around it, waited for."""
    times: list[float] = []
    for index in range(rounds + 3):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        kernel(a, b, matmuls)
        end.record()
        end.synchronize()
        if index >= 3:  # warm-ups left out
            times.append(start.elapsed_time(end))
    median: float = statistics.median(times)
    return median


def engine(a: torch.Tensor, b: torch.Tensor, matmuls: int, rounds: int) -> list[TimingRecord]:
    """The records of ``rounds`` inputs through ``input | mm (cuda) | take (cpu) | video``."""
    ctx = rxstream.Context()
    records: list[TimingRecord] = []

    def mm(_: int) -> torch.Tensor:
        return kernel(a, b, matmuls)

    def take(out: torch.Tensor) -> float:
        return float(out[0, 0].item())  # the consumer: the frame off the GPU

    pipeline = (
        ctx.input("mouse")
        | ctx.pipe(mm, name="mm", device="cuda")
        | ctx.pipe(take, name="take")
        | ctx.stream("video", on_timing=records.append)
    )
    for index in range(rounds):
        pipeline.feed("mouse", index)
    pipeline.drive(frames=rounds)
    return records


def check(records: list[TimingRecord], hand_ms: float, tolerance: float, what: str) -> list[str]:
    """The failures of checks 2 and 3 on ``records`` (none: passed), the figures printed."""
    hops = [hop for r in records for hop in r.hops if hop.name == "mm"]
    failures = []
    if not hops:
        return [f"{what}: no record has the mm hop ({len(records)} records)"]
    unresolved = sum(hop.gpu_ms is None for hop in hops)
    gpu = [hop.gpu_ms for hop in hops if hop.gpu_ms is not None]
    compute = statistics.median(hop.compute_ms for hop in hops)
    gpu_median = statistics.median(gpu) if gpu else float("nan")
    print(
        f"{what}: {len(hops)} records, gpu_ms median {gpu_median:.3f} (by hand {hand_ms:.3f}), "
        f"compute_ms median {compute:.3f}, unresolved {unresolved}"
    )
    if unresolved or not all(hop.gpu for hop in hops):
        failures.append(f"{what}: {unresolved} of {len(hops)} mm hops have no gpu_ms")
    if gpu and abs(gpu_median - hand_ms) > tolerance * hand_ms:
        failures.append(
            f"{what}: gpu_ms median {gpu_median:.3f} is not within {tolerance:.0%} of the "
            f"hand-made {hand_ms:.3f}"
        )
    if compute >= hand_ms / 2:
        failures.append(
            f"{what}: compute_ms median {compute:.3f} is not under half the GPU time "
            f"{hand_ms:.3f}: the host waited for the GPU"
        )
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--matmuls", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_timing: FAILED: CUDA is not available (torch.cuda.is_available() is False)")
        return 1
    print(f"# {torch.cuda.get_device_name()}, {args.matmuls} matmuls of {args.size}^2 float32")
    a, b = operands(args.size)
    hand_ms = by_hand(a, b, args.matmuls, args.rounds)
    failures = check(engine(a, b, args.matmuls, args.rounds), hand_ms, args.tolerance, "engine")
    os.environ[NVTX_ENV] = "1"
    try:
        nvtx = engine(a, b, args.matmuls, args.rounds)
    finally:
        del os.environ[NVTX_ENV]
    failures += check(nvtx, hand_ms, args.tolerance, "engine, RXSTREAM_NVTX=1")
    for failure in failures:
        print(f"FAILED: {failure}")
    print("gpu_timing: FAILED" if failures else "gpu_timing: PASSED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
