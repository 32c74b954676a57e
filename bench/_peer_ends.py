"""The far ends of bench/peers.py's rows across processes: the consumers and the peers.

Each peer has ``put(payload)`` (returns what ``ack`` takes) and ``ack(sent)`` (waits for the
reply to it). rxstream's consumers run in spawned processes pinned to the CPU that
``RXSTREAM_BENCH_CONSUMER_CPU`` names; Ray's actor pins itself the same way.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ipc import HOP, consumer_cpu, upstream_item  # one copy of each, bench/ipc.py's

from rxstream._kernel._stats import StageCounters
from rxstream.ipc import RingHandle, ShmRing
from rxstream.ipc._wake import DEFAULT_SPIN_US
from rxstream.item import _stamped
from rxstream.ranks._boundary import Boundary

SPAWN = multiprocessing.get_context("spawn")
CONSUMER_CPU = "RXSTREAM_BENCH_CONSUMER_CPU"
"""The environment variable that tells spawned consumers their CPU (empty: anywhere)."""

Put = Callable[[Any], Any]
"""Hand a payload to the consumer; what ``Ack`` takes to wait for its reply."""
Ack = Callable[[Any], object]
"""Wait for the reply to what a ``Put`` returned."""


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
