"""Where a stage-item's CPU goes on the threaded hop path: each part alone, on one thread.

The parts of one item's trip through one stage of ``bench/hop.py``'s chain, each timed in a
loop with nothing contending (no other thread, no wake-ups): the put into the stage's inbox,
the stage thread's take and delivery under a backlog, the port's admission, the pipe's
``on_next`` (its counters, two stamps, the function, the new item), both as a run wires a
pipe (which admits its items itself, behind its port), four fused pipes'
``on_next`` (``p1``'s thread in the opt-in fused shape), the chain's end (the collector) and
the source's pull. What the table leaves out is what only a threaded run has:
wake-ups, the GIL hand-offs and lock contention; ``bench/hop.py``'s CPU-per-item rows hold
everything. Figures are ns per item, the minimum of ``--reps`` timings of ``--items`` items
(the least disturbed by other work on the machine), less the empty loop's.

Run ``python bench/hop_parts.py`` (a few seconds).

``--placement`` measures instead what the table leaves out, for the opt-in fused shape at
capacity 2 (``bench/hop.py``'s ``FusedChain``: ``src`` and ``p1``'s thread over one inbox of
2) beside its floors (bench/_floors.py's two-thread chains, without and with the stamps): the
same 20k-item backlog run with both threads pinned to one CPU, with each on a CPU of its own,
and where the OS puts them (nothing pinned, as bench/peers.py's in-process rows run);
GStreamer's chain of bench/peers.py beside them (where Debian's ``python3-gst-1.0`` is), its
child process on one CPU and where the OS puts it, and their ratios. Per
thread, from ``/proc``: its voluntary context switches an item (the times it went to sleep:
a wait for a free slot, for an item, or for the GIL) and its CPU an item
(``time.thread_time``), over the run from its first item to its last. Linux only; about 30 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from reactivex import Observable, abc
from reactivex.disposable import Disposable

# `python bench/hop_parts.py` from a checkout where the package is not installed: the repo root
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _floors import FusedFloorChain, FusedFloorStampedChain
from _report import STOP, noop, revision, spread
from hop import FusedChain, RxsChain
from peers import GstChain, gst_or_why

from rxstream._kernel._generations import Generations
from rxstream._kernel._inbox import InboxSpec
from rxstream._kernel._shell import StageShell
from rxstream._kernel._stats import StageCounters
from rxstream.item import PipelineItem, _chain_of, _from_parts, _trusted_metadata, now
from rxstream.operators._core import attach
from rxstream.operators._pipe import pipe_operator
from rxstream.operators._source import SourcePuller
from rxstream.runtime._fuse import fused_chain
from rxstream.runtime._handoff import TokenThread
from rxstream.runtime._port import Port
from rxstream.runtime._run import Run
from rxstream.runtime._thread import StageThread, VirtualClock

BATCH = 256
"""Items a backlog holds in these loops (``bench/hop.py``'s larger capacity)."""

_GENERATIONS = Generations()
_METADATA = _trusted_metadata(0, 0, False, 0, 0, False, None, 0, 0, ())
_ITEM = _from_parts(1, _METADATA, _chain_of(("src.in", 1.0, "src.out", 2.0)))
"""A source's item as it leaves the source: its metadata and the chain's first link."""


def _sink(_value: Any) -> None:
    """Where each part's output goes."""


def _shell(name: str, kind: str = "pipe") -> StageShell:
    return StageShell(
        name, kind, VirtualClock(), "raise", _sink, lambda _c: None, _GENERATIONS, None, True
    )


def _counters() -> StageCounters:
    return StageCounters("p", "pipe")


def put_part(kind: type[StageThread]) -> Callable[[int], None]:
    """``items`` puts into a stage's inbox (``block``, room, the thread not sleeping)."""

    def run(items: int) -> None:
        thread = kind("p", InboxSpec(BATCH + 1), _counters(), _sink)
        put = thread.put
        for _ in range(items // BATCH):
            for _ in range(BATCH):
                put(_sink, _ITEM)
            _empty(thread)

    return run


def off_main(part: Callable[[int], None]) -> Callable[[int], None]:
    """``part`` on a thread of its own, as a run's producers are (sources, stage threads): the
    main thread's put takes the Ctrl-C-safe path (runtime/_handoff.py). A thread's start and
    join are in the timing: a few ns an item."""

    def run(items: int) -> None:
        worker = threading.Thread(target=part, args=(items,))
        worker.start()
        worker.join()

    return run


def _empty(thread: StageThread) -> None:
    """Let go of what the inbox holds, as if delivered (every slot free again)."""
    items = getattr(thread, "_items", None)
    if items is not None:
        while items.qsize():
            items.get()
            thread._tokens.put(None)  # type: ignore[attr-defined]
    else:
        thread._inbox.clear()
        thread._data = 0


def take_part(kind: type[StageThread]) -> Callable[[int], None]:
    """``BATCH`` puts, then the stage thread's loop taking and delivering them (no-op)."""

    def run(items: int) -> None:
        thread = kind("p", InboxSpec(BATCH + 1), _counters(), _sink)
        for _ in range(items // BATCH):
            for _ in range(BATCH):
                thread.put(_sink, _ITEM)
            thread.put_control(lambda _value: thread.close())
            thread._loop()  # on this thread: ends at the close
            thread._closed = False  # and again
            tokens = getattr(thread, "_tokens", None)
            if tokens is not None:
                tokens.get()  # the close's wake-up for producers

    return run


def admission_part(items: int) -> None:
    """The port's admission of ``items`` routine items (not stale, no cutover, no flush)."""
    admits: list[Callable[[PipelineItem], None]] = []

    class Capture(Port):
        def _hand_off(
            self, upstream: Any, admit: Callable[[PipelineItem], None], *_rest: Any
        ) -> abc.DisposableBase:
            admits.append(admit)
            return Disposable()

    def nothing(_observer: Any, _scheduler: Any = None) -> abc.DisposableBase:
        return Disposable()

    Capture(_shell("p1"))(Observable(nothing)).subscribe(_sink)
    (admit,) = admits
    for _ in range(items):
        admit(_ITEM)


def pipe_part(items: int) -> None:
    """A pipe's ``on_next`` over ``items`` items: counters, two stamps, a no-op, the item."""
    observers: list[abc.ObserverBase[PipelineItem]] = []

    def subscribe(observer: Any, _scheduler: Any = None) -> abc.DisposableBase:
        observers.append(observer)
        return Disposable()

    stream = pipe_operator(noop)(_shell("p1"))([Observable(subscribe)])
    attach(stream, _sink, _sink, lambda: None)
    on_next = observers[0].on_next
    for _ in range(items):
        on_next(_ITEM)


def admitting_pipe_part(items: int) -> None:
    """A pipe's ``on_next`` behind its own port (as a run wires it): the stage's admission
    inline, then the pipe's work (the two rows above in one call)."""
    observers: list[abc.ObserverBase[PipelineItem]] = []

    def subscribe(observer: Any, _scheduler: Any = None) -> abc.DisposableBase:
        observers.append(observer)
        return Disposable()

    shell = _shell("p1")
    stream = pipe_operator(noop)(shell)([Port(shell)(Observable(subscribe))])
    attach(stream, _sink, _sink, lambda: None)
    on_next = observers[0].on_next
    for _ in range(items):
        on_next(_ITEM)


def fused_part(items: int) -> None:
    """``bench/hop.py``'s fused shape on ``p1``'s thread: one operator over four no-op pipes
    (each member's counters, stale check, two stamps; one item built at the end)."""
    observers: list[abc.ObserverBase[PipelineItem]] = []

    def subscribe(observer: Any, _scheduler: Any = None) -> abc.DisposableBase:
        observers.append(observer)
        return Disposable()

    shells = []
    for name in ("p1", "p2", "p3", "p4"):
        shell = _shell(name)
        shell.target_fn = noop
        shells.append(shell)
    stream = fused_chain(Observable(subscribe), shells, _GENERATIONS)
    attach(stream, _sink, _sink, lambda: None)
    on_next = observers[0].on_next
    for _ in range(items):
        on_next(_ITEM)


class _Tail:
    """A pipeline's last node, as far as its collector reads it."""

    stage = SimpleNamespace(is_sink=False)


def collector_part(items: int) -> None:
    """The end's collector as ``Run._collector`` builds it (collecting nothing, as in hop.py)."""
    tail = _Tail()
    run = SimpleNamespace(
        outputs={tail: []},
        collect=None,
        generations=_GENERATIONS,
        shells={tail: _shell("p4")},
        fail=_sink,
        _end_completed=lambda: None,
    )
    end: Any = Run._collector(run, tail)  # type: ignore[arg-type]
    on_next = getattr(end, "on_next", None) or end[0]  # an engine before it: an Observer
    for _ in range(items):
        on_next(_ITEM)


def source_part(items: int) -> None:
    """A source's pull (metadata, first stamps) from a plain iterator, as the pump does it
    (whose ``take_waited`` is only for a client input's pulls)."""
    puller = SourcePuller(range(items + 1), _shell("src", "source"))
    puller.open()
    pull, waited = puller.pull, puller.take_waited
    waits = getattr(puller, "waits", True)  # an engine before it asked every pull
    for _ in range(items):
        pull()
        if waits:
            waited()


def clock_part(items: int) -> None:
    """One stamp's clock read."""
    for _ in range(items):
        now()


def _loop(items: int) -> None:
    for _ in range(items):
        pass


def ns_per_item(part: Callable[[int], None], items: int, reps: int) -> float:
    """The fastest of ``reps`` runs of ``part`` over ``items`` items, ns an item."""
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter_ns()
        part(items)
        best = min(best, (time.perf_counter_ns() - started) / items)
    return best


# --- --placement: the two threads' hand-off at capacity 2, by where they run ----------------

PLACEMENTS = ("one CPU", "two CPUs", "OS")
"""Both threads pinned to one CPU; ``src`` and ``p1`` each on a CPU of its own; nothing pinned."""
CHAINS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("rxstream fused (opt-in)", FusedChain),
    ("floor, 2 threads (no engine)", FusedFloorChain),
    ("floor, 2 threads + stamps (no engine)", FusedFloorStampedChain),
)
THREADS = ("src", "p1")


def _thread_counts() -> tuple[int, float]:
    """The calling thread's voluntary context switches so far, and its CPU seconds."""
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split(":")[1]), time.thread_time()
    raise RuntimeError("no voluntary_ctxt_switches in /proc/self/task/<tid>/status")


def placed_run(
    chain: Callable[..., Any], items: int, capacity: int, cpus: tuple[int, int] | None
) -> tuple[float, dict[str, tuple[float, float]]]:
    """Items per second of one backlog run, ``src`` pinned to ``cpus[0]`` and ``p1`` (every
    other thread the chain starts) to ``cpus[1]`` before the gate opens (``None``: nothing
    pinned); per thread, its sleeps and CPU seconds an item from its first item to its last."""
    gate, finished, src_up = threading.Event(), threading.Event(), threading.Event()
    values: Iterator[Any] = iter(range(items))
    marks: dict[str, tuple[int, float]] = {}
    src_ident = [0]

    def pull() -> Any:
        if not gate.is_set():
            src_ident[0] = threading.get_native_id()
            src_up.set()
            gate.wait()
            marks["src first"] = _thread_counts()
        value = next(values, STOP)
        if value is STOP:
            marks["src last"] = _thread_counts()
        return value

    left = [items]

    def last(payload: Any) -> Any:
        if left[0] == items:
            marks["p1 first"] = _thread_counts()
        left[0] -= 1
        if not left[0]:
            marks["p1 last"] = _thread_counts()
            finished.set()
        return payload

    before = {thread.ident for thread in threading.enumerate()}
    run = chain(pull, last, capacity)
    run.start()
    if not src_up.wait(10):
        raise RuntimeError("the source thread did not start")
    time.sleep(0.02)  # every thread is up and waiting
    if cpus is not None:
        for thread in threading.enumerate():
            if thread.ident not in before and thread.native_id is not None:
                os.sched_setaffinity(thread.native_id, {cpus[thread.native_id != src_ident[0]]})
    started = time.perf_counter()
    gate.set()
    if not finished.wait(60):
        raise RuntimeError("placed run did not finish")
    rate = items / (time.perf_counter() - started)
    run.wait()
    per_thread = {}
    for name in THREADS:
        (sleeps0, cpu0), (sleeps1, cpu1) = marks[f"{name} first"], marks[f"{name} last"]
        per_thread[name] = ((sleeps1 - sleeps0) / items, (cpu1 - cpu0) / items)
    return rate, per_thread


def placement_table(items: int, reps: int) -> list[str]:
    """Each chain at capacity 2 in each placement, ``reps`` times interleaved (after one
    warm-up run of each chain); the table's lines."""
    if not hasattr(os, "sched_setaffinity") or not Path("/proc/self/task").is_dir():
        return ["(--placement needs Linux: sched_setaffinity and /proc/self/task)"]
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return [f"(--placement needs 2 CPUs; this process may run on {allowed} only)"]
    where: dict[str, tuple[int, int] | None] = {
        "one CPU": (allowed[0], allowed[0]),
        "two CPUs": (allowed[0], allowed[1]),
        "OS": None,
    }
    for _, chain in CHAINS:
        placed_run(chain, items // 4, 2, None)
    placed_run(RxsChain, 100, 2, None)  # the engine's imports and first run out of the way
    got: dict[tuple[str, str], list[tuple[float, dict[str, tuple[float, float]]]]] = {}
    gst, why = gst_or_why()
    gst_got: dict[str, list[float]] = {}
    try:
        if gst is not None:
            gst.ask(f"throughput {items // 4} 2")
        for _ in range(reps):
            for placement, cpus in where.items():
                for name, chain in CHAINS:
                    got.setdefault((name, placement), []).append(placed_run(chain, items, 2, cpus))
                if gst is not None and placement != "two CPUs":  # its 6 threads: no 2-way split
                    _pin_process(gst, set(allowed) if cpus is None else {cpus[0]})
                    rate = gst.ask(f"throughput {items} 2")
                    gst_got.setdefault(placement, []).append(rate)
    finally:
        if gst is not None:
            gst.close()
    lines = [
        "| chain, capacity 2 | placement | k items/s | / the same chain on one CPU "
        "| src: sleeps an item | src: CPU µs an item | p1: sleeps an item | p1: CPU µs an item |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, _ in CHAINS:
        alone = [rate for rate, _ in got[(name, "one CPU")]]
        for placement in PLACEMENTS:
            runs = got[(name, placement)]
            rates = [rate for rate, _ in runs]
            cells = [name, placement, spread([rate / 1e3 for rate in rates])]
            cells.append(
                spread([rate / one for rate, one in zip(rates, alone, strict=True)], 2, "x")
            )
            for thread in THREADS:
                cells.append(f"{statistics.median(counts[thread][0] for _, counts in runs):.2f}")
                cells.append(
                    f"{statistics.median(counts[thread][1] for _, counts in runs) * 1e6:.1f}"
                )
            lines.append("| " + " | ".join(cells) + " |")
    if gst is None:
        return [*lines, "", f"(GStreamer skipped: {why})"]
    for placement, rates in gst_got.items():
        lines.append(
            f"| GStreamer `appsrc ! (queue ! identity) x4 ! appsink` | {placement} "
            f"| {spread([rate / 1e3 for rate in rates])} | — | — | — | — | — |"
        )
    lines.append("")
    for placement, rates in gst_got.items():
        fused = [rate for rate, _ in got[(CHAINS[0][0], placement)]]
        ratios = [ours / theirs for ours, theirs in zip(fused, rates, strict=True)]
        lines.append(
            f"- {placement}: rxstream fused / GStreamer, repetition by repetition, "
            f"{spread(ratios, 2, 'x')} (issue 18's target ≥ 1.0x)"
        )
    return lines


def _pin_process(gst: GstChain, cpus: set[int]) -> None:
    """Every thread of GStreamer's child process on ``cpus`` (threads it starts later
    inherit it)."""
    pid = gst.process.pid
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except OSError:  # a thread that ended meanwhile
            continue


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The threaded hop's per-item parts, alone")
    parser.add_argument("--items", type=int, default=100 * BATCH, help="items a timing")
    parser.add_argument("--reps", type=int, default=9, help="timings of each part")
    parser.add_argument(
        "--placement",
        action="store_true",
        help="the fused shape and its floors at capacity 2, by where their two threads run",
    )
    args = parser.parse_args(argv)
    items, reps = args.items, args.reps
    if args.placement:
        placement_items = 20_000 if items == 100 * BATCH else items
        placement_reps = 3 if reps == 9 else reps
        print(
            f"# python bench/hop_parts.py --placement: {placement_reps} repetitions "
            f"(interleaved), {placement_items} items a run; rxstream at {revision()}; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
        )
        print()
        print("\n".join(placement_table(placement_items, placement_reps)))
        return
    parts: list[tuple[str, Callable[[int], None]]] = [
        ("put into the inbox, C queues (block, room)", off_main(put_part(TokenThread))),
        ("put into the inbox, deque under a lock (block, room)", off_main(put_part(StageThread))),
        ("  C queues, put from the main thread (Ctrl-C-safe)", put_part(TokenThread)),
        (
            "put, then the thread's take + delivery (backlog), C queues",
            off_main(take_part(TokenThread)),
        ),
        (
            "put, then the thread's take + delivery (backlog), deque",
            off_main(take_part(StageThread)),
        ),
        ("the port's admission (stale, cutover, flush checks)", admission_part),
        ("a pipe's on_next: counters, 2 stamps, no-op, new item", pipe_part),
        ("  of which one clock read (a stamp)", clock_part),
        ("a pipe behind its port: the admission, then the pipe's on_next", admitting_pipe_part),
        ("four fused pipes' on_next (p1's thread in the fused shape)", fused_part),
        ("the end's collector", collector_part),
        ("a source's pull (and the pump's take_waited if it asks)", source_part),
    ]
    empty = ns_per_item(_loop, items, reps)
    print(f"# python bench/hop_parts.py --items {items} --reps {reps}; rxstream at {revision()}")
    print()
    print("| part (one item, one stage, one thread, uncontended) | ns/item |")
    print("| --- | --- |")
    for name, part in parts:
        print(f"| {name} | {ns_per_item(part, items, reps) - empty:.0f} |")


if __name__ == "__main__":
    main()
