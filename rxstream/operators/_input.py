"""``ctx.input(name)``: a client-fed stream (mouse, keys, audio chunks…).

``feed(sample, at_ms=None, client=None)`` (from any thread: the transport, a test,
``pipeline.feed``) checks the sample, stamps the receive time and the per-stream ``input_seq``
(from 1) and queues it; the input stage's source pulls it. ``input_at_ms`` is the client's
timestamp when it sent one, else the receive time (wall clock, ms). The first stamp of the
item is ``input.recv``.

A sample passes three gates, in order, and one it fails is refused with a
:class:`~rxstream.topology.SampleRefused` (nothing queued, charged or numbered; nothing else
affected): its ``at_ms`` (``None`` or a finite number) and the stream's schema
(:class:`~rxstream.topology.InvalidSample`), its ``item_size`` (a finite number >= 0, also
``InvalidSample``), then the limit: the client's budget for this run
(:class:`~rxstream.topology.ClientStreamLimitExceeded`). Each client (``client``: any hashable
the transport picks per connection; ``None`` for a local caller) has its own budget, and
:meth:`InputFeed.new_run` gives every client a fresh one.

A source may read the stream's newest sample instead of taking each one (``latest``: "the
pointer now", for a world model's tick): ``ctx.source(tick, reads=pointer)``, and in ``tick``
``pointer.latest()``. The source's item carries the correlation of the sample it read in that
pull (see :mod:`rxstream.operators._source`): a ``latest()`` call counts for the pull that
made it, on that pull's own thread (or in the coroutine the pull awaits), never for another
source's pull or for a pipe or tap that calls ``latest()`` meanwhile (:class:`PullReads`).

Refusals are counted on the input stage (dropped, reasons ``invalid`` and ``limit``), as are
samples dropped from the full queue (``latest``): what was offered is what the stage pulled,
plus what it dropped, plus what still waits.

An input only read (``reads=``, no input stage in the run's graph: :meth:`InputFeed.read_by`)
queues nothing: it keeps only its newest sample, so none waits and none is dropped from a
queue (a sample a newer one replaced was simply not the newest when read), and its
refusals count on the first source that reads it (dropped, ``invalid`` and ``limit``), the
row a user sees. A later run that has the input as a stage starts with an empty queue and
no drops of the run that only read it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Hashable, Iterable
from contextvars import ContextVar
from typing import Any, NamedTuple

from rxstream._kernel._kind import StageKind
from rxstream._kernel._options import InputOptions
from rxstream._kernel._stats import StageCounters
from rxstream.item import now
from rxstream.topology import ClientStreamLimitExceeded, ClientStreamLimits, InvalidSample
from rxstream.topology._samples import SampleCheck, check_sample, compile_schema

__all__ = ["INPUT_KIND", "READING", "InputFeed", "InputSample", "PullReads", "SampleRead"]

INPUT_KIND = StageKind("input", "source", options=InputOptions)
"""An input: what ``feed`` accepted, pulled."""

_MAX_AT_MS = 2.0**53
"""The largest ``at_ms`` taken (ms; beyond it a JSON number is no longer exact)."""
_MAX_SIZE = 1.0e300
"""The largest ``item_size`` taken (any finite bound a limit can have is far below it)."""


class InputSample(NamedTuple):
    """One fed sample, as queued for the input stage."""

    payload: Any
    input_seq: int
    input_at_ms: int
    received: float


class SampleRead(NamedTuple):
    """A sample :meth:`InputFeed.latest` handed out, and when (``now()``, seconds)."""

    sample: InputSample
    at: float


class PullReads:
    """What :meth:`InputFeed.latest` handed out during one pull of a reading source.

    The source's puller sets it in :data:`READING` around each pull; ``latest()`` notes the
    sample it hands out only when the calling context has one set and it names the input
    (``feeds``, the source's ``reads=``): a contextvar, so a ``latest()`` on another thread
    (another source's pull, a pipe, a tap) is never this pull's, and a coroutine the pull
    awaits on the pipeline's loop (an async source) is.
    """

    __slots__ = ("feeds", "read")

    def __init__(self, feeds: Iterable[InputFeed]) -> None:
        self.feeds = frozenset(feeds)
        self.read: SampleRead | None = None
        """The newest sample (by receive time) read during the pull so far, and when."""


READING: ContextVar[PullReads | None] = ContextVar("rxstream_reading", default=None)
"""The pull of a reading source now running in this context, if any (see :class:`PullReads`)."""


class _Budgets:
    """What each client has spent this run; a client object that goes away takes its entry."""

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._plain: dict[Hashable, float] = {}

    def _table(self, client: Hashable) -> Any:
        try:
            weakref.ref(client)
        except TypeError:
            return self._plain
        return self._weak

    def used(self, client: Hashable) -> float:
        return float(self._table(client).get(client, 0.0))

    def charge(self, client: Hashable, size: float) -> None:
        table = self._table(client)
        table[client] = table.get(client, 0.0) + size

    def clear(self) -> None:
        self._weak.clear()
        self._plain.clear()


class InputFeed:
    """The queue between whoever feeds a client stream and the input stage that pulls it."""

    def __init__(
        self,
        name: str,
        limits: ClientStreamLimits | None,
        capacity: int,
        schema: object = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self.capacity = capacity
        self.schema = schema
        """What a sample must look like (see :mod:`rxstream.topology._samples`), or ``None``."""
        self._check: SampleCheck | None = None if schema is None else compile_schema(schema, name)
        self._cond = threading.Condition()
        self._queue: deque[InputSample] = deque()
        self._seq = 0
        self._budgets = _Budgets()
        self._closed = False
        self._counters: StageCounters | None = None
        self._pending: dict[str, int] = {}  # drops while no run's counters are attached
        self.accepted = 0
        """Samples queued since the run's counters attached (with those waiting then, and
        those the full queue dropped before)."""
        self.waited = 0.0
        """Seconds ``take`` has spent waiting for a sample (the stage's idle time)."""
        self._waiting = False
        self._newest: InputSample | None = None
        self._queues = True
        """Whether fed samples queue for an input stage (``False``: only read, see
        :meth:`read_by`)."""

    def latest(self, default: Any = None) -> Any:
        """The newest sample fed so far (taken or not), ``default`` before the first.

        Called in the pull of a source that reads this input, the sample is noted for that
        pull (:class:`PullReads`): the source's item takes its correlation (``input_seq``,
        ``input_at_ms``, ``input.recv``).
        """
        sample = self._newest  # one reference read: safe beside a concurrent feed
        if sample is None:
            return default
        pull = READING.get()
        if pull is not None and self in pull.feeds:
            read = pull.read
            if read is None or sample.received >= read.sample.received:
                pull.read = SampleRead(sample, now())
        return sample.payload

    @property
    def idle(self) -> bool:
        """Whether the input stage waits in :meth:`take` with nothing queued (every sample
        fed so far has been handed on)."""
        with self._cond:
            return self._waiting and not self._queue

    def feed(self, sample: Any, at_ms: float | None = None, client: Hashable = None) -> int:
        """Queue ``sample`` (``at_ms``: the client's clock, ms); returns its ``input_seq``.

        Raises :class:`~rxstream.topology.SampleRefused` for a sample it refuses (see the
        module docstring). When the queue is full the oldest waiting sample is dropped (input
        is real time).
        """
        received = now()
        wall_ms = int(time.time() * 1000)
        try:
            stamp = wall_ms if at_ms is None else self._at_ms(at_ms)
            if self._check is not None:
                check_sample(self.name, self._check, sample)
            size = self._size(sample)
        except InvalidSample:
            self._drop("invalid")
            raise
        with self._cond:
            if size is not None:
                limits = self.limits
                assert limits is not None
                assert limits.max_items is not None
                total = self._budgets.used(client) + size
                # sizes in seconds are summed in binary floats: allow for their rounding
                if total > limits.max_items * (1 + 1e-9):
                    self._drop("limit")
                    raise ClientStreamLimitExceeded(self.name, limits.max_items, limits.unit, total)
                self._budgets.charge(client, size)
            self._seq += 1
            queued = self._newest = InputSample(sample, self._seq, stamp, received)
            self.accepted += 1
            if not self._queues:  # only read: the newest sample is all that is kept
                return self._seq
            if len(self._queue) >= self.capacity:
                self._queue.popleft()
                self._drop("latest")
            self._queue.append(queued)
            self._cond.notify()
            return self._seq

    def _at_ms(self, at_ms: Any) -> int:
        if isinstance(at_ms, bool) or not isinstance(at_ms, int | float):
            raise InvalidSample(self.name, "at_ms", "must be a number of ms or None", at_ms)
        if not abs(at_ms) <= _MAX_AT_MS:  # NaN too; an int of any size compares exactly
            raise InvalidSample(
                self.name,
                "at_ms",
                f"must be a finite number of ms within ±{_MAX_AT_MS:.0f}",
                at_ms,
            )
        return int(at_ms)

    def _size(self, sample: Any) -> float | None:
        """What ``sample`` costs against the limit; ``None`` when the stream is unbounded."""
        limits = self.limits
        if limits is None or limits.max_items is None:
            return None
        if limits.item_size is None:
            return 1.0
        try:
            size = limits.item_size(sample)
        except Exception as exc:
            raise InvalidSample(
                self.name, "item_size(sample)", f"raised {type(exc).__name__}: {exc}"
            ) from None
        if (
            isinstance(size, bool)
            or not isinstance(size, int | float)
            or not 0 <= size <= _MAX_SIZE  # NaN fails too; an int of any size compares exactly
        ):
            raise InvalidSample(
                self.name, "item_size(sample)", "must be a finite number >= 0", size
            )
        return float(size)

    def _drop(self, reason: str) -> None:
        """Count one sample refused or dropped, on the run's counters (or until one attaches)."""
        with self._cond:  # not racing attach: a drop lands on one run or the next
            counters = self._counters
            if counters is None:
                self._pending[reason] = self._pending.get(reason, 0) + 1
                return
        counters.drop(reason)

    def attach(self, counters: StageCounters) -> None:
        """Count drops and refusals on ``counters`` (the input stage's, for this run) from now
        on, and what was dropped while none was attached."""
        with self._cond:
            self._counters = counters
            self._queues = True
            pending, self._pending = self._pending, {}
            # what waits, and what the full queue dropped meanwhile, counts on this run
            self.accepted = len(self._queue) + pending.get("latest", 0)
        for reason, count in pending.items():
            counters.drop(reason, count)

    def read_by(self, counters: StageCounters) -> None:
        """A run whose graph has no stage taking this input, only sources reading it: from
        now on keep only the newest sample (what waits from before is let go), and count
        refusals on ``counters`` (the first reading source's), with those made while none
        was attached."""
        with self._cond:
            self._counters = counters
            self._queues = False
            self._queue.clear()
            self.accepted = 0
            pending, self._pending = self._pending, {}
        for reason, count in pending.items():
            if reason != "latest":  # a queue nobody takes dropped nothing anyone would read
                counters.drop(reason, count)

    def new_run(self) -> None:
        """A run starts: every client's budget is fresh again, and :meth:`latest` has no
        sample until one is fed in this run."""
        with self._cond:
            self._budgets.clear()
            self._newest = None

    @property
    def depth(self) -> int:
        """Samples waiting to be pulled."""
        return len(self._queue)

    def take(self, block: bool) -> InputSample | None:
        """The next sample; ``None`` once closed (or, not blocking, when none is waiting)."""
        with self._cond:
            if not self._queue and block and not self._closed:
                started = time.perf_counter()
                self._waiting = True
                while not self._queue and not self._closed:
                    self._cond.wait()
                self._waiting = False
                self.waited += time.perf_counter() - started
            if not self._queue:
                return None
            return self._queue.popleft()

    def open(self) -> None:
        """Accept a new run (a feed closed by a previous run's stop reopens)."""
        with self._cond:
            self._closed = False

    def close(self) -> None:
        """Wake the stage waiting in :meth:`take`; it ends its stream."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
