"""The CUDA IPC bridge on a GPU: bit-exact round trips, no copy, stream order, and latency.

A consumer process (multiprocessing spawn) receives `CudaTensorRef`s from a
``CudaExporter(TorchCuda())`` over a Pipe and sends the release ids back, as a rank boundary does.

Checks (any failure exits 1):
1. bit-exact: for 4 KB float32, a 1080x1920x3 uint8 frame, 64 MB float16 and a strided crop of
   the frame, the consumer's float64 sum and SHA-256 of the bytes equal the producer's;
2. no copy: the consumer's storage has the producer's size, the tensor sits at the same byte
   offset in it, and a value the consumer writes is what the producer then reads;
3. stream order: the producer queues ~50 ms of GPU sleep, then a fill, and exports without
   synchronising; the consumer must see the fill. A control importer that skips the wait is
   reported too (it should see stale bytes, which shows the check can fail);
4. every ref is released: the exporter holds nothing at the end;
5. nothing stays allocated: once every tensor is freed, the producer's allocated CUDA memory is
   back where it started (a ref neither opened nor discarded would keep its block in torch's
   IPC limbo).

Latency, one tensor in flight, median and p99 of ``--rounds`` round trips after warm-ups:
- bridge, new tensor: a fresh tensor each round, export -> Pipe -> open, done -> Pipe -> release;
- bridge, same tensor: one tensor exported again each round;
- mp.Queue: ``torch.multiprocessing`` Queue put -> get in the consumer -> ack over the Pipe;
- Pipe only: a ref-sized message there and back, the messaging floor of the two above;
- clone: ``tensor.clone()`` in the producer and a stream sync: the device copy the bridge avoids;
- pool, leased: the boundary's slot pool (`CudaSlotPool`, shared and opened once): the producer
  leases a slot, sends its `CudaSlotRef`, the consumer opens it in place, drops it, and the slot
  index comes back (0 copies);
- pool, D2D copy: the same with a tensor made outside the pool, copied into a slot (1 copy).
Both pool rows are host round trips, as the bridge's are (the copy runs on the GPU meanwhile);
the pool's ratio to the Pipe-only row is printed and checked (<= 1.2x for the leased row).
A second table splits the bridge's new-tensor round trip into its parts.

Pool checks (failures exit 1): bit-exact through a lease and through the copy; the consumer's
tensor lies in place in its mapped slot (``data_ptr``) and the lease in the producer's slot;
the pool's counters say 0 copies for every leased item and 1 for every copied one; and over
``--items`` (10,000) leased items neither side's ``torch.cuda.memory_allocated`` grows (the
producer's allocation count from ``torch.cuda.memory_stats`` is printed beside it).

Run ``python bench/gpu_ipc.py`` on a machine with CUDA (well under a minute on an H200). Without
CUDA it prints ``no CUDA: skipped`` and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as torch_mp

# `python bench/gpu_ipc.py` from a checkout where the package is not installed: the repo root
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from rxstream.ipc._cuda import (
    CudaExporter,
    CudaImporter,
    CudaPoolReader,
    CudaSlotPool,
    CudaSlotRef,
    CudaTensorRef,
    TorchCuda,
)

PAYLOADS: list[tuple[str, tuple[int, ...], torch.dtype]] = [
    ("4 KB float32", (1024,), torch.float32),
    ("6 MB uint8 1080x1920x3", (1080, 1920, 3), torch.uint8),
    ("64 MB float16 4096x8192", (4096, 8192), torch.float16),
]
WARMUP = 20
ANSWER_S = 30.0
POOL_SLOTS = 2
POOL_LIMIT = 1.2  # the leased pool row's round trip over the Pipe-only row, at most
SLEEP_CYCLES = 100_000_000  # ~50 ms at the H200's ~2 GHz

Checksum = tuple[str, float]


def checksum(tensor: torch.Tensor) -> Checksum:
    """SHA-256 of the bytes (C order) and the float64 sum."""
    return hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest(), tensor.double().sum().item()


def first(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's first element, as a 0-d view (works on strided views too)."""
    return tensor[(0,) * tensor.dim()]


class TimedCuda(TorchCuda):
    """`TorchCuda` that times what ``open`` spends on the event and on mapping the memory."""

    def __init__(self) -> None:
        self.event_us = self.memory_us = 0.0

    def open_event(self, device: int, handle: bytes) -> torch.cuda.Event:
        start = time.perf_counter_ns()
        event = super().open_event(device, handle)
        self.event_us = (time.perf_counter_ns() - start) / 1e3
        return event

    def open(self, device: int, handle: tuple[Any, ...]) -> torch.UntypedStorage:
        start = time.perf_counter_ns()
        storage = super().open(device, handle)
        self.memory_us = (time.perf_counter_ns() - start) / 1e3
        return storage


class NoWaitCuda(TorchCuda):
    """`TorchCuda` without the consumer's stream wait: the control for the order check."""

    def wait_event(self, device: int, event: torch.cuda.Event) -> None:
        pass


def consume(conn: Connection, queue: Any) -> None:
    """The consumer process: serves the producer's messages until ``("stop",)``."""
    timed = TimedCuda()
    importer = CudaImporter(timed)
    unordered = CudaImporter(NoWaitCuda())
    reader: CudaPoolReader[Any] | None = None
    back: list[int] = []  # slots whose last view is gone, for the producer
    while True:
        message = conn.recv()
        kind = message[0]
        if kind == "stop":
            return
        if kind == "slot":  # the pool's round trip: open in place, drop, the slot goes back
            assert reader is not None
            tensor = reader.open(message[1])
            del tensor
            conn.send(back.pop())
            continue
        if kind == "pool":
            if reader is not None:
                reader.close()
            reader = CudaPoolReader(TorchCuda(), message[1], back.append)
            conn.send(reader.release_events)
        elif kind == "slot-check":
            assert reader is not None
            ref: CudaSlotRef = message[1]
            tensor = reader.open(ref)
            digest, total = checksum(tensor)
            mapped = reader._storages[ref.slot].data_ptr()
            in_place = tensor.data_ptr() - mapped == ref.offset * tensor.element_size()
            del tensor
            conn.send((back.pop(), digest, total, in_place))
        elif kind == "unpool":  # the pool's memory goes back to the producer's allocator
            if reader is not None:
                reader.close()
            reader = None
            gc.collect()
            conn.send(None)
        elif kind == "memory":
            gc.collect()
            torch.cuda.synchronize()
            conn.send(torch.cuda.memory_allocated())
        elif kind == "open":
            bridged: CudaTensorRef = message[1]
            start = time.perf_counter_ns()
            tensor = importer.open(bridged)
            opened = time.perf_counter_ns()
            ref_id = importer.done(bridged)
            del tensor  # the last user of the storage: torch syncs the stream and unmaps it
            freed = time.perf_counter_ns()
            open_us = (opened - start) / 1e3
            conn.send((ref_id, timed.event_us, timed.memory_us, open_us, (freed - opened) / 1e3))
        elif kind == "discard":
            conn.send(importer.discard(message[1]))
        elif kind == "echo":
            conn.send(message[1])
        elif kind == "queue":
            for _ in range(message[1]):
                tensor = queue.get()
                del tensor
                conn.send(None)
        elif kind in ("check", "unordered"):
            bridged, marker = message[1], message[2]
            side = importer if kind == "check" else unordered
            tensor = side.open(bridged)
            digest, total = checksum(tensor)
            storage = tensor.untyped_storage()
            facts = (digest, total, storage.nbytes(), tensor.data_ptr() - storage.data_ptr())
            if marker is not None:
                first(tensor).fill_(marker)
                torch.cuda.current_stream().synchronize()
            del tensor, storage
            conn.send((side.done(bridged), *facts))
        else:
            raise ValueError(f"unknown message {kind!r}")


def driver_version() -> str:
    """The NVIDIA driver's version, from nvidia-smi (``?`` without it)."""
    import subprocess

    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "?"


def answer(conn: Connection) -> Any:
    if not conn.poll(ANSWER_S):
        raise TimeoutError(f"the consumer did not answer within {ANSWER_S:.0f} s")
    return conn.recv()


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device="cuda")
    return torch.randint(0, 256, shape, dtype=dtype, device="cuda")


def check_round_trip(
    conn: Connection, exporter: CudaExporter[Any, Any], name: str, tensor: torch.Tensor
) -> list[str]:
    """Bit-exact and no-copy checks of one tensor; returns what failed."""
    digest, total = checksum(tensor)
    marker = 1000.0 if tensor.dtype.is_floating_point else (int(first(tensor).item()) + 1) % 256
    conn.send(("check", exporter.export(tensor), marker))
    ref_id, got_digest, got_total, nbytes, offset = answer(conn)
    storage = tensor.untyped_storage()
    failures = []
    if (got_digest, got_total) != (digest, total):
        failures.append(
            f"{name}: the consumer read other bytes (sha256 {got_digest[:16]} vs {digest[:16]}, "
            f"sum {got_total} vs {total})"
        )
    if (nbytes, offset) != (storage.nbytes(), tensor.data_ptr() - storage.data_ptr()):
        failures.append(
            f"{name}: the consumer's storage is not the producer's (storage {nbytes} bytes vs "
            f"{storage.nbytes()}, tensor at byte {offset} vs "
            f"{tensor.data_ptr() - storage.data_ptr()})"
        )
    seen = first(tensor).item()
    if seen != marker:
        failures.append(f"{name}: the consumer wrote {marker}, the producer reads {seen}")
    exporter.release(ref_id)
    return failures


def filled_late(conn: Connection, exporter: CudaExporter[Any, Any], kind: str) -> bool:
    """Export a tensor whose fill is queued behind a GPU sleep; did the consumer see the fill?"""
    tensor = torch.zeros(16 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    tensor.fill_(7)
    conn.send((kind, exporter.export(tensor), None))
    ref_id, _, total, _, _ = answer(conn)
    exporter.release(ref_id)
    torch.cuda.synchronize()
    return bool(total == 7 * tensor.numel())


def time_rounds(round_trip: Callable[[], object], rounds: int) -> list[float]:
    """Microseconds of each of ``rounds`` calls, after the warm-ups."""
    for _ in range(WARMUP):
        round_trip()
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        round_trip()
        times.append((time.perf_counter_ns() - start) / 1e3)
    return times


def cell(times: Sequence[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):.0f} / {p99:.0f}"


def no_wait() -> None:
    raise RuntimeError("the bench's pool waited for a slot: a slot was not given back")


def open_pool(conn: Connection, tensor: torch.Tensor) -> CudaSlotPool[Any]:
    """A pool with slots of ``tensor``'s size (at least 1 MiB), opened by the consumer."""
    nbytes = max(tensor.numel() * tensor.element_size(), 1 << 20)
    pool: CudaSlotPool[Any] = CudaSlotPool(TorchCuda(), 0, POOL_SLOTS, nbytes, no_wait)
    conn.send(("pool", pool.share()))
    pool.open_returns(answer(conn))
    return pool


def pool_round_trip(conn: Connection, pool: CudaSlotPool[Any], tensor: torch.Tensor | None) -> None:
    """One item through the pool: leased (``tensor`` None) or copied in; the slot comes back."""
    if tensor is None:
        leased = pool.lease((1,), torch.uint8)
        assert leased is not None
        ref = pool.send(leased)
        del leased
    else:
        ref = pool.send(tensor)
    conn.send(("slot", ref))
    pool.release(answer(conn))


def check_pool(conn: Connection, name: str, tensor: torch.Tensor) -> list[str]:
    """Bit-exact and in-place through a lease and through the copy; the counters' copies."""
    failures = []
    pool = open_pool(conn, tensor)
    digest, total = checksum(tensor)
    leased = pool.lease(tuple(tensor.shape), tensor.dtype)
    assert leased is not None
    slot_base = {s.data_ptr() for s in pool._storages}
    if leased.data_ptr() not in slot_base:
        failures.append(f"{name}: the lease is not in a slot of the pool (data_ptr)")
    leased.copy_(tensor)  # the stage producing its output into the slot
    for how, payload, copies in (("lease", leased, 0), ("copy", tensor, 1)):
        before = pool.copies
        ref = pool.send(payload)
        assert ref is not None
        conn.send(("slot-check", ref))
        slot, got_digest, got_total, in_place = answer(conn)
        pool.release(slot)
        if (got_digest, got_total) != (digest, total):
            failures.append(f"{name}, pool {how}: the consumer read other bytes")
        if not in_place:
            failures.append(f"{name}, pool {how}: the consumer's tensor is not in its slot")
        if pool.copies - before != copies:
            failures.append(f"{name}, pool {how}: {pool.copies - before} copies, not {copies}")
    pool.close()
    return failures


def memory_growth(conn: Connection, items: int) -> tuple[list[str], list[str]]:
    """``items`` leased 4 KB items through one pool: does either side's memory grow?"""
    pool = open_pool(conn, torch.empty(1024, dtype=torch.float32, device="cuda"))
    for _ in range(WARMUP):
        pool_round_trip(conn, pool, None)
    gc.collect()
    torch.cuda.synchronize()
    conn.send(("memory",))
    consumer_before = answer(conn)
    producer_before = torch.cuda.memory_allocated()
    count_before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    copies_before = pool.copies
    for _ in range(items):
        pool_round_trip(conn, pool, None)
    gc.collect()
    torch.cuda.synchronize()
    conn.send(("memory",))
    consumer_growth = answer(conn) - consumer_before
    producer_growth = torch.cuda.memory_allocated() - producer_before
    allocations = torch.cuda.memory_stats().get("allocation.all.allocated", 0) - count_before
    copies = pool.copies - copies_before
    lines = [
        f"{items:,} leased items through one pool: producer memory_allocated "
        f"{producer_growth:+,} bytes, consumer {consumer_growth:+,} bytes, producer allocations "
        f"(memory_stats allocation.all.allocated) {allocations:+,}, copies {copies}."
    ]
    failures = []
    if producer_growth or consumer_growth:
        failures.append(
            f"memory grew over {items:,} pool items (producer {producer_growth:+,}, consumer "
            f"{consumer_growth:+,} bytes)"
        )
    if copies:
        failures.append(f"{copies} copies over {items:,} leased pool items (0 expected)")
    pool.close()
    conn.send(("unpool",))
    answer(conn)
    return lines, failures


Parts = tuple[float, float, float, float, float, float, float]


def latency_row(
    conn: Connection,
    queue: Any,
    exporter: CudaExporter[Any, Any],
    tensor: torch.Tensor,
    rounds: int,
) -> tuple[list[str], list[Parts], list[list[float]]]:
    """The row's cells, the parts of each bridge round trip with a new tensor, and the times."""
    parts: list[Parts] = []

    def bridge(payload: torch.Tensor) -> None:
        start = time.perf_counter_ns()
        ref = exporter.export(payload)
        exported = time.perf_counter_ns()
        conn.send(("open", ref))
        ref_id, event_us, memory_us, open_us, done_us = answer(conn)
        answered = time.perf_counter_ns()
        exporter.release(ref_id)
        end = time.perf_counter_ns()
        export_us, release_us = (exported - start) / 1e3, (end - answered) / 1e3
        rest_us = (end - start) / 1e3 - export_us - open_us - done_us - release_us
        other_us = open_us - event_us - memory_us
        parts.append((export_us, event_us, memory_us, other_us, done_us, release_us, rest_us))

    def through_queue() -> None:
        payload = torch.empty_like(tensor)
        queue.put(payload)
        answer(conn)

    def clone() -> None:
        tensor.clone()
        torch.cuda.current_stream().synchronize()

    echo = ("echo", exporter.export(tensor))

    def pipe_only() -> None:
        conn.send(echo)
        answer(conn)

    columns = [time_rounds(lambda: bridge(torch.empty_like(tensor)), rounds)]
    new_tensor_parts = parts[-rounds:]
    columns.append(time_rounds(lambda: bridge(tensor), rounds))
    conn.send(("queue", WARMUP + rounds))
    columns.append(time_rounds(through_queue, rounds))
    columns.append(time_rounds(pipe_only, rounds))
    conn.send(("discard", echo[1]))
    exporter.release(answer(conn))
    columns.append(time_rounds(clone, rounds))
    pool = open_pool(conn, tensor)
    columns.append(time_rounds(lambda: pool_round_trip(conn, pool, None), rounds))
    columns.append(time_rounds(lambda: pool_round_trip(conn, pool, tensor), rounds))
    pool.close()
    return [cell(times) for times in columns], new_tensor_parts, columns


def run(conn: Connection, queue: Any, rounds: int, items: int) -> tuple[list[str], list[str]]:
    """All checks and the latency tables; returns (lines to print, failures)."""
    exporter = CudaExporter(TorchCuda())
    failures: list[str] = []
    tensors = [(name, random_tensor(shape, dtype)) for name, shape, dtype in PAYLOADS]
    frame = tensors[1][1]
    checked = [*tensors, ("crop [100:700, 200:1400] of the frame", frame[100:700, 200:1400])]
    for name, tensor in checked:
        failures += check_round_trip(conn, exporter, name, tensor)
        failures += check_pool(conn, name, tensor)
    if not filled_late(conn, exporter, "check"):
        failures.append("stream order: the consumer read before the producer's fill finished")
    control = "stale bytes seen" if not filled_late(conn, exporter, "unordered") else "not seen"
    lines = [
        "| payload | bridge, new tensor | bridge, same tensor | torch mp.Queue | Pipe only "
        "| clone + sync | pool, leased | pool, D2D copy | pool leased / Pipe | pool copy / Pipe |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    breakdown = [
        "| payload | export | open: event | open: memory | open: rest | done + free | release "
        "| the rest: two Pipe hops |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, tensor in tensors:
        cells, parts, times = latency_row(conn, queue, exporter, tensor, rounds)
        pipe, leased, copied = (statistics.median(times[k]) for k in (3, 5, 6))
        ratios = [f"{leased / pipe:.2f}x", f"{copied / pipe:.2f}x"]
        lines.append(f"| {name} | " + " | ".join(cells + ratios) + " |")
        if leased > POOL_LIMIT * pipe:
            failures.append(
                f"{name}: the leased pool round trip is {leased / pipe:.2f}x the Pipe-only one "
                f"(at most {POOL_LIMIT}x)"
            )
        medians = [statistics.median(column) for column in zip(*parts, strict=True)]
        breakdown.append(f"| {name} | " + " | ".join(f"{m:.0f}" for m in medians) + " |")
    lines += [
        "",
        f"Round trips in µs, median / p99 of {rounds} after {WARMUP} warm-ups. Order control "
        f"(consumer without the wait): {control}.",
        "",
        "Where a bridge round trip with a new tensor goes (medians, µs; open and done + free are "
        "timed in the consumer):",
        "",
        *breakdown,
    ]
    growth_lines, growth_failures = memory_growth(conn, items)
    lines += ["", *growth_lines]
    failures += growth_failures
    if exporter.pending():
        failures.append(f"the exporter still holds {exporter.pending()} refs at the end")
    return lines, failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=200, help="timed round trips per cell")
    parser.add_argument(
        "--items", type=int, default=10_000, help="leased items for the memory-growth check"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA: skipped")
        return 0
    torch.cuda.init()  # type: ignore[no-untyped-call]  # torch leaves it untyped
    baseline = torch.cuda.memory_allocated()
    context = torch_mp.get_context("spawn")
    conn, child = context.Pipe()
    queue = context.Queue()
    process = context.Process(target=consume, args=(child, queue), daemon=True)
    process.start()
    try:
        lines, failures = run(conn, queue, args.rounds, args.items)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        leaked = torch.cuda.memory_allocated() - baseline
        if leaked:
            failures.append(
                f"{leaked} bytes stay allocated after every tensor was freed "
                "(blocks held by torch's IPC count: a ref neither opened nor discarded?)"
            )
    finally:
        if process.is_alive():
            conn.send(("stop",))
        process.join(30)
        if process.is_alive():
            process.kill()
    print(
        f"{torch.cuda.get_device_name()}, driver {driver_version()}, torch {torch.__version__} "
        f"(CUDA {torch.version.cuda})\n"
    )
    print("\n".join(lines))
    if process.exitcode:
        failures.append(f"the consumer exited with {process.exitcode}")
    if failures:
        print("\nFAILED:\n- " + "\n- ".join(failures))
        return 1
    print(
        "\nAll checks passed: bit-exact, no copy, stream order, every ref released, "
        "no memory left held; the pool: bit-exact, in place, 0 copies leased and 1 copied, "
        f"within {POOL_LIMIT}x of the Pipe, no memory growth."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
