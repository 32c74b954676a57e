"""rxstream side by side with the peers a user would otherwise pick, in one run, as ratios.

Every figure is a ratio to the peer's, measured in the same run, repetition by repetition
(see docs/performance.md, "How to measure": absolute times on the shared 2-core machines
drift 2-3x from one hour to the next, ratios much less). Each peer is optional: one that is
missing is
skipped, saying why.

In one process, the chain of bench/hop.py (a source thread and 4 pass-through stage threads):

- rxstream: ``ctx.source | ctx.pipe(noop) x4``, run threaded (bench/hop.py's ``RxsChain``,
  its latency and throughput measures).
- rxstream, fused (the opt-in shape): the same chain with ``p2``..``p4`` built with
  ``fuse=True``, on ``p1``'s thread (bench/hop.py's ``FusedChain``); its rows are labelled
  ``rxstream fused (opt-in)``: the GStreamer chain keeps a queue (a thread) per element.
- GStreamer: ``appsrc ! (queue ! identity) x4 ! appsink``, C elements, a thread per queue,
  run by Debian's ``/usr/bin/python3`` (``python3-gst-1.0``) in a child process that
  bench/_gst_chain.py describes, driven command by command from here.
- the floors, no engine (throughput only, information; bench/_floors.py, as in
  bench/hop.py): the 5-thread floor (a source thread and 4 stage threads, each hand-off two C
  ``queue.SimpleQueue``s, items and free-slot tokens) and the 2-thread floor (a source thread
  and one thread making the 4 calls back to back: the fused shape's floor), each without
  stamps, with the hand-written chain's, and carrying rxstream's items (each stage's per-item
  work the engine's, inline: the floor of any engine carrying these items on that shape).
  Under the table, one line a capacity says, from
  the run's figures, whether each floor reaches the issue's ≥ 1.0x GStreamer (a floor that
  misses it says the target is at or past what its hand-offs alone allow here, not that no
  chain could read higher in another slot of a loaded run).

Measures: hop latency with one item in flight (round trip / 6 hops, median), and throughput
with a backlog (``--items`` items, queues of capacity 2 and 256).

Where the in-process rows' threads run (issue 18; bench/hop.py's ``--placement``): by default
where the OS puts them, a draw on 2 vCPUs. ``--placement one`` runs them with every thread of
both sides on one CPU: this process's (``os.sched_setaffinity`` on each of its threads, the
masks restored after) and GStreamer's child's, pinned the same way before it builds its
pipeline, so its C threads (started from its pinned threads) inherit the mask; its rows are
labelled ``[one CPU]``, info. ``--placement both``: the ``[OS]`` and ``[one CPU]`` sets
interleaved, the one-CPU set in every other recorded repetition (no warm-up of its own), the
verdicts the ``[OS]`` rows'. With ``one`` and ``both`` the rows across processes run as with
``cross``: they are two processes by design.

Across processes (this process the producer, one consumer process; by default the producer
pinned to CPU 0 and every consumer to CPU 1, as bench/ipc.py does; ``--placement os`` leaves
it to the scheduler). Every consumer touches the item (first and last element) and answers
one small reply the same way the item came, so every row is a round trip through the
transport under test, both ways:

- rxstream ring: ``ShmRing.put`` / ``get`` (4 slots of 8 MiB, a rank boundary's default
  ``RingSpec``), read in place; the reply through a second ring.
- rxstream boundary: the same rings carrying what a rank boundary carries (a
  ``PipelineItem`` with three stamps, a ``Boundary``'s sender and receiver).
- rxstream ring, zero copy (frames only): per frame the producer leases a slot of the frame's
  shape and dtype (``ShmRing.lease``), renders the frame into it and puts it: only the item's
  header is written, the consumer reads the very slot the producer wrote (bench/ipc.py's
  ``leasing``, with this bench's render).
- rxstream boundary, zero copy (frames only): the same, the leased frame the payload of the
  ``PipelineItem`` the boundary's sender sends (bench/ipc.py's ``leased_sender``): what a
  stage that returns ``ctx.lease``'s array makes its boundary do.
- rxstream ring, no spin (1 KB only, ``spin_us=0``): what the consumer's bounded spin before
  it sleeps buys (rxstream/ipc/_wake.py).
- ``multiprocessing.Pipe`` ``send_bytes`` / ``recv_bytes`` round trip (1 KB only): the floor.
- Ray compiled graph (``ray.dag`` ``InputNode`` → an actor's method,
  ``experimental_compile()``), the actor pinned like the consumers. Its channel readers spin
  while idle, so the graph is compiled before its rows and torn down after them in every
  repetition: it does not steal the CPU from the other rows.
- Ray compiled graph, rendered (frames only): the same graph, the producer rendering each
  frame before ``execute`` takes it, as the zero-copy rows' producer does.

Rendering, the zero-copy rows against "Ray, rendered": the same work on both sides, per
frame, on the producer's thread, inside the clock (see ``RENDERS``). One run measures two
renders, interleaved in the same repetitions (``--render`` restricts it to one): ``stamp``,
the first and last element only (bench/ipc.py's render: the crossing alone, no frame made),
and ``copy``, one whole-frame ``numpy.copyto`` from a prepared 6.2 MB frame, every pixel
written as a renderer writes them (``fill``, a memset, on request). The zero-copy producer
renders into the leased shared-memory slot, which then crosses as it is; Ray's producer
renders into one of ``WINDOW + 1`` frames of its own (allocated and touched once before the
clock: a fresh allocation per frame would add page faults that are the allocator's, not
Ray's), which ``execute`` then serialises into its channel, as Ray does with any frame a stage
made. Beside them, "the render alone" (renders other than ``stamp``): the render into one warm
leased slot, no transport, timed like the frame rows; "Ray, rendered"'s frame time over the
render's own (its median) is the most any transport could reach with that render, printed
under the table.

The "≥ 5x Ray's frame rate" verdict is the ``stamp`` rows': it counts the crossing, as issue
18's table measured it (a frame that exists, moved) and as bench/ipc.py's zero-copy target
counts it. Making the frame is the producing stage's work, the same whatever carries it: with
a whole-frame render that cost is in both sides' frame time and bounds their ratio, so the
``copy`` rows are information, and say what a producer that writes every pixel sees. The copy
rows ("ring", "boundary" against "Ray": the prepared frame handed over as it is, each
transport copying it once into shared memory) are information too.

Payloads: a 1080x1920x3 uint8 frame (6.2 MB), latency (one in flight) and throughput (3 in
flight, the window Ray's compiled graph takes by default); and 1 KB of bytes, latency, back to
back and sparse (2 ms between a reply and the next item: rxstream's consumers have slept by
then, the spin cannot help; Ray's readers still spin, burning their CPU while idle). Last, the
CPU the ring's consumer process and Ray's actor use while nobody sends them anything (0.5 s,
Ray's graph compiled, from ``/proc/<pid>/stat``).

The far ends (consumer processes, the Ray actor) are in bench/_peer_ends.py.

Run ``python bench/peers.py`` (1.5-2 minutes) or ``python bench/peers.py --quick`` (a smoke
run whose ratios are indicative only). Ray is in the ``bench`` extra
(``pip install -e .[bench]``), GStreamer is Debian's ``python3-gst-1.0``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# `python bench/peers.py` from a checkout where the package is not installed: the repo root
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _floors import (
    FloorChain,
    FloorItemsChain,
    FloorStampedChain,
    FusedFloorChain,
    FusedFloorItemsChain,
    FusedFloorStampedChain,
    floor_line,
    items_line,
)
from _peer_ends import CONSUMER_CPU, Ack, PipePeer, Put, RayPeer, RingPeer, pin, ray_or_why
from _report import ONE_CPU, OS, PLACEMENT_LABELS, on_cpus, placements, revision, spread, verdict
from hop import FusedChain, RxsChain, latency, throughput
from ipc import leased_sender, leasing

import rxstream
from rxstream.ipc import ShmRing

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
FUSED = "rxstream fused (opt-in)"
"""The opt-in fused shape of the in-process chain (bench/hop.py's ``FusedChain``)."""
FLOOR_5, FLOOR_5_STAMPED = "floor, 5 threads (no engine)", "floor, 5 threads + stamps (no engine)"
FLOOR_2, FLOOR_2_STAMPED = "floor, 2 threads (no engine)", "floor, 2 threads + stamps (no engine)"
FLOOR_5_ITEMS = "floor, 5 threads + rxstream's items (no engine)"
FLOOR_2_ITEMS = "floor, 2 threads + rxstream's items (no engine)"
FLOORS = (
    (FLOOR_5, FloorChain),
    (FLOOR_5_STAMPED, FloorStampedChain),
    (FLOOR_5_ITEMS, FloorItemsChain),
    (FLOOR_2, FusedFloorChain),
    (FLOOR_2_STAMPED, FusedFloorStampedChain),
    (FLOOR_2_ITEMS, FusedFloorItemsChain),
)
"""The in-process floors, no engine (bench/hop.py): a thread a stage, and the fused shape's
(a source thread, one thread calling the 4 stages back to back), without and with stamps, and
carrying rxstream's items (each stage's per-item work the engine's, inline)."""
ZERO, BOUNDARY_ZERO, RAY_RENDERED = "ring, zero copy", "boundary, zero copy", "Ray, rendered"
FRAMES_ONLY = (ZERO, BOUNDARY_ZERO)
"""The peers that carry frames only (a lease is an array's), each once a render."""
RENDER_ALONE = "the render alone"
"""The render with no transport: into a warm leased slot, timed like the frame rows."""
VERDICT_RENDER = "stamp"
"""The render of the "≥ 5x Ray's frame rate" verdict: the crossing alone (the docstring)."""
_perf = time.perf_counter


def make_payload(name: str) -> Any:
    if name == FRAME:
        return np.arange(1080 * 1920 * 3, dtype=np.uint8).reshape(1080, 1920, 3)
    return bytes(range(256)) * 4


Render = Callable[[np.ndarray[Any, Any], np.ndarray[Any, Any]], None]
"""``render(frame, prepared)``: make a frame in ``frame`` (the same work on both sides)."""


def render_copy(frame: np.ndarray[Any, Any], prepared: np.ndarray[Any, Any]) -> None:
    """Every pixel of ``frame`` written from ``prepared`` (a slice assignment)."""
    np.copyto(frame, prepared)


def render_fill(frame: np.ndarray[Any, Any], _prepared: np.ndarray[Any, Any]) -> None:
    """Every pixel of ``frame`` set to one value (a memset)."""
    frame.fill(7)


def render_stamp(frame: np.ndarray[Any, Any], _prepared: np.ndarray[Any, Any]) -> None:
    """The first and last element of ``frame`` set (no frame made: the crossing alone)."""
    flat = frame.reshape(-1)
    flat[0] = flat[-1] = 7


RENDERS: dict[str, Render] = {"copy": render_copy, "fill": render_fill, "stamp": render_stamp}
"""``--render``: how the producer of the zero-copy rows and of "Ray, rendered" makes a frame."""


def rendered(name: str, render: str) -> str:
    """The name of ``name``'s rows with ``render`` (``ring, zero copy (stamp)``)."""
    return f"{name} ({render})"


def zero_copy_peer(boundary: bool, render: Render) -> RingPeer:
    """A ring (or boundary) peer whose producer renders each frame into a leased slot."""
    peer = RingPeer(boundary=boundary)
    peer.put = (leased_sender if boundary else leasing)(peer.ring, render)
    return peer


def rendering(put: Put, render: Render) -> Put:
    """``put`` of a frame the producer renders first into one of ``WINDOW + 1`` frames of its
    own, made and touched before the clock starts (Ray's side of the zero-copy rows)."""
    turn = itertools.cycle([make_payload(FRAME) for _ in range(WINDOW + 1)])

    def put_rendered(prepared: Any) -> Any:
        frame = next(turn)
        render(frame, prepared)
        return put(frame)

    return put_rendered


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


Add = Callable[[tuple[str, str], float], None]


def render_alone(add: Add, plan: Plan, ring: ShmRing, name: str, render: Render) -> None:
    """The render with no transport, timed as the frame rows are: ``render`` into one slot
    leased from ``ring`` (shared memory, as the zero-copy producer's), warmed first; the median
    seconds of one, and renders a second back to back."""
    prepared = make_payload(FRAME)
    slot = ring.lease(prepared.shape, prepared.dtype)
    if slot is None:
        raise RuntimeError("the frame does not fit the render ring's slot")
    render(slot, prepared)
    samples = []
    for _ in range(plan["frame_trips"]):
        started = _perf()
        render(slot, prepared)
        samples.append(_perf() - started)
    add(("frame lat", name), statistics.median(samples))
    started = _perf()
    for _ in range(plan["frame_items"]):
        render(slot, prepared)
    add(("frame tput", name), plan["frame_items"] / (_perf() - started))
    del slot  # the lease goes back with its last view


def in_process(add: Add, plan: Plan, gst: GstChain | None) -> None:
    """The in-process chain's rows: rxstream's, then GStreamer's, one after the other."""
    gc.collect()
    add(("hop", "rxstream"), statistics.median(latency(RxsChain, plan["hop_trips"])))
    if gst is not None:
        add(("hop", "GStreamer"), gst.ask(f"latency {plan['hop_trips']}"))
    gc.collect()
    add(("hop", FUSED), statistics.median(latency(FusedChain, plan["hop_trips"])))
    for capacity in (2, 256):
        gc.collect()
        add((f"tput {capacity}", "rxstream"), throughput(RxsChain, plan["items"], capacity))
        gc.collect()
        add((f"tput {capacity}", FUSED), throughput(FusedChain, plan["items"], capacity))
        if gst is not None:
            add(
                (f"tput {capacity}", "GStreamer"), gst.ask(f"throughput {plan['items']} {capacity}")
            )
        for name, chain in FLOORS:
            gc.collect()
            add((f"tput {capacity}", name), throughput(chain, plan["items"], capacity))


def across(add: Add, plan: Plan, name: str, put: Put, ack: Ack, frames: bool, sparse: bool,
           small: bool = True) -> None:  # fmt: skip
    """One transport's rows across processes: frames (latency, throughput), 1 KB, sparse 1 KB."""
    if frames:
        frame = make_payload(FRAME)
        add(("frame lat", name), round_trips(put, ack, frame, plan["frame_trips"]))
        add(("frame tput", name), windowed(put, ack, frame, plan["frame_items"]))
    if not small:
        return
    small_payload = make_payload(SMALL)
    add(("small lat", name), round_trips(put, ack, small_payload, plan["small_trips"]))
    if sparse:
        trips = max(20, plan["small_trips"] // 10)
        add(("sparse lat", name), round_trips(put, ack, small_payload, trips, GAP_S))


def in_process_placed(add: Add, plan: Plan, gst: GstChain | None, cpu: int | None) -> None:
    """:func:`in_process` with every thread of this process and of GStreamer's child process
    (its C threads too: they start from its pinned threads) on ``cpu`` (``None``: where the
    OS puts them), each mask restored after; the rows' keys prefixed ``one `` when pinned."""
    if cpu is None:
        in_process(add, plan, gst)
        return

    def add_one(key: tuple[str, str], value: float) -> None:
        add((f"{ONE_CPU} {key[0]}", key[1]), value)

    child = None if gst is None else gst.process.pid
    with on_cpus({cpu}), on_cpus(None if child is None else {cpu}, child):
        in_process(add_one, plan, gst)


def measure(plan: Plan, cpus: tuple[int, int] | None, gst: GstChain | None,
            ray: RayPeer | None, renders: dict[str, Render],
            sets: Sequence[str] = (OS,), one: int | None = None) -> Got:  # fmt: skip
    """Every variant once per repetition, interleaved (repetition 0 warms up, unrecorded);
    the zero-copy and Ray's rendered rows once per render in ``renders``.

    ``sets``: the placements of the in-process rows (``os``; ``one``, every thread of both
    sides on CPU ``one``; both: the ``one`` set in every other recorded repetition, first in
    every other of those, none in the warm-up). The rows across processes: as ``cpus`` says.
    """
    got: Got = {}
    both = len(sets) > 1
    peers: dict[str, RingPeer | PipePeer] = {
        RING: RingPeer(boundary=False),
        BOUNDARY: RingPeer(boundary=True),
    }
    for render_name, render in renders.items():
        for name in FRAMES_ONLY:
            peers[rendered(name, render_name)] = zero_copy_peer(name == BOUNDARY_ZERO, render)
    frames_only = {rendered(name, render) for name in FRAMES_ONLY for render in renders}
    peers[NO_SPIN] = RingPeer(boundary=False, spin_us=0)
    peers[PIPE] = PipePeer()
    render_ring = ShmRing.create(slots=2, slot_bytes=8 << 20)
    os.environ[CONSUMER_CPU] = "" if cpus is None else str(cpus[1])
    rays: list[tuple[str, Put | None]] = [(RAY, None)]
    if ray is not None:
        rays += [(rendered(RAY_RENDERED, name), rendering(ray.put, render))
                 for name, render in renders.items()]  # fmt: skip
    try:
        for peer in peers.values():
            peer.start()
        for rep in range(plan["reps"] + 1):

            def add(key: tuple[str, str], value: float, rep: int = rep) -> None:
                if rep:
                    got.setdefault(key, []).append(value)

            pin(None)  # in one process: every thread anywhere, as GStreamer's child
            due = [p for p in sets if p == OS or not both or rep % 2 == 1]
            for placement in due if (rep // 2) % 2 == 0 else due[::-1]:
                in_process_placed(add, plan, gst, None if placement == OS else one)
            pin(None if cpus is None else cpus[0])  # across: this process on one CPU
            gc.collect()
            gc.disable()
            try:
                add(
                    ("frame lat", "memcpy"),
                    memcpy_latency(make_payload(FRAME), plan["frame_trips"]),
                )
                for render_name, render in renders.items():
                    if render_name != VERDICT_RENDER:
                        name = rendered(RENDER_ALONE, render_name)
                        render_alone(add, plan, render_ring, name, render)
                for name, peer in peers.items():
                    frames = name in (RING, BOUNDARY) or name in frames_only
                    small, sparse = name not in frames_only, name in (RING, PIPE)
                    across(add, plan, name, peer.put, peer.ack, frames, sparse, small)
                if ray is not None:
                    ray.open()  # torn down after its rows: its readers spin while idle
                    try:
                        # a turn further each repetition: no frame measure is always the
                        # first after the compile
                        turn = rep % len(rays)
                        for name, put in rays[turn:] + rays[:turn]:
                            if put is None:
                                across(add, plan, RAY, ray.put, ray.ack, frames=True, sparse=True)
                            else:
                                across(add, plan, name, put, ray.ack,
                                       frames=True, sparse=False, small=False)  # fmt: skip
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
        render_ring.close()
        render_ring.unlink()
    return got


# --- the table ----------------------------------------------------------------------------


def rows(
    got: Got, skipped: dict[str, str], renders: Sequence[str], sets: Sequence[str] = (OS,)
) -> list[str]:
    """The markdown table: medians [min-max], the ratio of each repetition's pair, verdicts;
    then a line a capacity on the in-process floors and a line a whole-frame render on the
    bound it puts on the zero-copy rows (both from the run's figures). ``sets``: the
    placements of the in-process rows; with more than ``os``, each such row is labelled with
    its own (``[OS]``, ``[one CPU]``), a measure's rows together, and the one-CPU rows show
    their targets without a verdict (info)."""
    lines = [
        "| measure | rxstream | median [min-max] | against | median [min-max] "
        "| ratio median [min-max] | target | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    us, k = 1e6, 1e-3

    def row(measure: str, key: str, variant: str, against: str, scale: float, target: str,
            check: Callable[[float], bool] | None, info: bool = False) -> None:  # fmt: skip
        mine, theirs = got.get((key, variant)), got.get((key, against))
        if mine is None or theirs is None:
            return
        mine, theirs = [v * scale for v in mine], [v * scale for v in theirs]
        ratios, result = verdict(mine, theirs, check)
        if info and check is not None:
            target = f"({target}: the OS rows' target)"
            result = f"info ({'at the target' if result == 'PASS' else 'below the target'})"
        lines.append(
            f"| {measure} | {variant} | {spread(mine)} | {against} | {spread(theirs)} "
            f"| {spread(ratios, 2, 'x')} | {target} | {result} |"
        )

    labelled = list(sets) != [OS]

    def placed(measure: str, key: str, variant: str, scale: float, target: str,
               check: Callable[[float], bool] | None) -> None:  # fmt: skip
        """An in-process row against GStreamer, once a placement in ``sets``."""
        for placement in sets:
            label = f"[{PLACEMENT_LABELS[placement]}] " if labelled else ""
            prefix = "" if placement == OS else f"{placement} "
            row(f"{label}{measure}", f"{prefix}{key}", variant, "GStreamer", scale, target,
                check, info=placement != OS)  # fmt: skip

    hop, backlog = "in-process hop latency, 1 in flight (µs/hop)", "in-process throughput, backlog"
    placed(hop, "hop", "rxstream", us, "—", None)
    for capacity in (2, 256):
        placed(f"{backlog}, capacity {capacity} (k items/s)", f"tput {capacity}", "rxstream", k,
               "≥ 1.0x", lambda r: r >= 1.0)  # fmt: skip
    # the opt-in fused shape (p2..p4 fuse=True on p1's thread) against the same GStreamer
    # chain (a queue, so a thread, before every identity)
    placed(hop, "hop", FUSED, us, "—", None)
    for capacity in (2, 256):
        placed(f"{backlog}, capacity {capacity} (k items/s)", f"tput {capacity}", FUSED, k,
               "≥ 1.0x", lambda r: r >= 1.0)  # fmt: skip
    # the floors, no engine, against the same GStreamer chain: information
    for capacity in (2, 256):
        for name, _chain in FLOORS:
            placed(f"{backlog}, capacity {capacity} (k items/s)", f"tput {capacity}", name, k,
                   "(rxstream's: ≥ 1.0x)", None)  # fmt: skip
    for render in renders:  # the zero-copy rows, a render at a time; stamp's the verdict
        ray_rendered = rendered(RAY_RENDERED, render)
        crossing = render == VERDICT_RENDER
        what = (
            "6.2 MB frame, the crossing (render stamp: the frame's ends touched), across processes"
            if crossing
            else f"6.2 MB frame rendered (render {render}), across processes"
        )
        for name in FRAMES_ONLY:
            zero = rendered(name, render)
            row(f"{what}, latency (µs)", "frame lat", zero, ray_rendered, us, "—", None)
            row(f"{what}, throughput (frames/s)", "frame tput", zero, ray_rendered, 1.0,
                "≥ 5x" if crossing else "(the crossing's: ≥ 5x)",
                (lambda r: r >= 5.0) if crossing else None)  # fmt: skip
        row(f"{what}, throughput (frames/s)", "frame tput", ray_rendered, RAY, 1.0, "—", None)
        if not crossing:
            alone = rendered(RENDER_ALONE, render)
            row(f"6.2 MB frame, {RENDER_ALONE} (render {render}, into a warm leased slot, "
                f"back to back), throughput (frames/s)",
                "frame tput", alone, ray_rendered, 1.0, "—", None)  # fmt: skip
    for name in (RING, BOUNDARY):
        row("6.2 MB frame across processes, latency (µs)", "frame lat", name, RAY, us, "—", None)
        row(
            "6.2 MB frame across processes, throughput (frames/s)",
            "frame tput",
            name,
            RAY,
            1.0,
            "—",
            None,
        )
    zeros = [rendered(name, render) for render in renders for name in FRAMES_ONLY]
    alones = [rendered(RENDER_ALONE, render) for render in renders if render != VERDICT_RENDER]
    for name in (RING, BOUNDARY, *zeros, *alones):
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
    for placement, capacity in itertools.product(sets, (2, 256)):
        tput = f"{'' if placement == OS else f'{placement} '}tput {capacity}"
        label = f"[{PLACEMENT_LABELS[placement]}] " if labelled else ""
        if (tput, "GStreamer") in got:
            lines.append(
                f"- {label}"
                + floor_line(
                    capacity,
                    [
                        ("the 5-thread floor", got[tput, FLOOR_5], got[tput, FLOOR_5_STAMPED]),
                        (
                            "the 2-thread floor (the fused shape's)",
                            got[tput, FLOOR_2],
                            got[tput, FLOOR_2_STAMPED],
                        ),
                    ],
                    got[tput, "GStreamer"],
                    "GStreamer's, in process",
                    1.0,
                )[2:]
            )
            lines.append(
                f"- {label}"
                + items_line(
                    capacity,
                    [
                        ("the 5-thread items floor", got[tput, FLOOR_5_ITEMS]),
                        ("the 2-thread items floor (the fused shape's)", got[tput, FLOOR_2_ITEMS]),
                    ],
                    got[tput, "GStreamer"],
                    "GStreamer's, in process",
                    1.0,
                )[2:]
            )
    for render in renders:
        if render != VERDICT_RENDER:
            lines += render_bound(got, render)
    if VERDICT_RENDER not in renders and "Ray" not in skipped:
        lines.append(
            f"- no ≥ 5x verdict in this run: it counts the crossing (render {VERDICT_RENDER}),"
            f" and --render {renders[0]} left it out"
        )
    lines += [f"- {peer} skipped: {why}" for peer, why in skipped.items()]
    return lines  # fmt: skip


def render_bound(got: Got, render: str) -> list[str]:
    """A line: the bound ``render`` puts on zero copy / Ray rendered: Ray rendered's frame time
    over the render's own (its median alone, the figure a loaded core disturbs least),
    repetition by repetition, beside the zero-copy rows' ratios."""
    ray_rendered, alone = rendered(RAY_RENDERED, render), rendered(RENDER_ALONE, render)
    render_s = got.get(("frame lat", alone))
    alone_rate = got.get(("frame tput", alone))
    theirs = got.get(("frame tput", ray_rendered))
    if render_s is None or alone_rate is None or theirs is None:
        return []
    bounds = [1.0 / (s * rate) for s, rate in zip(render_s, theirs, strict=True)]
    back_to_back, _ = verdict(alone_rate, theirs, None)
    bound = statistics.median(bounds)
    measured = []
    for name in FRAMES_ONLY:
        mine = got.get(("frame tput", rendered(name, render)))
        if mine is not None:
            ratios, _ = verdict(mine, theirs, None)
            measured.append(f"{name} {statistics.median(ratios):.2f}x")
    reach = (
        "the render alone does not rule out ≥ 5x Ray's frame rate with this render"
        if bound >= 5.0
        else "≥ 5x Ray's frame rate with this render is out of any transport's reach"
    )
    return [
        f"- render {render}: {ray_rendered}'s frame time ({spread([1e6 / t for t in theirs])}"
        f" µs) over the render's own (alone, median {spread([s * 1e6 for s in render_s])} µs):"
        f" {spread(bounds, 2, 'x')}, the most a transport whose crossing cost nothing could "
        f"reach (from the render's back-to-back rate instead, which a busy core slows: "
        f"{statistics.median(back_to_back):.2f}x); measured {', '.join(measured)}. So {reach} "
        f"in this run."
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="rxstream vs GStreamer and Ray, as ratios")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every variant")
    parser.add_argument(
        "--placement",
        choices=("cross", "os", "one", "both"),
        default="cross",
        help="cross: across processes, this one on CPU 0 and the consumers on CPU 1 "
        "(default); os: the scheduler places them; in both, the in-process rows where the OS "
        "puts their threads. one: the in-process rows with every thread of both sides "
        "(GStreamer's child too) on one CPU; both: those and the OS's, interleaved, the "
        "one-CPU set in every other repetition (its rows info, the OS rows the verdicts); with "
        "one and both the rows across processes run as with cross",
    )
    parser.add_argument(
        "--render",
        choices=sorted(RENDERS),
        default=None,
        help="restrict the zero-copy rows and Ray's rendered ones to one render (default: "
        "stamp, first and last element: the verdict's crossing; and copy, every pixel from a "
        "prepared frame, in the same repetitions); fill: a memset. Without stamp the run "
        "gives no ≥ 5x verdict",
    )
    parser.add_argument("--no-ray", action="store_true", help="leave Ray out")
    parser.add_argument("--no-gstreamer", action="store_true", help="leave GStreamer out")
    args = parser.parse_args(argv)
    renders = [args.render] if args.render else [VERDICT_RENDER, "copy"]
    plan = dict(QUICK if args.quick else FULL)
    if args.reps:
        plan["reps"] = args.reps
    skipped: dict[str, str] = {}
    gst, why = (None, "--no-gstreamer") if args.no_gstreamer else gst_or_why()
    if gst is None:
        skipped["GStreamer"] = why
    ray_module, why = (None, "--no-ray") if args.no_ray else ray_or_why()
    sets, one, one_why = placements(OS if args.placement in ("cross", "os") else args.placement)
    across_os = args.placement == "os"
    cpus = (0, 1) if not across_os and (os.cpu_count() or 1) >= 2 else None
    ray = None
    if ray_module is None:
        skipped["Ray"] = why
    else:
        ray = RayPeer(ray_module, None if cpus is None else cpus[1])
    began = _perf()
    try:
        got = measure(plan, cpus, gst, ray, {name: RENDERS[name] for name in renders}, sets, one)
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
        f"{', '.join(versions)}, {os.cpu_count()} CPUs; placement {args.placement}; "
        f"renders {', '.join(renders)}"
    )
    if len(sets) > 1:
        print(
            f"# placement both: the in-process [OS] rows in every repetition, the [one CPU] "
            f"rows (every thread of this process and of GStreamer's child on CPU {one}, the "
            f"masks restored after) in {(plan['reps'] + 1) // 2} of them, every other one, "
            f"first in every other of those; verdicts: the OS rows'; the rows across "
            f"processes as cross"
        )
    elif sets == [ONE_CPU]:
        print(
            f"# placement one: the in-process rows with every thread of this process and of "
            f"GStreamer's child on CPU {one}, no verdicts (info); the rows across processes as "
            f"cross"
        )
    if one_why:
        print(f"# {one_why}")
    print()
    print("\n".join(rows(got, skipped, renders, sets)))


if __name__ == "__main__":
    main()
