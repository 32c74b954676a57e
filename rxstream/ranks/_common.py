"""What every part of a launch shares: its options, timings, heartbeat, live ranks, result."""

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rxstream._exceptions import ArgumentError
from rxstream._kernel._stats import StageStatistics, repeated
from rxstream.runtime._seconds import seconds_from_env
from rxstream.transport import Transport

JOIN_S = 2.0
"""Seconds a stopping controller waits for a rank process (or a ``main`` coroutine)."""
READY_S = 120.0
"""How long the controller waits for a spawned rank to build its graph and start."""
WATCH_S = 0.05
"""How often the controller checks on its ranks (a dead rank is noticed within ~this)."""
STATUS_S = 0.5
"""How often ``on_status`` gets the statistics of every rank."""
HEARTBEAT_ENV = "RXSTREAM_HEARTBEAT_S"
"""Sets :data:`HEARTBEAT_S` for a launch (seconds, > 0)."""
HEARTBEAT_S = 5.0
"""A running rank that sends the controller nothing for this long (it reports every
``WATCH_S``: its egress count is the heartbeat) has stopped answering — stopped (SIGSTOP),
hung, swapped out: the run fails naming it, and it is killed (SIGKILL reaches a stopped
process). Start-up is bounded by ``READY_S`` instead."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""The signals a spawned rank takes as "stop now": it halts its run and reports the signal
(SIGINT, the terminal's Ctrl-C that reaches the whole process group, it ignores: the
controller stops it)."""


live_ranks: set[Any] = set()
"""The rank processes spawned and not yet joined, for :func:`kill_ranks`."""


def kill_ranks() -> None:
    """SIGKILL every spawned rank process still running (a forced exit's last act; safe in a
    signal handler: it only sends signals)."""
    for proc in tuple(live_ranks):
        with contextlib.suppress(OSError, TypeError):
            os.kill(proc.pid, signal.SIGKILL)


def heartbeat_s() -> float:
    """:data:`HEARTBEAT_S`, or the seconds ``RXSTREAM_HEARTBEAT_S`` gives."""
    return seconds_from_env(HEARTBEAT_ENV, HEARTBEAT_S)


Statistics = Mapping[int, Mapping[str, StageStatistics]]


class OutStreamRefused(ArgumentError):
    """``out_stream`` names none of the app's streams (``rxstream run`` names its flag,
    ``--out-stream``; a ``main`` app's streams are known only once it opens its session)."""

    def __init__(self, stream: str, streams: Sequence[str]) -> None:
        self.stream = stream
        self.streams = tuple(streams)
        super().__init__(f"out_stream {self.rule}")

    @property
    def rule(self) -> str:
        """The rule and the value, without the argument's name: ``must be one of …, got …``."""
        shown = ", ".join(map(repr, self.streams))
        return f"must be one of the app's streams ({shown}), got {self.stream!r}"


@dataclass(frozen=True)
class LaunchResult:
    """How a launched pipeline ended: statistics per rank, and egressed frames."""

    ranks: int
    """How many rank processes ran (the controller included)."""
    statistics: Statistics = field(default_factory=dict)
    """Each rank's stage statistics when it stopped, by rank."""
    egressed: int = 0
    """Items all sinks egressed, over every rank; for a ``main`` app, over every run of its
    pipelines too (``statistics`` are the last run's)."""
    refused: int = 0
    """Of those, items sinks on ranks > 0 forwarded that rank 0's session refused, past
    ``frames`` (sinks on several ranks together past it): counted ``out`` by their sinks, sent
    nowhere; ``egressed - refused`` reached the session."""
    run_id: str = ""
    """The run's id, the same on every rank (the ``run`` of its timing lines); for a ``main``
    app, whose pipelines' runs each have their own (``Pipeline.run_id``), the last run of the
    pipeline it served; ``""`` when nothing ran."""

    @property
    def repeats(self) -> int:
        """Of ``egressed``, the idle repeats: items marked ``idle=True`` (a ``pace`` handing
        out its last frame again, no new one having come in time), over every rank's sinks;
        ``egressed - repeats`` were new frames. Both are frames of the stream (and of an
        ``out`` video); ``frames`` counts both. For a ``main`` app, the last run's (as
        ``statistics``)."""
        return sum(repeated(stages) for stages in self.statistics.values())


@dataclass(frozen=True)
class LaunchOptions:
    """How a launch runs, past its app and rank count: ``launch``'s keyword arguments, once.

    :func:`~rxstream.launch` and :func:`~rxstream.distributed.launch_torchrun` make one of
    their arguments and hand it on; a spawned rank gets :meth:`for_ranks`' copy, the torchrun
    control plane the whole. Their meaning is documented on ``launch`` (docs/api.md).
    """

    frames: int | None = None
    config: Mapping[str, Any] | None = None
    timeout: float | None = None
    settings: tuple[str, ...] = ()
    serving: Mapping[str, Any] | None = None
    transport: Transport | None = None
    out: str | Path | None = None
    out_stream: str | None = None
    log: str | Path | None = None
    on_open: Callable[[], None] | None = None
    on_status: Callable[[Statistics], None] | None = None
    quiet: bool = False
    stop: threading.Event | None = None
    otel: bool = False
    metrics_port: int | None = None

    def for_ranks(self) -> "LaunchOptions":
        """What a spawned rank needs of them (it pickles): no callables, transport or event;
        ``config`` and ``settings`` are rank 0's (the others get its docs)."""
        return LaunchOptions(
            frames=self.frames,
            serving=None if self.serving is None else dict(self.serving),
            log=None if self.log is None else str(self.log),
            quiet=self.quiet,
        )
