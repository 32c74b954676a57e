"""The front's warm workers: W processes, each running one session at a time.

A worker is spawned (``multiprocessing``'s ``spawn``: CUDA cannot be re-initialised in a
forked child), imports the app once and says ``ready``; its messages are read on the front's
event loop (``loop.add_reader`` on its pipe), its death seen on its process sentinel. A worker
that died is joined and a fresh one spawned in its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from rxstream.serve._worker import WorkerSpec, worker_main

__all__ = ["Worker", "WorkerPool"]

QUIT_S = 5.0
"""How long a stopping front waits for a worker to end its session and exit (then SIGKILL)."""


@dataclass(eq=False)
class Worker:
    """One worker process as the front sees it."""

    index: int
    """Its place in the pool (0..W-1; a respawned worker keeps it)."""
    process: Any
    conn: Connection
    state: str = "starting"
    """``starting`` (importing the app), ``free``, ``busy`` or ``dead``."""
    session: str | None = None
    """The id of the session it runs, when busy."""
    pid: int = 0
    sessions: int = 0
    """Sessions it ran so far."""
    started_at: float = field(default_factory=time.monotonic)


Handler = Callable[[Worker, tuple[Any, ...]], None]


class WorkerPool:
    """``count`` workers of ``spec``; ``on_message(worker, message)`` is called on the loop for
    each message (``("died", exitcode)`` when the process ended unasked)."""

    def __init__(self, spec: WorkerSpec, count: int, on_message: Handler) -> None:
        self.spec = spec
        self.workers: list[Worker] = []
        self._count = count
        self._on_message = on_message
        self._mp = multiprocessing.get_context("spawn")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.quitting = False

    def start(self) -> None:
        """Spawn every worker (they import the app in parallel)."""
        self._loop = asyncio.get_running_loop()
        self.workers = [self._spawn(i) for i in range(self._count)]

    def _spawn(self, index: int) -> Worker:
        assert self._loop is not None
        ours, theirs = self._mp.Pipe()
        process = self._mp.Process(
            target=worker_main, args=(self.spec, theirs), name=f"rxstream-serve-{index}"
        )
        process.start()
        theirs.close()
        worker = Worker(index, process, ours, pid=process.pid or 0)
        self._loop.add_reader(ours.fileno(), self._readable, worker)
        self._loop.add_reader(process.sentinel, self._exited, worker)
        return worker

    def respawn(self, worker: Worker) -> Worker:
        """A fresh worker in dead ``worker``'s place."""
        fresh = self._spawn(worker.index)
        self.workers[worker.index] = fresh
        return fresh

    def send(self, worker: Worker, *message: Any) -> bool:
        """Send ``message`` to ``worker``; whether it went (a dead pipe: no)."""
        try:
            worker.conn.send(message)
        except (OSError, ValueError):
            return False
        return True

    def free(self) -> list[Worker]:
        """The workers free now, in pool order."""
        return [w for w in self.workers if w.state == "free"]

    def _readable(self, worker: Worker) -> None:
        try:
            while worker.conn.poll():
                self._on_message(worker, worker.conn.recv())
        except (EOFError, OSError):
            self._forget(worker)  # its sentinel says how it ended

    def _exited(self, worker: Worker) -> None:
        self._forget(worker)
        with contextlib.suppress(EOFError, OSError):  # what it said before it went
            while worker.conn.poll():
                self._on_message(worker, worker.conn.recv())
        worker.process.join(QUIT_S)
        assert self._loop is not None
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(worker.process.sentinel)
        worker.conn.close()
        if worker.state != "dead":
            worker.state = "dead"
            if not self.quitting:
                self._on_message(worker, ("died", worker.process.exitcode))

    def _forget(self, worker: Worker) -> None:
        assert self._loop is not None
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(worker.conn.fileno())

    async def close(self) -> None:
        """Ask every worker to quit (its session ends), wait ``QUIT_S``, kill what is left,
        join them all."""
        self.quitting = True
        for worker in self.workers:
            self.send(worker, "quit")
        deadline = time.monotonic() + QUIT_S
        while any(w.process.is_alive() for w in self.workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for worker in self.workers:
            if worker.process.is_alive():
                with contextlib.suppress(OSError):
                    worker.process.kill()
            worker.process.join(QUIT_S)
            self._forget(worker)
            assert self._loop is not None
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(worker.process.sentinel)
            worker.state = "dead"
