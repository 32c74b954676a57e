"""The controller's watch over its spawned ranks: their messages, deaths and silence."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

from rxstream._exceptions import PipelineError
from rxstream._kernel._stats import StageStatistics, egressed, stats_from_wire
from rxstream.ranks._common import (
    HEARTBEAT_ENV,
    JOIN_S,
    STATUS_S,
    WATCH_S,
    LaunchResult,
    Statistics,
    heartbeat_s,
)
from rxstream.ranks._egress import Egress
from rxstream.ranks._rank import send_to, signal_name
from rxstream.runtime._threaded import ThreadedRun

if TYPE_CHECKING:
    from rxstream.ranks._launch import Ranks

_DRAIN = 64
"""Messages read from one rank per watch round (egress can arrive frame by frame)."""


class Watch:
    """The controller's loop: reads every rank's messages until every rank has ended."""

    def __init__(
        self,
        run: ThreadedRun,
        ranks: Ranks,
        egress: Egress,
        on_status: Callable[[Statistics], None] | None,
        *,
        closing: threading.Event | None = None,
    ) -> None:
        self.run = run
        self.conns: Mapping[int, Connection] = ranks.conns
        self.procs: Mapping[int, Any] = ranks.procs
        self.egress = egress
        self.on_status = on_status
        self.closing = closing
        """Set by a stopping pipeline (a main app's run): stop every rank as at the end."""
        self.egressed = dict.fromkeys(ranks.conns, 0)
        self.stats: dict[int, dict[str, StageStatistics]] = {}
        self.live: dict[int, dict[str, StageStatistics]] = {}
        self.finished: set[int] = set()
        self.heartbeat = heartbeat_s()
        self.heard: dict[int, float] = {}
        """When each rank was last heard from (any message)."""

    def until_end(self, frames: int | None, timeout: float | None) -> LaunchResult:
        """Wait for every rank to end; fail fast naming a rank that died, failed or stopped
        answering (nothing from it for ``heartbeat`` seconds)."""
        run, conns, procs = self.run, self.conns, self.procs
        deadline = None if timeout is None else time.monotonic() + timeout
        self.heard = dict.fromkeys(conns, time.monotonic())
        reported = time.monotonic()
        stopping_until: float | None = None  # set once the run ends: ranks report, then go
        while True:
            ready = multiprocessing.connection.wait(
                [*conns.values(), *(p.sentinel for p in procs.values())], timeout=WATCH_S
            )
            for rank, conn in conns.items():
                if conn in ready and rank not in self.finished:
                    self._read(rank, conn)
            for rank, proc in procs.items():
                if rank not in self.finished and proc.sentinel in ready and not conns[rank].poll():
                    _died(run, rank, proc)
            self._check_heartbeats()
            run.raise_error()
            if len(self.finished) == len(conns) and (
                run.done.is_set() or stopping_until is not None
            ):
                break
            now = time.monotonic()
            if self.on_status is not None and now - reported >= STATUS_S:
                reported = now
                self.on_status({0: run.statistics(), **self.live})
            if stopping_until is not None:
                if now > stopping_until:
                    break  # a rank that does not report in time is killed by the caller
                continue
            total = sum(self.egressed.values()) + egressed(run.statistics())
            # a finite run ends by itself: every rank completes once the end reaches it
            ended = (
                (frames is not None and total >= frames)
                or (deadline is not None and now > deadline)
                or self.egress.ended
            )
            if ended:
                self.egress.end()
            if ended or (self.closing is not None and self.closing.is_set()):
                run.halt()  # stop every rank, then collect their final statistics
                for rank, conn in conns.items():
                    if rank not in self.finished:
                        send_to(conn, ("stop",))
                stopping_until = now + JOIN_S
        self.stats[0] = dict(run.statistics())
        total = sum(self.egressed.values()) + egressed(self.stats[0])
        refused = self.egress.refused
        return LaunchResult(len(conns) + 1, MappingProxyType(self.stats), total, refused)

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for rank, conn in self.conns.items():
            silent = now - self.heard[rank]
            if rank not in self.finished and silent > self.heartbeat and not conn.poll():
                _unanswering(self.run, rank, self.procs[rank], silent, self.heartbeat)

    def _read(self, rank: int, conn: Connection) -> None:
        self.heard[rank] = time.monotonic()
        for _ in range(_DRAIN):
            try:
                message = conn.recv()
            except (EOFError, OSError):  # its end of the pipe closed: the process is gone
                _died(self.run, rank, self.procs[rank])
            kind = message[0]
            if kind == "egress":
                self.egress.forward(message[1], message[2])
            elif kind == "timing":
                self.egress.on_timing(message[1])
            elif kind == "egressed":
                self.egressed[rank] = message[2]
            elif kind == "stats":
                self.live[rank] = stats_from_wire(message[2])
            elif kind == "done":
                self.egressed[rank], self.stats[rank] = message[2], stats_from_wire(message[3])
                self.finished.add(rank)
                return
            elif kind == "error":
                self.stats[rank] = stats_from_wire(message[3])
                error = PipelineError(f"rank {rank}", RuntimeError(message[2]))
                self.run.fail(error)
                raise error
            elif kind == "stopped":  # a signal stopped it: the launch's own stop, or a failure
                self.egressed[rank], self.stats[rank] = message[3], stats_from_wire(message[4])
                self.finished.add(rank)
                if not self.egress.stopping:
                    error = stopped_by(rank, message[2])
                    self.run.fail(error)
                    raise error
                return
            if not conn.poll():
                return


def stopped_by(rank: int, signum: int) -> PipelineError:
    """The error of a rank that a signal stopped while the launch itself was not stopping."""
    return PipelineError(
        f"rank {rank}",
        RuntimeError(f"rank {rank} was stopped by {signal_name(signum)} (sent to it alone)"),
    )


def _unanswering(run: ThreadedRun, rank: int, proc: Any, silent: float, allowed: float) -> NoReturn:
    """A rank that sends nothing any more (stopped, hung): kill it, fail the run naming it."""
    with contextlib.suppress(OSError):
        proc.kill()  # SIGKILL: the one signal a stopped process does not wait for
    proc.join(1.0)
    error = PipelineError(
        f"rank {rank}",
        RuntimeError(
            f"rank {rank} stopped answering: nothing from it for {silent:.1f} s "
            f"(the heartbeat allows {allowed:g} s, {HEARTBEAT_ENV}); it was killed"
        ),
    )
    run.fail(error)
    raise error


def _died(run: ThreadedRun, rank: int, proc: Any) -> NoReturn:
    """A rank process ended without reporting: fail the run, naming it."""
    proc.join(0.5)
    error = PipelineError(f"rank {rank}", RuntimeError(f"rank {rank} died ({exit_text(proc)})"))
    run.fail(error)
    raise error


def exit_text(proc: Any) -> str:
    """How a rank process ended: ``exit code 3``, or ``exit code -11: killed by SIGSEGV``."""
    code = proc.exitcode
    if isinstance(code, int) and code < 0:
        with contextlib.suppress(ValueError):  # (a number no signal has)
            return f"exit code {code}: killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
