"""What a stage's scheduler is to the kernel: reactivex's scheduler over a float-second clock.

The stage shell and the operators schedule on this base; its two kinds, a stage's own thread
(``StageThread``) and a drive's ``VirtualClock``, are the runtime's (``runtime/_thread.py``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from reactivex import abc, typing
from reactivex.scheduler.periodicscheduler import PeriodicScheduler

__all__ = ["_ClockScheduler", "_Timer"]

_TState = TypeVar("_TState")


class _Timer:
    """One scheduled action: cancellable, run once."""

    __slots__ = ("action", "cancelled", "scheduler", "state")

    def __init__(
        self, scheduler: abc.SchedulerBase, action: typing.ScheduledAction[Any], state: Any
    ) -> None:
        self.scheduler = scheduler
        self.action = action
        self.state = state
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def run(self) -> None:
        if not self.cancelled:
            self.action(self.scheduler, self.state)


class _ClockScheduler(PeriodicScheduler):
    """What both stage schedulers share: float-second clocks behind reactivex's datetimes."""

    def clock(self) -> float:
        """Seconds on this scheduler's clock (monotonic, or virtual under ``drive``)."""
        raise NotImplementedError

    @property
    def now(self) -> datetime:
        return self.to_datetime(self.clock())

    driven = False
    """Whether this is a drive's virtual clock (one thread, virtual time)."""

    def set_accepting(self, accepting: bool) -> None:
        """Whether the stage takes new items from its inbox (``pace`` closes it when full)."""

    _timer: type[_Timer] = _Timer
    """What the ``schedule*`` methods make (the virtual clock counts its timers)."""

    def schedule(
        self, action: typing.ScheduledAction[_TState], state: _TState | None = None
    ) -> abc.DisposableBase:
        return self._at(self.clock(), self._timer(self, action, state))

    def schedule_relative(
        self,
        duetime: typing.RelativeTime,
        action: typing.ScheduledAction[_TState],
        state: _TState | None = None,
    ) -> abc.DisposableBase:
        return self._at(self.clock() + self.to_seconds(duetime), self._timer(self, action, state))

    def schedule_absolute(
        self,
        duetime: typing.AbsoluteTime,
        action: typing.ScheduledAction[_TState],
        state: _TState | None = None,
    ) -> abc.DisposableBase:
        return self._at(self.to_seconds(duetime), self._timer(self, action, state))

    def schedule_idle(
        self,
        duetime: float,
        action: typing.ScheduledAction[_TState],
        state: _TState | None = None,
    ) -> abc.DisposableBase:
        """``schedule_absolute`` for an action that only keeps a stage ticking with nothing
        new to do (a pace's idle repeat): a drive does not run its clock on for it."""
        return self.schedule_absolute(duetime, action, state)

    def _at(self, due: float, timer: _Timer) -> abc.DisposableBase:
        raise NotImplementedError
