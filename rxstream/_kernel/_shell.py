"""The stage shell: the cross-cutting work every stage's operator delegates to.

One shell per stage per run. It knows the stage's name and hop labels, its scheduler (a
:class:`~rxstream.runtime._thread.StageThread` or the drive's virtual clock), its counters, and
how a failure is handled; operators call it so that ``Stage`` stays a small declaration.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from reactivex import abc

from rxstream._exceptions import PipelineError
from rxstream._kernel._generations import Admission, Generations
from rxstream._kernel._scheduler import _ClockScheduler
from rxstream._kernel._stats import StageCounters
from rxstream._util import library_logger
from rxstream.item import (
    PipelineItem,
    PipelineMetadata,
    Timeline,
    _forward,
    _item,
    _stamped,
    now,
)
from rxstream.typing import OnError

__all__ = ["StageShell"]

_log = library_logger("rxstream")


class StageShell:
    """Stamps, counts and error routing for one stage in one run."""

    __slots__ = (
        "_call_async",
        "_fail",
        "counters",
        "driven",
        "forward",
        "generations",
        "gpu",
        "gpu_clock",
        "in_hop",
        "name",
        "on_error",
        "out_hop",
        "reset",
        "run_id",
        "scheduler",
        "stage_kinds",
        "stamps",
        "target_fn",
        "timing",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        scheduler: _ClockScheduler,
        on_error: OnError,
        fail: Callable[[BaseException], None],
        call_async: Callable[[Coroutine[Any, Any, Any]], Any],
        generations: Generations,
        reset: Callable[[], Any] | None = None,
        timing: bool = True,
    ) -> None:
        self.name = name
        self.in_hop = f"{name}.in"
        self.out_hop = f"{name}.out"
        self.scheduler = scheduler
        self.counters = StageCounters(name, kind)
        self.on_error = on_error
        self._fail = fail
        self._call_async = call_async
        self.generations = generations
        self.target_fn: Any = None
        """The stage's own function (a pipe's ``fn``), for operators that call it directly."""
        self.reset = reset
        self.stage_kinds: Mapping[str, str] = {}
        """Every stage of the run's plan (every rank's), by name: its kind (the run sets it;
        the sink reads which stage made a payload from an item's stamps)."""
        self.run_id = ""
        """The id of the run the shell is part of (``Run.run_id``; the sink writes it on its
        timing records)."""
        self.gpu: Any = None
        """The stage's ``timing.StageTimer`` (CUDA events and NVTX around its calls; the run
        sets it), or ``None``: its calls are not wrapped."""
        self.gpu_clock: Any = None
        """The run's ``timing.GpuClock`` when it has one (the sink resolves ``gpu_ms`` with it)."""
        self.driven = scheduler.driven
        """Whether this is a ``drive()``: one thread, virtual time."""
        self.timing = timing
        """Whether items get ``.in``/``.out`` stamps (decided once: the hot path never asks)."""
        self.forward: Callable[[PipelineItem, Any, float], PipelineItem] = (
            self._forward_stamped if timing else self._forward_unstamped
        )
        """The 1:1 rule: ``payload`` with the item's metadata and this stage's two stamps."""
        self.stamps: Callable[[float], Timeline] = self._stamps_on if timing else _no_stamps
        """This stage's ``.in`` stamp at the given start and its ``.out`` stamp now (or none)."""

    def _forward_stamped(self, item: PipelineItem, payload: Any, started: float) -> PipelineItem:
        """The 1:1 rule: ``payload`` with ``item``'s metadata and this stage's two stamps."""
        self.counters.items_out += 1
        return _forward(item, payload, self.in_hop, started, self.out_hop, now())

    def _forward_unstamped(self, item: PipelineItem, payload: Any, started: float) -> PipelineItem:
        self.counters.items_out += 1
        return _stamped(item, payload, ())

    def admission(self) -> Admission:
        """This stage's arrival checks (stale, cutover, flush reset), for one subscription."""
        return Admission(self)

    def emit(self, payload: Any, metadata: PipelineMetadata) -> PipelineItem:
        """An output whose metadata the operator built itself (1:N, N:1); counts it."""
        self.counters.items_out += 1
        return _item(payload, metadata)

    def _stamps_on(self, started: float) -> Timeline:
        """This stage's ``.in`` stamp at ``started`` and its ``.out`` stamp now (or none)."""
        return ((self.in_hop, started), (self.out_hop, now()))

    def failed(
        self,
        observer: abc.ObserverBase[PipelineItem],
        item: PipelineItem | None,
        exc: BaseException,
    ) -> None:
        """Route an exception from the stage's function (the ``on_error`` policy).

        The failing item (when there is one) is counted as dropped, reason ``error``, either
        way: ``skip`` then logs it and goes on; ``raise`` ends the run with a
        :class:`PipelineError` naming this stage and the item.
        """
        pts = None if item is None else item.metadata.pts
        input_seq = None if item is None else item.metadata.input_seq
        if self.on_error == "skip":
            self.skipped(exc, pts=pts, input_seq=input_seq, dropped=item is not None)
            return
        if item is not None:
            self.counters.drop("error")
        error = PipelineError(self.name, exc, pts=pts, input_seq=input_seq)
        self._fail(error)
        observer.on_error(error)

    def skipped(
        self,
        exc: BaseException,
        *,
        pts: int | None,
        input_seq: int | None,
        dropped: bool = True,
    ) -> None:
        """Log a failure of the stage's function that ``on_error="skip"`` lets pass.

        ``dropped``: an item was lost with it (counted, reason ``error``); otherwise nothing
        was (a source's pull that raised made no item: counted as a failed pull).
        """
        if dropped:
            self.counters.drop("error")
        else:
            self.counters.failed_pulls += 1
        _log.warning(
            "stage_item_skipped",
            stage=self.name,
            pts=pts,
            input_seq=input_seq,
            error=f"{type(exc).__name__}: {exc}",
        )

    def crashed(self, exc: BaseException) -> None:
        """The engine failed while running this stage: end the run naming the stage."""
        self._fail(exc if isinstance(exc, PipelineError) else PipelineError(self.name, exc))

    def call_async(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the pipeline's event loop and wait for its result."""
        return self._call_async(coroutine)


def _no_stamps(_started: float) -> Timeline:
    return ()
