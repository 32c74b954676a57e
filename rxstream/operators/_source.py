"""``ctx.source``: what a source yields, pulled one item at a time.

Every item a source makes is stamped with the context's current generations; the first item
of a new prompt generation (after a steer) is marked ``cutover=True``. A source that yields
:class:`~rxstream.item.PipelineItem` s sets all of its metadata itself.

A source spec is one of: an iterable (a fresh ``iter()`` per run), an iterator or generator
(one-shot), an async iterator or async generator, or a callable. A callable is called once at
open: if it returns an iterator (a generator function) or an async iterator, that is the
stream; otherwise it is a frame function — its result is the first payload and it is called
again for every further item. An ``async def`` frame function is awaited on the pipeline's
loop. The runtime decides who pulls (the source's thread, or the drive's virtual clock).

A source whose first payload is a list or tuple of frames (two or more arrays or tensors of
one shape and dtype, at least 2-D) logs one warning naming it (the hint is its message; its
``code`` is ``source_payload_is_a_batch``):
the whole list is one payload (and a frame function's list repeats on every pull), which is
rarely what was meant. A source that feeds a ``ctx.unbatch()`` means it, and is not warned.

A source that reads inputs (``reads=``: their newest sample, ``input.latest()``) makes items
that carry the correlation of the sample it read during the pull (the newest read, when it
read several): its ``input_seq`` and ``input_at_ms``, and the timeline starts at that
sample's ``input.recv``, the source's ``.in`` at the read. So its sink writes one timing
record per sample that reached it, as for an input's items. A pull that read nothing makes
an item without correlation (``input_seq`` 0), as any source's: only a ``latest()`` made by
the pull itself counts (on its thread, or in the coroutine it awaits), not one by another
source that reads the same input, nor by a pipe or tap.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np

from rxstream._exceptions import PipelineError, StageBuildError
from rxstream._kernel._kind import StageKind
from rxstream._kernel._options import SourceOptions
from rxstream._kernel._shell import StageShell
from rxstream._kernel._stats import StageCounters
from rxstream._util import library_logger
from rxstream.item import (
    PipelineItem,
    _item,
    _sourced,
    _trusted_metadata,
    _with_stamps,
    now,
)
from rxstream.operators._input import READING, InputFeed, InputSample, PullReads

__all__ = ["SKIPPED", "SOURCE_KIND", "SourcePuller", "batch_hint", "check_source"]

SOURCE_KIND = StageKind("source", "source", options=SourceOptions)
"""A source: its pulls make the items."""

_log = library_logger("rxstream")

_END = object()
_NONE_WAITING = object()  # a driven input with no sample queued: nothing now, not the end
SKIPPED: Any = object()
"""What :meth:`SourcePuller.pull` returns for a pull that failed under ``on_error="skip"``."""


def check_source(spec: object, name: str) -> None:
    """Raise a :class:`StageBuildError` naming the stage when ``spec`` cannot be a source."""
    if not (callable(spec) or isinstance(spec, Iterable | AsyncIterable)):
        raise StageBuildError(
            "a source must be an iterable, an iterator, an async iterator or a callable, "
            f"got {type(spec).__name__} for stage {name!r}"
        )


def batch_hint(payload: object, name: str, *, returned: bool) -> str | None:
    """The hint for a source ``name`` whose payload is a list or tuple of frames (see the
    module docstring), else ``None``; ``returned``: the source is a frame function."""
    if not isinstance(payload, list | tuple) or len(payload) < 2:
        return None
    torch = sys.modules.get("torch")
    kinds = (np.ndarray,) if torch is None else (np.ndarray, torch.Tensor)
    first = payload[0]
    if not isinstance(first, kinds) or first.ndim < 2:
        return None
    shape, dtype = tuple(first.shape), first.dtype
    if not all(
        isinstance(value, kinds) and tuple(value.shape) == shape and value.dtype == dtype
        for value in payload
    ):
        return None
    what = f"a {type(payload).__name__} of {len(payload)} {type(first).__name__}s"
    if returned:
        return (
            f"source {name!r} returned {what} as one payload, which repeats on every pull; "
            "return iter(...) of it or yield each frame to send them one by one, or put "
            "ctx.unbatch() after the source"
        )
    return (
        f"source {name!r} yielded {what} as one payload; yield each frame (yield from it) "
        "to send them one by one, or put ctx.unbatch() after the source"
    )


class SourcePuller:
    """Pulls one item at a time from a source spec, stamping ``<name>.in``/``.out``.

    ``hint``: look at the first payload for a batch sent as one (a ``source_payload_is_a_batch``
    warning); the run turns it off for a source that feeds an unbatch. ``counts``: the inputs
    of ``reads`` that no stage of the run takes and whose refusals this source counts
    (:meth:`~rxstream.operators._input.InputFeed.read_by`).
    """

    def __init__(
        self,
        spec: object,
        shell: StageShell,
        reads: tuple[InputFeed, ...] = (),
        *,
        hint: bool = True,
        counts: tuple[InputFeed, ...] = (),
    ) -> None:
        self._spec = spec
        self._reads = PullReads(reads) if reads else None
        """What the inputs the source reads (``ctx.source(reads=)``) hand out in a pull."""
        self._shell = shell
        self._hint = hint
        self._next: Callable[[], Any] = _exhausted
        self._count = 0
        self._closer: Callable[[], Any] | None = None
        self._prompt = shell.generations.prompt
        # what every pull reads, looked up once (fixed for the run)
        self._counters = shell.counters
        self._generations = shell.generations
        self._timing = shell.timing
        self._in_hop, self._out_hop = shell.in_hop, shell.out_hop
        self.waits = isinstance(spec, InputFeed)
        """Whether pulls may wait for client samples (:meth:`take_waited` has something)."""
        if isinstance(spec, InputFeed):
            spec.attach(shell.counters)  # refusals and queue drops count on this run's stage
            if not shell.driven:  # a new run (start()) gives every client a fresh budget
                spec.new_run()
        for feed in counts:  # only read: newest sample only, refusals on this stage
            feed.read_by(shell.counters)
        if not shell.driven:
            for feed in reads:  # and the inputs a source reads too
                feed.new_run()

    @property
    def counters(self) -> StageCounters:
        """The source stage's counters."""
        return self._shell.counters

    def open(self) -> None:
        """Prepare the stream; a failure here is a :class:`PipelineError` naming the source."""
        try:
            self._next = self._open(self._spec)
        except Exception as exc:
            raise PipelineError(self._shell.name, exc) from exc
        if self._hint and not isinstance(self._spec, InputFeed):
            self._next = self._first(self._next)

    def _first(self, pull: Callable[[], Any]) -> Callable[[], Any]:
        """``pull``, whose first payload is looked at for a batch sent as one (then only
        ``pull``: the per-item path has no check)."""
        returned = inspect.iscoroutinefunction(self._spec)  # an async frame function

        def first() -> Any:
            self._next = pull  # before the call: a frame function's `once` sets its own next
            value = pull()
            payload = value.payload if isinstance(value, PipelineItem) else value
            self._warn(payload, returned=returned)
            return value

        return first

    def _warn(self, payload: object, *, returned: bool) -> None:
        hint = batch_hint(payload, self._shell.name, returned=returned)
        if hint is not None:
            _log.warning(hint, stage=self._shell.name, code="source_payload_is_a_batch")

    def _open(self, spec: Any) -> Callable[[], Any]:
        shell = self._shell
        if isinstance(spec, InputFeed):
            spec.open()
            if shell.driven:  # a drive takes what waits; an empty queue is not the end
                return lambda: spec.take(False) or _NONE_WAITING
            return lambda: spec.take(True) or _END
        if inspect.iscoroutinefunction(spec):
            return lambda: shell.call_async(spec())
        if isinstance(spec, Iterator | AsyncIterator):
            return self._stream(spec)
        if isinstance(spec, AsyncIterable):
            return self._stream(spec.__aiter__())
        if isinstance(spec, Iterable):
            return self._stream(iter(spec))
        result = spec()
        if isinstance(result, Iterator | AsyncIterator):
            return self._stream(result)
        if self._hint:
            self._hint = False  # the result is the first payload: looked at here, once
            self._warn(result, returned=True)
        return self._then(result, spec)

    def _then(self, first: Any, rest: Callable[[], Any]) -> Callable[[], Any]:
        """A frame function's stream: ``first`` (its result at open), then ``rest()`` a pull."""

        def once() -> Any:
            self._next = rest
            return first

        return once

    def _stream(self, stream: Any) -> Callable[[], Any]:
        if isinstance(stream, AsyncIterator):
            shell = self._shell
            self._closer = getattr(stream, "aclose", None)
            if self._closer is not None:
                aclose = self._closer
                self._closer = lambda: shell.call_async(aclose())

            async def step() -> Any:
                try:
                    return await stream.__anext__()
                except StopAsyncIteration:
                    return _END

            def anext() -> Any:
                return shell.call_async(step())

            return anext
        self._closer = getattr(stream, "close", None)
        iterator: Iterator[Any] = stream
        return partial(next, iterator, _END)  # a C call: no Python frame per pull

    def pull(self) -> PipelineItem | None:
        """The next item, ``None`` when the source is exhausted, or :data:`SKIPPED`
        (also: a driven input that has no sample waiting).

        With ``on_error="skip"`` a failed pull is counted (``failed_pulls``: it made no item,
        so it drops none), logged, and :data:`SKIPPED` returned (a generator that raised is
        finished, so the next pull ends it); otherwise the failure is a
        :class:`PipelineError` naming the source and the item's ``pts``.
        """
        started = now()
        reads = self._reads
        if reads is not None:
            reads.read = None
            token = READING.set(reads)
        try:
            value = self._next()
        except Exception as exc:
            shell = self._shell
            if shell.on_error == "skip":
                shell.skipped(exc, pts=self._count, input_seq=0, dropped=False)
                return SKIPPED  # type: ignore[no-any-return]
            raise PipelineError(shell.name, exc, pts=self._count, input_seq=0) from exc
        finally:
            if reads is not None:
                READING.reset(token)
        if value is _END:
            return None
        if value is _NONE_WAITING:
            return SKIPPED  # type: ignore[no-any-return]
        counters = self._counters
        counters.items_in += 1
        if isinstance(value, PipelineItem):
            shell = self._shell
            if value.metadata.cutover:  # the item's own cutover: counted here as downstream
                counters.cutovers += 1
            metadata = _with_stamps(value.metadata, shell.stamps(started))
            self._count += 1
            return shell.emit(value.payload, metadata)
        gens = self._generations
        prompt = gens.prompt
        cutover = prompt > self._prompt
        input_seq = input_at_ms = 0
        origin: tuple[Any, ...] = ()  # flat: hop, t
        if isinstance(value, InputSample):
            started = now()  # the wait for a sample is the input queue's, before .in
            input_seq = value.input_seq
            input_at_ms = value.input_at_ms if input_seq else 0
            origin = ("input.recv", value.received)
            value = value.payload
        elif reads is not None and (read := reads.read) is not None:
            sample = read.sample  # the input's sample this pull read: its correlation
            input_seq, input_at_ms = sample.input_seq, sample.input_at_ms
            origin = ("input.recv", sample.received)
            started = max(started, read.at)  # its wait for this pull is the source's wait
        elif cutover:  # a steer during this pull counts from the pull's start
            origin = ("steer", min(gens.steered_at, started))
        self._prompt = prompt
        if cutover:  # the source's own cutover counts here too, as at every stage it reaches
            counters.cutovers += 1
        count = self._count
        self._count = count + 1
        counters.items_out += 1
        if not self._timing:
            metadata = _trusted_metadata(  # the frozen __init__ is slow per item
                prompt,
                gens.flush,
                cutover,
                gens.drop,
                count,
                False,
                None,
                input_seq,
                input_at_ms,
                (),
            )
            return _item(value, metadata)
        # the item, its metadata and its chain's first link made in one call
        return _sourced(
            value,
            prompt,
            gens.flush,
            cutover,
            gens.drop,
            count,
            input_seq,
            input_at_ms,
            origin,
            self._in_hop,
            started,
            self._out_hop,
            now(),
        )

    def take_waited(self) -> float:
        """Seconds the last pulls spent waiting for client samples (idle, not work)."""
        spec = self._spec
        if not isinstance(spec, InputFeed):
            return 0.0
        waited, spec.waited = spec.waited, 0.0
        return waited

    def interrupt(self) -> None:
        """Wake a pull that waits for a client sample (the run is stopping)."""
        if isinstance(self._spec, InputFeed):
            self._spec.close()

    def close(self) -> None:
        """Close the underlying generator, if it has a ``close``; errors are ignored."""
        closer, self._closer = self._closer, None
        if closer is not None:
            # closing a finished generator must not mask how the run ended
            with contextlib.suppress(Exception):
                closer()


def _exhausted() -> Any:
    return _END
