"""Generations: the control state that makes steers and flushes cut over cleanly.

``prompt`` counts steers; items stamped with a ``prompt_generation`` below ``drop`` are stale
and dropped at their next hop. ``flush`` counts flushes; a stage with ``reset()`` resets when
it first sees an item of a newer flush generation. Sources stamp all three on every item.

Both rules are written here once: :meth:`Generations.is_stale`, and :class:`Admission`, the
checks an item meets on arriving at a stage (the threaded port and the fused drive path alike).
The per-item quick test that finds nothing to do (no cutover to count, no newer flush, not
stale) is written out where a call an item counts: :meth:`Admission.admitting` (a port's
closure), a pipe's ``on_next`` behind its own port (:class:`Admitted`), the fused chain's quick
path (``runtime/_fuse.py``) and a run's tail (``runtime/_run.py``); anything else goes to
:meth:`Admission.admit`. tests/test_admission.py drives every branch through the port and the
pipe, and tests/test_pipe_step.py (hypothesis) holds the fused chain to the pipe's outputs
and books.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from reactivex import Observable, abc

from rxstream.item import PipelineItem, PipelineMetadata, _base

__all__ = ["Admission", "Admitted", "GenerationState", "Generations"]


@dataclass(frozen=True)
class GenerationState:
    """The generations at one moment."""

    prompt: int = 0
    """Steers so far: the ``prompt_generation`` new items get."""
    flush: int = 0
    """Flushes so far: the ``flush_generation`` new items get."""
    drop: int = 0
    """Items with a ``prompt_generation`` below this are stale."""


class Generations:
    """The live generation counters of one context (one writer lock, lock-free reads)."""

    __slots__ = ("_lock", "drop", "epoch", "flush", "listeners", "prompt", "steered_at")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt = 0
        self.flush = 0
        self.drop = 0
        self.epoch = 0
        """Counts every change (steer, flush, replica): one compare tells "nothing changed"."""
        self.steered_at = 0.0
        """When the last steer happened (``time.monotonic``): the origin of cutover timing."""
        self.listeners: list[Callable[[GenerationState], None]] = []
        """Called with the new state after every steer or flush (the launcher replicates)."""

    def __repr__(self) -> str:
        return f"<Generations prompt={self.prompt} flush={self.flush} drop={self.drop}>"

    def is_stale(self, metadata: PipelineMetadata) -> bool:
        """Whether an item of ``metadata`` is stale: of a prompt generation a steer dropped."""
        return metadata.prompt_generation < self.drop

    def steer(self, *, drop_stale: bool = True) -> int:
        """Start a new prompt generation; unless ``drop_stale=False`` older items go stale."""
        with self._lock:
            self.steered_at = time.monotonic()
            self.epoch += 1
            self.prompt += 1
            if drop_stale:
                self.drop = self.prompt
            prompt = self.prompt
        self._tell()
        return prompt

    def bump_flush(self) -> int:
        """Start a new flush generation."""
        with self._lock:
            self.flush += 1
            self.epoch += 1
            flush = self.flush
        self._tell()
        return flush

    def _tell(self) -> None:
        if self.listeners:
            state = self.state()
            for listener in tuple(self.listeners):
                listener(state)

    def replicate(self, state: "GenerationState", steered_at: float) -> None:
        """Take the controller's generations (on another rank of the same host)."""
        with self._lock:
            self.steered_at = steered_at
            self.epoch += 1
            self.prompt = max(self.prompt, state.prompt)
            self.flush = max(self.flush, state.flush)
            self.drop = max(self.drop, state.drop)

    def _rewind(self, state: "GenerationState", steered_at: float) -> None:
        """Put the counters back to ``state`` (taken with :meth:`state` and ``steered_at``
        before a self test): the run after it starts as it would have without it.

        Listeners are not told (a replica only moves forward: nothing listens yet when a
        self test ends before its run starts); ``epoch`` still moves on, as on every change.
        """
        with self._lock:
            self.steered_at = steered_at
            self.epoch += 1
            self.prompt, self.flush, self.drop = state.prompt, state.flush, state.drop

    def state(self) -> "GenerationState":
        """The counters now, frozen."""
        with self._lock:
            return GenerationState(self.prompt, self.flush, self.drop)


class _Counters(Protocol):
    """What admission counts on a stage's counters."""

    cutovers: int

    def drop(self, reason: str, count: int = 1) -> None: ...


class _Stage(Protocol):
    """What admission reads of a stage (its shell)."""

    @property
    def generations(self) -> Generations: ...

    @property
    def counters(self) -> _Counters: ...

    @property
    def reset(self) -> Callable[[], object] | None: ...


class Admission:
    """One stage's checks on an item's arrival, for one subscription of the stage.

    A stale item is dropped (counted, reason ``stale``); a cutover is counted; the first item
    of a newer flush generation than this subscription has seen resets the stage (its
    ``reset``, read then: a ``doc.bind`` sets it late).
    """

    __slots__ = ("_counters", "_flushed", "_generations", "_stage")

    def __init__(self, stage: _Stage) -> None:
        self._stage = stage
        self._generations = stage.generations
        self._counters = stage.counters
        self._flushed = self._generations.flush

    def admit(self, metadata: PipelineMetadata) -> bool:
        """Whether an item of ``metadata`` (its base will do) goes on into the stage."""
        if self._generations.is_stale(metadata):
            self._counters.drop("stale")
            return False
        if metadata.cutover:
            self._counters.cutovers += 1
        if metadata.flush_generation > self._flushed:
            self._flushed = metadata.flush_generation
            reset = self._stage.reset
            if reset is not None:
                reset()
        return True

    @property
    def flushed(self) -> int:
        """The newest flush generation this subscription has admitted (or the context's at
        its start)."""
        return self._flushed

    def admitting(self, on_next: Callable[[PipelineItem], None]) -> Callable[[PipelineItem], None]:
        """``on_next`` behind these checks: an item goes on when :meth:`admit` lets it in.

        A routine item (no cutover, no newer flush, not stale) costs one compare chain on its
        base metadata, written out here, no further call; any other goes through
        :meth:`admit` (a port's per-item path: ``bench/hop_parts.py``'s admission row).
        """
        generations = self._generations
        admit = self.admit
        flushed = self._flushed

        def admitted(item: PipelineItem) -> None:
            nonlocal flushed
            base = _base(item)
            if (
                base.cutover
                or base.flush_generation > flushed
                or base.prompt_generation < generations.drop
            ):
                if not admit(base):
                    return
                flushed = self._flushed
            on_next(item)

        return admitted


Unadmitted = Callable[
    [
        Callable[[PipelineItem], None],
        Callable[[Exception], None],
        Callable[[], None],
        abc.SchedulerBase | None,
    ],
    abc.DisposableBase,
]
"""How an :class:`Admitted` stream hands on its items unchecked: ``(on_next, on_error,
on_completed, scheduler)``, the subscription returned."""


class Admitted(Observable[PipelineItem]):
    """A stage's input whose items meet the stage's :class:`Admission` on arrival (a port's
    stream, :mod:`rxstream.runtime._port`).

    An operator of the same ``stage`` that makes the checks itself, inline in its own per-item
    call (a pipe's ``on_next``), subscribes through :meth:`unadmitted` instead and gets each
    item as it arrives, on the same thread, before any check: one Python call an item and a
    stage fewer (docs/decisions.md, "A pipe admits its items itself").
    """

    def __init__(
        self,
        subscribe: Callable[[abc.ObserverBase[PipelineItem], abc.SchedulerBase | None], Any],
        unadmitted: Unadmitted,
        stage: object,
    ) -> None:
        super().__init__(subscribe)
        self.stage = stage
        """The stage (its shell) whose admission the stream's subscribers get."""
        self.unadmitted = unadmitted
        """Subscribe ``(on_next, on_error, on_completed, scheduler)`` to the items unchecked:
        the subscriber makes the stage's admission itself (:meth:`Admission.admit`)."""
