"""A stage's input side: admission on arrival, and the hand-off onto the stage's scheduler.

Every input of a stage goes through one :class:`Port` (a threaded run's
:class:`InboxPort` puts each item into the stage's bounded inbox, to be admitted on the
stage's thread; a driven run's plain :class:`Port` admits it in the caller's call). The checks
are :class:`~rxstream._kernel._generations.Admission`'s, the same ones a fused drive chain makes
(:mod:`rxstream.runtime._fuse`): a stale item is dropped (reason ``stale``), a cutover is
counted, the first item of a newer flush generation resets the stage.

A port's stream is an :class:`~rxstream._kernel._generations.Admitted`: a pipe of the same
stage takes the items through its ``unadmitted`` hand-off, unchecked, and makes the checks
first in its own ``on_next`` (:mod:`rxstream.operators._pipe`; one call an item fewer).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from reactivex import abc

from rxstream._kernel._generations import Admitted
from rxstream._kernel._shell import StageShell
from rxstream.item import PipelineItem
from rxstream.operators._core import attach
from rxstream.runtime._thread import StageThread
from rxstream.typing import ItemStream

__all__ = ["InboxPort", "Port"]


class Port:
    """The hop into one stage: each subscription admits what arrives, then hands it on.

    This one hands off directly, in the upstream's call (a driven run: one clock, no threads).
    """

    __slots__ = ("shell",)

    def __init__(self, shell: StageShell) -> None:
        self.shell = shell

    def __call__(self, upstream: ItemStream) -> ItemStream:
        """``upstream`` as the stage receives it: admitted, on the stage's scheduler (or, for
        an operator that admits them itself, :meth:`Admitted.unadmitted`, only the latter)."""
        shell = self.shell
        hand_off = self._hand_off

        def subscribe(
            observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            admit = shell.admission().admitting(observer.on_next)
            return hand_off(upstream, admit, observer.on_error, observer.on_completed, scheduler)

        def unadmitted(
            on_next: Callable[[PipelineItem], None],
            on_error: Callable[[Exception], None],
            on_completed: Callable[[], None],
            scheduler: abc.SchedulerBase | None = None,
        ) -> abc.DisposableBase:
            return hand_off(upstream, on_next, on_error, on_completed, scheduler)

        return Admitted(subscribe, unadmitted, shell)

    def _hand_off(
        self,
        upstream: ItemStream,
        admit: Callable[[PipelineItem], None],
        on_error: Callable[[Exception], None],
        on_completed: Callable[[], None],
        scheduler: abc.SchedulerBase | None,
    ) -> abc.DisposableBase:
        return attach(upstream, admit, on_error, on_completed, scheduler)


class InboxPort(Port):
    """The hop into a stage with its own thread: every item, error and completion goes into
    the stage's bounded inbox and is admitted on the stage's thread (a threaded run)."""

    __slots__ = ("thread",)

    def __init__(self, shell: StageShell, thread: StageThread) -> None:
        super().__init__(shell)
        self.thread = thread

    def _hand_off(
        self,
        upstream: ItemStream,
        admit: Callable[[PipelineItem], None],
        on_error: Callable[[Exception], None],
        on_completed: Callable[[], None],
        scheduler: abc.SchedulerBase | None,
    ) -> abc.DisposableBase:
        put_control = self.thread.put_control
        return attach(
            upstream,
            partial(self.thread.put, admit),  # a C call: no Python frame per item
            lambda error: put_control(on_error, error),
            lambda: put_control(_complete, on_completed),
            scheduler,
        )


def _complete(on_completed: Callable[[], None]) -> None:
    on_completed()
