"""The control plane of a torchrun launch: a gloo group of its own between rank 0 and the rest.

Rank 0, the controller, has a channel each way with every other rank (two
:class:`~rxstream.ranks._distboundary.DistChannel` s per rank, in the launch's control
group). It sends doc writes, generation changes, heartbeats and, at the end, ``stop`` (with
the failure, if any) and ``bye``; the ranks send their egress counts, statistics and
failures. A send may block on a peer that went quiet, so each peer's messages leave from a
thread of their own (:class:`Outbox`); what arrives is applied by a dispatcher thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rxstream._exceptions import PipelineError, RingClosed
from rxstream._kernel._stats import StageStatistics, egressed, stats_from_wire, stats_to_wire
from rxstream._util import library_logger
from rxstream.ranks._app import describe
from rxstream.ranks._common import LaunchOptions, LaunchResult
from rxstream.ranks._distboundary import DistChannel, DistRun, RankLost
from rxstream.ranks._replicate import apply_replica, replicate

if TYPE_CHECKING:
    from rxstream.ranks._distlaunch import Launch

__all__ = [
    "HEARTBEAT_S",
    "JOIN_S",
    "LOST_S",
    "STATUS_S",
    "WATCH_S",
    "Control",
    "Outbox",
    "describe",
]

_log = library_logger("rxstream")

HEARTBEAT_S = 0.25
"""How often each side of a control link sends a beat (ranks also report every ``WATCH_S``)."""
LOST_S = 2.0
"""A rank not heard from for this long has gone away."""
WATCH_S = 0.05
"""How often a rank reports to the controller, and the controller checks on the ranks."""
JOIN_S = 2.0
"""How long the controller waits for the ranks' final statistics once the run stopped."""
STATUS_S = 0.5
"""How often ``on_status`` gets every rank's statistics."""


class Outbox:
    """Messages to one peer, sent in order by a thread of their own (a send may block)."""

    def __init__(self, channel: DistChannel) -> None:
        self.channel = channel
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._pump, name=f"rxstream:{channel.name}:send", daemon=True
        )
        self._thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        self._queue.put(message)

    def _pump(self) -> None:
        while True:
            message = self._queue.get()
            if message is None:
                return
            try:
                self.channel.put(message)
            except RingClosed:
                return

    def close(self, timeout: float) -> None:
        """Send what is queued (within ``timeout``), then the channel's close mark."""
        self._queue.put(None)
        self._thread.join(timeout)
        self.channel.close()


class Control:
    """The control plane of one rank: a channel each way to the controller (or each rank).

    Rank 0 talks to every rank, the others to rank 0 only. Each side hears from the other at
    least every ``HEARTBEAT_S`` (a thread of its own sends beats), and ``lost`` names the
    peers that broke or went quiet.
    """

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.rank = launch.rank
        group = launch.control
        peers = range(1, launch.world) if self.rank == 0 else (0,)
        self.outboxes: dict[int, Outbox] = {}
        self.inboxes: dict[int, DistChannel] = {}
        self.heard: dict[int, float] = {}
        self.broken: set[int] = set()
        self.changed = threading.Event()  # a message or a loss arrived
        self.reports: dict[int, tuple[int, bool]] = {}  # rank -> (egressed, completed)
        self.live: dict[int, Mapping[str, StageStatistics]] = {}  # the latest reported
        self.errors: dict[int, PipelineError] = {}
        self.finals: dict[int, tuple[int, dict[str, StageStatistics]]] = {}
        self.stop: tuple[PipelineError | None] | None = None  # what the controller said
        self.bye: int | None = None  # the controller's last word: items egressed in all
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        now = time.monotonic()
        for peer in peers:
            tell, hear = f"control:{self.rank}>{peer}", f"control:{peer}>{self.rank}"
            lost = self._on_lost(peer)
            self.outboxes[peer] = Outbox(
                DistChannel(tell, group, peer, side="writer", on_lost=lost)
            )
            self.inboxes[peer] = DistChannel(hear, group, peer, side="reader", on_lost=lost)
            self.heard[peer] = now
            self._start(f"rxstream:{hear}", self._dispatch, peer)
        self._start(f"rxstream:control:{self.rank}:beat", self._beat)

    def _start(self, name: str, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _on_lost(self, peer: int) -> Callable[[BaseException], None]:
        def lost(error: BaseException) -> None:
            self.broken.add(peer)
            self.changed.set()

        return lost

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            self.broadcast(("beat",))

    def _dispatch(self, peer: int) -> None:
        inbox = self.inboxes[peer]
        while True:
            try:
                message = inbox.get()
            except (RingClosed, PipelineError):
                return
            self.heard[peer] = time.monotonic()
            self._apply(peer, message)
            self.changed.set()

    def _apply(self, peer: int, message: tuple[Any, ...]) -> None:
        if apply_replica(self.launch.ctx, message):  # a doc write, the generations
            return
        kind = message[0]
        if kind == "report":
            self.reports[peer] = (message[1], message[2])
            self.live[peer] = stats_from_wire(message[3])
        elif kind == "error":
            self.errors.setdefault(peer, message[1])
        elif kind == "final":
            self.finals[peer] = (message[1], stats_from_wire(message[2]))
        elif kind == "stop":
            self.stop = (message[1],)
        elif kind == "bye":
            self.bye = message[1]

    def broadcast(self, message: tuple[Any, ...]) -> None:
        for outbox in self.outboxes.values():
            outbox.send(message)

    def wait(self) -> float:
        """Until something arrived, or ``WATCH_S``; the time then."""
        self.changed.wait(WATCH_S)
        self.changed.clear()
        return time.monotonic()

    def lost(self, now: float) -> PipelineError | None:
        """An error naming the ranks that went away (broken, or silent for ``LOST_S``)."""
        broken = set(self.broken)
        silent = {p for p, t in self.heard.items() if now - t > LOST_S} - broken
        if not broken and not silent:
            return None
        # a host that went away takes all its ranks: name the ones going quiet with it too
        quiet = {p for p, t in self.heard.items() if now - t > LOST_S / 2}
        ranks = tuple(sorted(broken | silent | quiet))
        names = sorted({repr(self.launch.hosts[r].split("/")[0]) for r in ranks})
        where = f"host{'s' if len(names) > 1 else ''} {', '.join(names)}"
        why = "its connection broke" if not silent else f"not heard from for {LOST_S} s"
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        role = " (the controller)" if 0 in ranks else ""
        return PipelineError(who, RankLost(ranks, f"{who}{role} on {where} went away: {why}"))

    # --- the controller ---------------------------------------------------------------------

    def lead(self, run: DistRun, options: LaunchOptions) -> LaunchResult:
        """Rank 0: replicate, watch every rank, end the run, collect the statistics."""
        world, frames = self.launch.world, options.frames
        deadline = None if options.timeout is None else time.monotonic() + options.timeout
        replicas = replicate(self.launch.ctx, self.broadcast)
        try:
            run.start()
            if options.on_open is not None:
                options.on_open()
            reported = time.monotonic()
            while True:
                now = self.wait()
                if options.on_status is not None and now - reported >= STATUS_S:
                    reported = now
                    options.on_status({0: run.statistics(), **self.live})
                failure = self._failure(run, now)
                if failure is not None:
                    break
                total = egressed(run.statistics()) + sum(e for e, _ in self.reports.values())
                done = sum(1 for _, completed in self.reports.values() if completed)
                if (
                    ((run.done.is_set() or not run.local) and done == world - 1)
                    or (frames is not None and total >= frames)
                    or (deadline is not None and now > deadline)
                ):
                    break
        finally:
            for subscription in replicas:
                subscription.dispose()
        if failure is not None:
            self.failed(failure)
        self.broadcast(("stop", failure))
        run.stop(0.45)
        until = time.monotonic() + JOIN_S
        while failure is None and set(self.finals) < set(self.outboxes) - self.broken:
            now = self.wait()
            if now > until:
                break
            failure = self._failure(run, now)
            if failure is not None:
                self.failed(failure)
                self.broadcast(("stop", failure))
        total = egressed(run.statistics()) + sum(e for e, _ in self.finals.values())
        self.broadcast(("bye", total))
        if failure is not None:
            raise failure
        stats: dict[int, Mapping[str, StageStatistics]] = {0: dict(run.statistics())}
        for rank, (_, rank_stats) in sorted(self.finals.items()):
            stats[rank] = rank_stats
        return LaunchResult(world, MappingProxyType(stats), total)

    def failed(self, failure: BaseException) -> None:
        """Say it now: torchrun may stop this process soon after a rank died."""
        self.launch.failure = failure
        _log.error("rank_failed", rank=self.rank, error=str(failure))

    def _failure(self, run: DistRun, now: float) -> PipelineError | None:
        """The first failure: this rank's run, a rank's report, or ranks gone away."""
        error = run.error
        if error is not None:
            if isinstance(error, PipelineError):
                return error
            return PipelineError(f"rank {self.rank}", error)
        if self.errors:
            return self.errors[min(self.errors)]
        return self.lost(now)

    # --- the other ranks --------------------------------------------------------------------

    def follow(self, run: DistRun) -> LaunchResult:
        """Rank r > 0: run, report, and stop when the controller says (or goes away).

        This rank's own failure is reported and raised here once the controller stopped the
        job; any other failure is raised as the controller (or the loss) tells it.
        """
        controller = self.outboxes[0]
        own: BaseException | None = None
        failure: BaseException | None = None
        run.start()
        while True:
            now = self.wait()
            stats = run.statistics()
            completed = (run.done.is_set() or not run.local) and run.error is None
            controller.send(("report", egressed(stats), completed, stats_to_wire(stats)))
            if own is None and run.error is not None:
                own = run.error
                controller.send(("error", self._as_reported(own)))
            if self.stop is not None:
                failure = own or self.stop[0]
                break
            lost = self.lost(now)
            if lost is not None:
                failure = own or lost
                break
        if failure is not None:
            self.failed(failure)
        run.stop(0.45)
        if failure is None:
            stats = run.statistics()
            controller.send(("final", egressed(stats), stats_to_wire(stats)))
            until = time.monotonic() + JOIN_S
            while self.bye is None and self.wait() < until:
                failure = self.lost(time.monotonic())
                if failure is not None:
                    self.failed(failure)
                    break
        if failure is not None:
            raise failure
        mine: dict[int, Mapping[str, StageStatistics]] = {self.rank: dict(run.statistics())}
        return LaunchResult(self.launch.world, MappingProxyType(mine), self.bye or 0)

    def _as_reported(self, error: BaseException) -> PipelineError:
        """This rank's failure as the others raise it: naming this rank (or the lost one)."""
        if isinstance(error, PipelineError) and isinstance(error.cause, RankLost):
            return error
        return PipelineError(f"rank {self.rank}", RuntimeError(describe(error)))

    def close(self) -> None:
        """Send what is queued, then close every channel (the peers take the close marks)."""
        self._closed.set()
        for outbox in self.outboxes.values():
            outbox.close(0.5)
        for inbox in self.inboxes.values():
            inbox.close()
        for thread in self._threads:
            thread.join(0.5)


# --- statistics over the wire -----------------------------------------------------------------
