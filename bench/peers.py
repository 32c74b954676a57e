"""rxstream side by side with the peers a user would otherwise pick, in one run, as ratios.

Every figure is a ratio to the peer's, measured in the same run, repetition by repetition
(see ../shared/PERFORMANCE.md: absolute times on the shared 2-core machines drift 2-3x from
one hour to the next, ratios much less). Each peer is optional: one that is missing is
skipped, saying why.

In one process, the chain of bench/hop.py (a source thread and 4 pass-through stage threads):

- rxstream: ``ctx.source | ctx.pipe(noop) x4``, run threaded (bench/hop.py's ``RxsChain``,
  its latency and throughput measures).
- GStreamer: ``appsrc ! (queue ! identity) x4 ! appsink``, C elements, a thread per queue,
  run by Debian's ``/usr/bin/python3`` (``python3-gst-1.0``) in a child process that
  bench/_gst_chain.py describes, driven command by command from here.

Measures: hop latency with one item in flight (round trip / 6 hops, median), and throughput
with a backlog (``--items`` items, queues of capacity 2 and 256).

Across processes (this process the producer, one consumer process; by default the producer
pinned to CPU 0 and every consumer to CPU 1, as bench/ipc.py does; ``--placement os`` leaves
it to the scheduler). Every consumer touches the item (first and last element) and answers
one small reply the same way the item came, so every row is a round trip through the
transport under test, both ways:

- rxstream ring: ``ShmRing.put`` / ``get`` (4 slots of 8 MiB, a rank boundary's default
  ``RingSpec``), read in place; the reply through a second ring.
- rxstream boundary: the same rings carrying what a rank boundary carries (a
  ``PipelineItem`` with three stamps, a ``Boundary``'s sender and receiver).
- rxstream ring, no spin (1 KB only, ``spin_us=0``): what the consumer's bounded spin before
  it sleeps buys (rxstream/ipc/_wake.py).
- ``multiprocessing.Pipe`` ``send_bytes`` / ``recv_bytes`` round trip (1 KB only): the floor.
- Ray compiled graph (``ray.dag`` ``InputNode`` → an actor's method,
  ``experimental_compile()``), the actor pinned like the consumers. Its channel readers spin
  while idle, so the graph is compiled before its rows and torn down after them in every
  repetition: it does not steal the CPU from the other rows.

Payloads: a 1080x1920x3 uint8 frame (6.2 MB), latency (one in flight) and throughput (3 in
flight, the window Ray's compiled graph takes by default); and 1 KB of bytes, latency, back to
back and sparse (2 ms between a reply and the next item: rxstream's consumers have slept by
then, the spin cannot help; Ray's readers still spin, burning their CPU while idle). Last, the
CPU the ring's consumer process and Ray's actor use while nobody sends them anything (0.5 s,
Ray's graph compiled, from ``/proc/<pid>/stat``).

Run ``python bench/peers.py`` (a few minutes) or ``python bench/peers.py --quick`` (a smoke
run whose ratios are indicative only). Ray is in the ``bench`` extra
(``pip install -e .[bench]``), GStreamer is Debian's ``python3-gst-1.0``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

# `python bench/peers.py` from a checkout where the package is not installed: the repo root
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _report import revision, spread, verdict
from hop import RxsChain, latency, throughput

import rxstream
from rxstream._kernel._stats import StageCounters
from rxstream.ipc import RingHandle, ShmRing
from rxstream.ipc._wake import DEFAULT_SPIN_US
from rxstream.item import PipelineItem, PipelineMetadata, _stamped
from rxstream.ranks._boundary import Boundary

SPAWN = multiprocessing.get_context("spawn")
GST_PYTHON = "/usr/bin/python3"
GST_CHAIN = Path(__file__).resolve().parent / "_gst_chain.py"
IDLE_S = 0.5
"""How long the idle rows watch the consumers' CPU use, nothing sent (Ray's graph open)."""
GAP_S = 0.002
"""The sparse 1 KB rows' pause between a reply and the next item: far beyond any spin."""
WINDOW = 3
"""Frames in flight in the throughput rows (Ray's compiled graph takes this many at once)."""
FRAME, SMALL = "6.2 MB frame", "1 KB"
RING, BOUNDARY, NO_SPIN, PIPE, RAY = "ring", "boundary", "ring, no spin", "Pipe", "Ray"
_CONSUMER_CPU = "RXSTREAM_BENCH_CONSUMER_CPU"
_perf = time.perf_counter

Put = Callable[[Any], Any]
"""Hand a payload to the consumer; what ``Ack`` takes to wait for its reply."""
Ack = Callable[[Any], object]
"""Wait for the reply to what a ``Put`` returned."""


def make_payload(name: str) -> Any:
    if name == FRAME:
        return np.arange(1080 * 1920 * 3, dtype=np.uint8).reshape(1080, 1920, 3)
    return bytes(range(256)) * 4


def touch(item: Any) -> int:
    """Read the first and last element of ``item`` (array or bytes)."""
    if isinstance(item, bytes):
        return item[0] + item[-1]
    flat = item.reshape(-1)
    return int(flat[0]) + int(flat[-1])


def pin(cpu: int | None) -> None:
    """Run every thread of this process on ``cpu`` only (``None``: on any CPU; a CPU the
    machine lacks: left as it is)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    count = os.cpu_count() or 1
    if cpu is not None and cpu >= count:
        return
    cpus = set(range(count)) if cpu is None else {cpu}
    for task in os.listdir("/proc/self/task"):  # threads started later inherit it
        try:
            os.sched_setaffinity(int(task), cpus)
        except OSError:  # a thread that ended meanwhile
            continue


def consumer_cpu() -> int | None:
    value = os.environ.get(_CONSUMER_CPU, "")
    return int(value) if value else None


# --- in one process: GStreamer in its own interpreter ----------------------------------------


class GstChain:
    """The GStreamer leg: a ``/usr/bin/python3`` child that measures on command."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [GST_PYTHON, str(GST_CHAIN)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            self.version = str(self._answer()["ready"])
        except BaseException:
            self.process.kill()
            self.process.communicate()
            raise

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            assert self.process.stderr is not None
            raise RuntimeError(f"the GStreamer leg ended: {self.process.stderr.read()[-2000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, command: str) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        return float(answer.get("p50", answer.get("items_s", "nan")))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        self.process.wait(30)


def gst_or_why() -> tuple[GstChain | None, str]:
    """The GStreamer leg, or why there is none."""
    if shutil.which(GST_PYTHON) is None:
        return None, f"no {GST_PYTHON} (Debian's python3-gst-1.0 is built for it)"
    try:
        return GstChain(), ""
    except (OSError, RuntimeError, ValueError) as exc:
        return None, f"GStreamer leg failed to start ({str(exc).strip().splitlines()[-1]})"


# --- across processes: rxstream's consumers (spawned) ----------------------------------------


HOP = "b>c"


def upstream_item() -> PipelineItem:
    """An item as it reaches a boundary: metadata and the stamps of three stages before it."""
    t = time.monotonic()
    head = PipelineItem(None, PipelineMetadata(pts=7, input_seq=3, input_at_ms=1))
    for stage in ("src", "a", "b"):
        head = _stamped(head, None, (f"{stage}.in", t, f"{stage}.out", t))
    return head


def ring_echo(data: RingHandle, back: RingHandle, boundary: bool) -> None:
    """Get each item, touch it, reply ``b"k"`` through ``back``; ``None`` ends."""
    gc.disable()
    pin(consumer_cpu())
    ring, reply = ShmRing.attach(data), ShmRing.attach(back)
    receive = Boundary(HOP, ring).receiver() if boundary else None
    try:
        reply.put(b"k")  # ready
        while (got := ring.get()) is not None:
            touch(got if receive is None else receive(got).payload)
            del got
            reply.put(b"k")
    finally:
        ring.close()
        reply.close()


def pipe_echo(data: Connection, back: Connection) -> None:
    pin(consumer_cpu())
    back.send_bytes(b"k")
    while (got := data.recv_bytes()) != b"":
        touch(got)
        back.send_bytes(b"k")


class RingPeer:
    """A consumer process behind a ring (or a boundary), replying through a second ring."""

    def __init__(self, boundary: bool, spin_us: float = DEFAULT_SPIN_US) -> None:
        self.ring = ShmRing.create(slots=4, slot_bytes=8 << 20, spin_us=spin_us)
        self.back = ShmRing.create(slots=4, slot_bytes=4096, spin_us=spin_us)
        self.process = SPAWN.Process(
            target=ring_echo,
            args=(self.ring.handle(), self.back.handle(), boundary),
            daemon=True,
        )
        self.put: Put = self.ring.put
        if boundary:
            send = Boundary(HOP, self.ring).sender(StageCounters("b", "pipe"))
            head = upstream_item()

            def put_item(payload: Any) -> None:
                send(_stamped(head, payload, ()))

            self.put = put_item
        get = self.back.get
        self.ack: Ack = lambda _sent: get()

    def start(self) -> None:
        self.process.start()
        self.back.get()

    def close(self) -> None:
        self.ring.put(None)
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        for ring in (self.ring, self.back):
            ring.close()
            ring.unlink()


class PipePeer:
    """A consumer process behind a bare ``multiprocessing.Pipe``, replying through another."""

    def __init__(self) -> None:
        theirs, self.data = SPAWN.Pipe(duplex=False)
        self.acks, back = SPAWN.Pipe(duplex=False)
        self.process = SPAWN.Process(target=pipe_echo, args=(theirs, back), daemon=True)
        self.put: Put = self.data.send_bytes
        recv = self.acks.recv_bytes
        self.ack: Ack = lambda _sent: recv()

    def start(self) -> None:
        self.process.start()
        self.acks.recv_bytes()

    def close(self) -> None:
        self.data.send_bytes(b"")
        self.process.join(30)
        self.data.close()
        self.acks.close()


# --- across processes: Ray ------------------------------------------------------------------


class Echo:
    """The Ray actor: pinned like the consumers, it touches each item and answers an int."""

    def __init__(self, cpu: int | None) -> None:
        pin(cpu)

    def touch(self, item: Any) -> int:
        return touch(item)

    def pid(self) -> int:
        return os.getpid()


class RayPeer:
    """An actor pinned like the consumers; a compiled graph to it, compiled on ``open``."""

    def __init__(self, ray: Any, cpu: int | None) -> None:
        from ray.dag import InputNode

        self.ray = ray
        self.actor = ray.remote(Echo).remote(cpu)
        self._input = InputNode
        self.graph: Any = None
        self.pid: int = ray.get(self.actor.pid.remote())  # asked before a graph holds it

    def open(self) -> None:
        """Compile a graph (a DAG compiles once: a new one each time)."""
        with self._input() as given:
            dag = self.actor.touch.bind(given)
        self.graph = dag.experimental_compile(_buffer_size_bytes=8 << 20)
        self.ack(self.graph.execute(b"k"))  # the first call sets the channels up

    def put(self, payload: Any) -> Any:
        return self.graph.execute(payload)

    def ack(self, ref: Any) -> object:
        return self.ray.get(ref)

    def close(self) -> None:
        if self.graph is not None:
            self.graph.teardown()
            self.graph = None


def ray_or_why() -> tuple[Any, str]:
    """The ``ray`` module, started, or why not."""
    try:
        import ray
    except ImportError:
        return None, "ray is not installed (pip install -e .[bench])"
    try:
        ray.init(
            num_cpus=os.cpu_count() or 1,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except Exception as exc:  # a peer that cannot start is skipped, saying why
        return None, f"ray.init failed ({type(exc).__name__}: {exc})"
    return ray, ""


# --- measuring ------------------------------------------------------------------------------


def round_trips(put: Put, ack: Ack, payload: Any, trips: int, gap_s: float = 0.0) -> float:
    """Median seconds from a put to its reply, one in flight (after a tenth as warm-up); with
    ``gap_s``, that long between a reply and the next put (a sparse stream)."""
    warm = max(3, trips // 10)
    samples = []
    for index in range(warm + trips):
        started = _perf()
        ack(put(payload))
        if index >= warm:
            samples.append(_perf() - started)
        if gap_s:
            time.sleep(gap_s)
    return statistics.median(samples)


def windowed(put: Put, ack: Ack, payload: Any, items: int) -> float:
    """Items per second with ``WINDOW`` in flight: a put, and a reply taken once it is full."""
    waiting: list[Any] = []
    started = _perf()
    for _ in range(items):
        waiting.append(put(payload))
        if len(waiting) >= WINDOW:
            ack(waiting.pop(0))
    for sent in waiting:
        ack(sent)
    return items / (_perf() - started)


def cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (user and system, every thread)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pids: Sequence[int], seconds: float) -> list[float]:
    """The share of a core each process used over ``seconds`` in which nobody sent it a thing."""
    before = [cpu_s(pid) for pid in pids]
    time.sleep(seconds)
    return [(cpu_s(pid) - was) / seconds for pid, was in zip(pids, before, strict=True)]


def memcpy_latency(payload: np.ndarray[Any, Any], trips: int) -> float:
    """Median seconds of one ``numpy.copyto`` of ``payload`` into a warm buffer."""
    target = np.empty_like(payload)
    np.copyto(target, payload)
    samples = []
    for _ in range(trips):
        started = _perf()
        np.copyto(target, payload)
        samples.append(_perf() - started)
    return statistics.median(samples)


Plan = dict[str, int]
QUICK: Plan = {"reps": 2, "hop_trips": 100, "items": 2_000, "frame_trips": 20,
               "frame_items": 30, "small_trips": 300}  # fmt: skip
FULL: Plan = {"reps": 5, "hop_trips": 1_000, "items": 20_000, "frame_trips": 200,
              "frame_items": 300, "small_trips": 2_000}  # fmt: skip
Got = dict[tuple[str, str], list[float]]


def measure(plan: Plan, cpus: tuple[int, int] | None, gst: GstChain | None,
            ray: RayPeer | None) -> Got:  # fmt: skip
    """Every variant once per repetition, interleaved (repetition 0 warms up, unrecorded)."""
    got: Got = {}
    frame, small = make_payload(FRAME), make_payload(SMALL)
    sparse = max(20, plan["small_trips"] // 10)
    peers: dict[str, RingPeer | PipePeer] = {
        RING: RingPeer(boundary=False),
        BOUNDARY: RingPeer(boundary=True),
        NO_SPIN: RingPeer(boundary=False, spin_us=0),
        PIPE: PipePeer(),
    }
    os.environ[_CONSUMER_CPU] = "" if cpus is None else str(cpus[1])
    try:
        for peer in peers.values():
            peer.start()
        for rep in range(plan["reps"] + 1):

            def add(key: tuple[str, str], value: float, rep: int = rep) -> None:
                if rep:
                    got.setdefault(key, []).append(value)

            pin(None)  # in one process: every thread anywhere, as GStreamer's child
            gc.collect()
            add(("hop", "rxstream"), statistics.median(latency(RxsChain, plan["hop_trips"])))
            if gst is not None:
                add(("hop", "GStreamer"), gst.ask(f"latency {plan['hop_trips']}"))
            for capacity in (2, 256):
                gc.collect()
                add((f"tput {capacity}", "rxstream"), throughput(RxsChain, plan["items"], capacity))
                if gst is not None:
                    add((f"tput {capacity}", "GStreamer"),
                        gst.ask(f"throughput {plan['items']} {capacity}"))  # fmt: skip
            pin(None if cpus is None else cpus[0])  # across: this process on one CPU
            gc.collect()
            gc.disable()
            try:
                add(("frame lat", "memcpy"), memcpy_latency(frame, plan["frame_trips"]))
                for name, peer in peers.items():
                    if name in (RING, BOUNDARY):
                        add(
                            ("frame lat", name),
                            round_trips(peer.put, peer.ack, frame, plan["frame_trips"]),
                        )
                        add(
                            ("frame tput", name),
                            windowed(peer.put, peer.ack, frame, plan["frame_items"]),
                        )
                    add(
                        ("small lat", name),
                        round_trips(peer.put, peer.ack, small, plan["small_trips"]),
                    )
                    if name in (RING, PIPE):
                        add(
                            ("sparse lat", name),
                            round_trips(peer.put, peer.ack, small, sparse, GAP_S),
                        )
                if ray is not None:
                    ray.open()
                    try:
                        add(
                            ("frame lat", RAY),
                            round_trips(ray.put, ray.ack, frame, plan["frame_trips"]),
                        )
                        add(
                            ("frame tput", RAY),
                            windowed(ray.put, ray.ack, frame, plan["frame_items"]),
                        )
                        add(
                            ("small lat", RAY),
                            round_trips(ray.put, ray.ack, small, plan["small_trips"]),
                        )
                        add(
                            ("sparse lat", RAY), round_trips(ray.put, ray.ack, small, sparse, GAP_S)
                        )
                        ring_pid = peers[RING].process.pid
                        assert ring_pid is not None
                        idle = idle_cpu([ring_pid, ray.pid], IDLE_S)
                        add(("idle cpu", RING), idle[0])
                        add(("idle cpu", RAY), idle[1])
                    finally:
                        ray.close()
            finally:
                gc.enable()
    finally:
        for peer in peers.values():
            peer.close()
    return got


# --- the table ----------------------------------------------------------------------------


def rows(got: Got, skipped: dict[str, str]) -> list[str]:
    """The markdown table: medians [min-max], the ratio of each repetition's pair, verdicts."""
    lines = [
        "| measure | rxstream | median [min-max] | against | median [min-max] "
        "| ratio median [min-max] | target | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    us, k = 1e6, 1e-3

    def row(measure: str, key: str, variant: str, against: str, scale: float, target: str,
            check: Callable[[float], bool] | None) -> None:  # fmt: skip
        mine, theirs = got.get((key, variant)), got.get((key, against))
        if mine is None or theirs is None:
            return
        mine, theirs = [v * scale for v in mine], [v * scale for v in theirs]
        ratios, result = verdict(mine, theirs, check)
        lines.append(
            f"| {measure} | {variant} | {spread(mine)} | {against} | {spread(theirs)} "
            f"| {spread(ratios, 2, 'x')} | {target} | {result} |"
        )

    row(
        "in-process hop latency, 1 in flight (µs/hop)",
        "hop",
        "rxstream",
        "GStreamer",
        us,
        "—",
        None,
    )
    for capacity in (2, 256):
        row(
            f"in-process throughput, backlog, capacity {capacity} (k items/s)",
            f"tput {capacity}",
            "rxstream",
            "GStreamer",
            k,
            "≥ 1.0x",
            lambda r: r >= 1.0,
        )
    for name in (RING, BOUNDARY):
        row("6.2 MB frame across processes, latency (µs)", "frame lat", name, RAY, us, "—", None)
        row(
            "6.2 MB frame across processes, throughput (frames/s)",
            "frame tput",
            name,
            RAY,
            1.0,
            "≥ 5x",
            lambda r: r >= 5.0,
        )
    for name in (RING, BOUNDARY):
        row("6.2 MB frame, latency / one memcpy (µs)", "frame lat", name, "memcpy", us, "—", None)
    for name in (RING, BOUNDARY):
        row(
            "1 KB across processes, latency (µs)",
            "small lat",
            name,
            RAY,
            us,
            "≤ 1.0x",
            lambda r: r <= 1.0,
        )
    for name in (RING, BOUNDARY):
        row(
            "1 KB across processes, latency (µs)",
            "small lat",
            name,
            PIPE,
            us,
            "≤ 1.2x",
            lambda r: r <= 1.2,
        )
    row("1 KB across processes, latency (µs)", "small lat", NO_SPIN, PIPE, us, "—", None)
    row("1 KB across processes, latency (µs)", "small lat", RAY, PIPE, us, "—", None)
    sparse = f"1 KB across processes, {GAP_S * 1e3:g} ms apart, latency (µs)"
    row(sparse, "sparse lat", RING, RAY, us, "—", None)
    row(sparse, "sparse lat", RING, PIPE, us, "—", None)
    row("idle consumer, nothing sent (% of a core)", "idle cpu", RING, RAY, 100.0, "—", None)
    lines.append("")
    lines += [f"- {peer} skipped: {why}" for peer, why in skipped.items()]
    return lines  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="rxstream vs GStreamer and Ray, as ratios")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every variant")
    parser.add_argument(
        "--placement",
        choices=("cross", "os"),
        default="cross",
        help="cross: across processes, this one on CPU 0 and the consumers on CPU 1 "
        "(default); os: the scheduler places them",
    )
    parser.add_argument("--no-ray", action="store_true", help="leave Ray out")
    parser.add_argument("--no-gstreamer", action="store_true", help="leave GStreamer out")
    args = parser.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    if args.reps:
        plan["reps"] = args.reps
    skipped: dict[str, str] = {}
    gst, why = (None, "--no-gstreamer") if args.no_gstreamer else gst_or_why()
    if gst is None:
        skipped["GStreamer"] = why
    ray_module, why = (None, "--no-ray") if args.no_ray else ray_or_why()
    cpus = (0, 1) if args.placement == "cross" and (os.cpu_count() or 1) >= 2 else None
    ray = None
    if ray_module is None:
        skipped["Ray"] = why
    else:
        ray = RayPeer(ray_module, None if cpus is None else cpus[1])
    began = _perf()
    try:
        got = measure(plan, cpus, gst, ray)
    finally:
        if gst is not None:
            gst.close()
        if ray_module is not None:
            ray_module.shutdown()
    took = _perf() - began
    command = " ".join(["python bench/peers.py", *(sys.argv[1:] if argv is None else argv)])
    versions = [f"rxstream {rxstream.__version__} at {revision()}"]
    if gst is not None:
        versions.append(gst.version)
    if ray_module is not None:
        versions.append(f"Ray {ray_module.__version__}")
    print(
        f"# {command}: {plan['reps']} repetitions (after one warm-up), interleaved; "
        f"in-process {plan['hop_trips']} round trips, {plan['items']} items; frames "
        f"{plan['frame_trips']} round trips, {plan['frame_items']} items ({WINDOW} in "
        f"flight); 1 KB {plan['small_trips']} round trips; took {took:.0f} s"
    )
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
        f"{', '.join(versions)}, {os.cpu_count()} CPUs; placement {args.placement}"
    )
    print()
    print("\n".join(rows(got, skipped)))


if __name__ == "__main__":
    main()
