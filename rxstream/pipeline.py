"""``Pipeline``: an immutable stage graph plus its lifecycle (start, stop, run, drive…).

Over ~600 lines on purpose: it is one public class, whose lifecycle calls share one lock and
one state (started, running, a drive's session), and splitting them would spread that state.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from reactivex import abc, operators

from rxstream._exceptions import (
    ArgumentError,
    PipelineStateError,
    StageBuildError,
    UnknownInputError,
)
from rxstream._kernel._options import StreamOptions, reads_of
from rxstream._kernel._stats import StageStatistics
from rxstream._util import library_logger
from rxstream.operators._input import InputFeed
from rxstream.runtime._aio import AsyncBridge
from rxstream.runtime._crossings import in_process_boundaries
from rxstream.runtime._driven import DrivenRun
from rxstream.runtime._plan import Plan, compile_plan
from rxstream.runtime._run import DoneEvent, Run
from rxstream.runtime._threaded import ThreadedRun
from rxstream.stage import Node, Stage
from rxstream.topology import PartitionTopology, topology_of
from rxstream.transport import Session

if TYPE_CHECKING:
    from rxstream.context import Context
    from rxstream.doc import Doc

__all__ = ["Pipeline"]

_log = library_logger("rxstream")

STOP_TIMEOUT = 0.45
"""Seconds ``stop()`` waits for threads to end (its bound is 0.5 s with every queue full)."""

_started: set[Pipeline] = set()
"""The pipelines whose threaded run is started and not yet stopped (any context; a run that
is over, completed or failed, still holds its context's transport until stopped)."""
_started_lock = threading.Lock()
_holders: weakref.WeakKeyDictionary[Context, Pipeline] = weakref.WeakKeyDictionary()
"""Per context, the pipeline that opened its transport last: only its stop() closes it (an
earlier pipeline's late stop() must not close the session of the one running now)."""


class RankRun(Protocol):
    """A run whose other ranks a launcher spawned (``rxstream run`` of a main app, N > 1)."""

    @property
    def run(self) -> ThreadedRun:
        """Rank 0's run: this process's stages."""

    @property
    def done(self) -> threading.Event:
        """Set once every rank has ended, or the run failed."""

    def start(self) -> None:
        """Replicate the docs to the ranks and watch them (before ``run.start()``)."""

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) once ``done``."""

    def stop(self) -> None:
        """Stop every rank, join it and release the rings (after ``run.stop``); idempotent."""


Launcher = Callable[["Pipeline", AsyncBridge], RankRun]
"""A context's launcher hook: spawns the other ranks of a pipeline's run, and makes rank 0's."""


class Pipeline:
    """A composed graph of stages and the runs made from it.

    Made by ``|``; composing further returns a new pipeline and leaves this one as it was.
    A pipeline runs threaded (:meth:`start`, :meth:`run`) or driven (:meth:`drive`), one run
    at a time.
    """

    def __init__(self, tails: tuple[Node, ...], context: Context) -> None:
        self._tails = tails
        self._context = context
        self._plan: Plan | None = None
        self._client_streams: dict[str, Stage] | None = None
        self._run: Run | None = None
        self._ranks: RankRun | None = None
        self._legacy: list[abc.DisposableBase] = []
        self._lifecycle = threading.RLock()  # start() and stop() from several threads
        self._over = DoneEvent()
        """Set once the threaded run has completed, failed or was stopped."""
        self._over.set()
        self._session_end: weakref.finalize[Any, Any] | None = None
        """Ends the driven session when this pipeline is collected (its ``doc.bind`` deps)."""

    # --- composition ------------------------------------------------------------------------

    @classmethod
    def of(cls, stage: Stage) -> Pipeline:
        """A pipeline of one stage."""
        return cls((Node(stage),), stage.context)

    @classmethod
    def fan_in(cls, heads: Sequence[Stage | Pipeline], stage: Stage | Pipeline) -> Pipeline:
        """``[a, b] | stage``: every head feeds ``stage`` (one port each, in list order)."""
        if not isinstance(heads, list | tuple) or not heads:
            raise StageBuildError(f"fan-in needs a non-empty list of stages, got {heads!r}")
        tails = []
        for head in heads:
            if not isinstance(head, Stage | Pipeline):
                raise StageBuildError(
                    f"fan-in takes stages and pipelines, got {type(head).__name__}"
                )
            tails.append((cls.of(head) if isinstance(head, Stage) else head)._tail("fan-in"))
        target = cls.of(stage) if isinstance(stage, Stage) else stage
        return target._attach(tuple(tails), heads_context=tails[0].stage.context)

    def __or__(self, other: Stage | Pipeline) -> Pipeline:
        if isinstance(other, Stage):
            other = Pipeline.of(other)
        if not isinstance(other, Pipeline):
            return NotImplemented
        return other._attach((self._tail("|"),), heads_context=self._context)

    def __ror__(self, left: Sequence[Stage | Pipeline]) -> Pipeline:
        return Pipeline.fan_in(left, self)

    def _tail(self, op: str) -> Node:
        if len(self._tails) != 1:
            raise StageBuildError(
                f"{op} needs a pipeline with one end, got one with {len(self._tails)} "
                f"({', '.join(repr(t.stage.name) for t in self._tails)})"
            )
        tail = self._tails[0]
        if tail.stage.is_sink:
            raise StageBuildError(
                f"sink {tail.stage.name!r} (ctx.stream) must end the pipeline; "
                "nothing can follow it"
            )
        return tail

    def _attach(self, feeds: tuple[Node, ...], heads_context: Context) -> Pipeline:
        """This pipeline with ``feeds`` plugged into its open head (the node with no input)."""
        if heads_context is not self._context:
            raise StageBuildError("stages of one pipeline must come from one Context")
        memo: dict[Node, Node] = {}
        opened = []

        def rebase(node: Node) -> Node:
            if node in memo:
                return memo[node]
            stage = node.stage
            if not node.inputs and not stage.is_source:
                count = len(feeds)
                if not stage.min_inputs <= count <= (stage.max_inputs or count):
                    wanted = (
                        f"{stage.min_inputs}"
                        if stage.min_inputs == stage.max_inputs
                        else f"{stage.min_inputs} or more"
                    )
                    raise StageBuildError(
                        f"stage {stage.name!r} ({stage.kind}) takes {wanted} input(s), got {count}"
                    )
                opened.append(node)
                fresh = Node(stage, feeds)
            else:
                fresh = Node(stage, tuple(rebase(up) for up in node.inputs))
            memo[node] = fresh
            return fresh

        tails = tuple(rebase(tail) for tail in self._tails)
        if not opened:
            first = self._tails[0].stage
            raise StageBuildError(
                f"stage {first.name!r} ({first.kind}) cannot take an input: "
                "nothing can feed a pipeline that starts with a source"
            )
        return Pipeline(tails, self._context)

    # --- the graph --------------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The checked, named graph (compiled once, on first use)."""
        if self._plan is None:
            self._plan = compile_plan(self._tails)
        return self._plan

    def topology(self) -> PartitionTopology:
        """The partitions (ranks), connections (rank boundaries) and client streams (inputs)
        of this pipeline; see :func:`rxstream.topology.topology_of`."""
        return topology_of(self)

    @property
    def stages(self) -> Mapping[str, Stage]:
        """The stages by their unique names, upstream first."""
        plan = self.plan
        return MappingProxyType({plan.names[node]: node.stage for node in plan.nodes})

    @property
    def context(self) -> Context:
        """The context whose builders made this pipeline's stages."""
        return self._context

    def __repr__(self) -> str:
        try:
            names = " | ".join(self.stages)
        except StageBuildError:
            names = "…"
        return f"<Pipeline {names}>"

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def config(self) -> Mapping[str, Any]:
        """The desired state of the control doc: ``start(**config)``, then every update."""
        return self._context.control.snapshot()

    @property
    def running(self) -> bool:
        """Whether a threaded run is started and still going (not completed, failed, stopped)."""
        return self.state == "running"

    @property
    def state(self) -> str:
        """Where the lifecycle is: ``"new"`` (never run), ``"driven"`` (``drive()`` made the
        last run), ``"running"``, ``"completed"`` (every end completed; ``wait()`` or
        ``stop()`` ends it), ``"failed"`` (a stage failed; ``wait()`` raises the error,
        ``stop()`` ends it) or ``"stopped"``."""
        run = self._run
        if run is None:
            return "new"
        if not isinstance(run, ThreadedRun):
            return "driven"
        if self._stopped:
            return "stopped"
        if run.error is not None:
            return "failed"
        return "completed" if self._over.is_set() else "running"

    @property
    def error(self) -> BaseException | None:
        """The error that ended the current (or last) threaded run, ``None`` if none did."""
        run = self._run
        return run.error if isinstance(run, ThreadedRun) else None

    @property
    def run_id(self) -> str | None:
        """The id of the current (or last) run, threaded or a driven session; ``None`` before
        the first. Every ``[timing:…]`` and ``[photon:…]`` line of that run carries it as
        ``run``, so that ``rxstream timing --run ID`` can tell runs of one log apart."""
        run = self._run
        return None if run is None else run.run_id

    _stopped = True

    def _refuse_live(self, call: str) -> None:
        """Refuse ``call`` while a threaded run is going or failed and not yet stopped; end a
        completed one (nothing of it is lost: its statistics stay readable until replaced)."""
        state = self.state
        if state == "running":
            raise PipelineStateError(f"{call} on a running pipeline: stop() it first")
        if state == "failed":
            raise PipelineStateError(
                f"{call} after the run failed: {self.error}; stop() it (or wait(), which "
                f"raises the error) first"
            )
        if state == "completed":
            self._stop_locked()

    def _forget_started(self) -> None:
        with _started_lock:
            _started.discard(self)

    def _refuse_shared_streams(self) -> None:
        """Refuse a start while another running pipeline of this context feeds a stream of
        this one (their items would interleave on it)."""
        mine = stream_names(self)
        for other in running_pipelines(self._context):
            shared = sorted(mine & stream_names(other))
            if shared:
                raise PipelineStateError(
                    f"start(): stream {shared[0]!r} is already fed by a running pipeline of "
                    f"this context ({other!r}); stop() that one first (in a notebook, "
                    "rxstream.notebook.stop_all() stops every started pipeline)"
                )

    def start(self, **config: Any) -> Pipeline:
        """Start the stage threads and return at once.

        ``config`` is the initial desired state: a write to the control doc (not a steer).
        """
        self._start(config, loop=None)
        return self

    def _start(
        self, config: Mapping[str, Any], loop: asyncio.AbstractEventLoop | None
    ) -> ThreadedRun:
        with self._lifecycle:  # a concurrent stop() stops what this starts, after it
            return self._start_locked(config, loop)

    def _start_locked(
        self, config: Mapping[str, Any], loop: asyncio.AbstractEventLoop | None
    ) -> ThreadedRun:
        self._refuse_live("start()")
        plan = self.plan
        self._refuse_shared_streams()
        self._end_session()  # a threaded run starts afresh, not where drives left off
        if config:
            self._context.control.set(config)
        launcher = self._context._launcher
        ranks = None if launcher is None else launcher(self, AsyncBridge(loop))
        if ranks is not None:  # the other ranks in their processes; this one's stages here
            run = ranks.run
        else:
            run = ThreadedRun(
                plan,
                bridge=AsyncBridge(loop),
                generations=self._context.generations,
                timing=self._context.timing,
                boundaries=in_process_boundaries(
                    cuda_api=self._context.cuda_api, spec=self._context.ring_spec
                ),
                busy_limit_s=self._context.busy_limit_s,
                cuda_api=self._context.cuda_api,
                nvtx=self._context.nvtx,
            )
        self._run, self._ranks = run, ranks
        self._stopped = False
        self._over = over = DoneEvent()
        (run if ranks is None else ranks).on_done(over.set)
        self._stop_finished_others()
        with _started_lock:
            _started.add(self)
        opened = False
        try:
            self._context.transport.open(self.session())
            opened = True
            with _started_lock:
                _holders[self._context] = self
            if ranks is not None:
                ranks.start()
            run.start()
        except BaseException:
            self._stopped = True
            over.set()
            if ranks is not None:
                run.stop(STOP_TIMEOUT)
                ranks.stop()
            if opened:
                self._release_transport()
            self._forget_started()
            raise
        return run

    def _stop_finished_others(self) -> None:
        """Stop the runs of this context that are over (completed or failed) but not stopped:
        they still hold its transport, which this start opens anew (their error stays for
        their ``wait()`` and ``error``)."""
        with _started_lock:
            others = [p for p in _started if p._context is self._context and p is not self]
        for other in others:
            # not blocking: a thread starting or stopping that pipeline right now holds its
            # lock, and may be waiting for this one's (two starts on one context at once)
            if other.state in ("completed", "failed") and other._lifecycle.acquire(False):
                try:
                    other._stop_locked()
                finally:
                    other._lifecycle.release()

    def _release_transport(self) -> None:
        """Close the context's transport if this pipeline opened it last."""
        with _started_lock:
            holder = _holders.get(self._context)
            if holder is self:
                del _holders[self._context]
        if holder is self:
            self._context.transport.close()

    def session(self) -> Session:
        """What this pipeline offers a session transport: its streams, inputs, docs, feed."""
        stages = self.stages
        return Session(
            streams={
                name: stage.options.codec
                for name, stage in stages.items()
                if isinstance(stage.options, StreamOptions)
            },
            inputs=tuple(self._inputs()),
            docs=MappingProxyType(self._context.docs),
            feed=self.feed,
        )

    def _inputs(self) -> dict[str, Stage]:
        """The pipeline's client streams by name: its ``ctx.input`` stages, then the inputs
        its sources read (``ctx.source(reads=)``) that are no stage of it."""
        if self._client_streams is None:  # the graph is fixed: found once
            stages = self.stages
            inputs = {name: stage for name, stage in stages.items() if stage.kind == "input"}
            for stage in stages.values():
                for read in reads_of(stage):
                    inputs.setdefault(read.name, read)
            self._client_streams = inputs
        return self._client_streams

    def update(self, **changes: Any) -> int:
        """Steer: write ``changes`` to the control doc and start a new generation.

        Items of older generations still in flight are dropped at their next hop (reason
        ``stale``); the first item of the new generation is the cutover. Returns the doc's
        new version.
        """
        return self._context.control.steer(changes)

    def feed(
        self, name: str, sample: Any, at_ms: float | None = None, *, client: Hashable = None
    ) -> int:
        """Push a client sample into the ``ctx.input`` stream ``name``; its ``input_seq``.

        Safe from any thread. ``at_ms`` is the client's timestamp (ms), when it has one;
        ``client`` names whose budget it is charged to (a transport passes one per connection).
        Raises :class:`~rxstream.topology.InvalidSample` for a sample its schema (or its
        ``at_ms``, or ``item_size``) refuses, and
        :class:`~rxstream.topology.ClientStreamLimitExceeded` past the stream's limit.
        """
        stage = self._inputs().get(name)
        if stage is None:
            inputs = sorted(self._inputs())
            raise UnknownInputError(
                f"no input stream {name!r} in this pipeline; its inputs are: "
                f"{', '.join(inputs) or 'none'}"
            )
        feed = stage.source
        assert isinstance(feed, InputFeed)
        return feed.feed(sample, at_ms, client)

    def flush(self) -> int:
        """Start a new flush generation: stages with ``reset()`` reset on its first item."""
        return self._context.control.flush()

    def bind(self, doc: Doc, mapping: Mapping[str, str]) -> None:
        """Legacy: when a mapped doc path changes, ``update(**{keyword: value})``.

        Deprecated: read ``doc.desired.*`` inline for cheap config, and use ``doc.bind`` for
        structural change.
        """
        warnings.warn(
            "pipeline.bind(doc, mapping) is deprecated: read doc.desired.<path>.value inline "
            "in stage functions, and use doc.bind(construct, [deps]) to rebuild a stage",
            DeprecationWarning,
            stacklevel=2,
        )
        for path, keyword in mapping.items():
            ref = doc.desired
            for key in path.split("."):
                ref = ref[key]
            ref.value  # noqa: B018 - a path that does not exist fails here, not on first change

            def apply(value: Any, keyword: str = keyword) -> None:
                self.update(**{keyword: value})

            self._legacy.append(ref.changes.pipe(operators.skip(1)).subscribe(apply))

    def stop(self) -> None:
        """Stop sources, wake every blocked inbox, join the threads; idempotent, ~0.5 s at most.

        Items still waiting in inboxes are counted as dropped with reason ``stopped``. Safe
        from any thread, also while a :meth:`start` is under way (it stops what that started).
        """
        with self._lifecycle:
            self._stop_locked()

    def _stop_locked(self) -> None:
        run = self._run
        if isinstance(run, DrivenRun):
            run.close()
        if self._session_end is not None:  # its callback holds the run, and so this pipeline:
            self._session_end.detach()  # left registered, neither would ever be collected
            self._session_end = None
            return
        if not isinstance(run, ThreadedRun) or self._stopped:
            return
        self._stopped = True
        try:
            stuck = run.stop(STOP_TIMEOUT)
        finally:
            if self._ranks is not None:
                self._ranks.stop()
            self._release_transport()
            self._forget_started()
            self._over.set()  # a wait() under way returns
        if stuck:
            _log.warning("pipeline_stop_left_threads", threads=stuck)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the threaded run is over (completed, failed or stopped), then stop it;
        raise its :class:`PipelineError` if a stage failed.

        Returns whether it was over within ``timeout`` seconds: ``True`` at once after
        :meth:`stop`. An interrupt (``KeyboardInterrupt``) while it waits stops the run, as
        :meth:`run` does on cancellation. After :meth:`drive` (nothing runs on threads) it is
        a :class:`PipelineStateError`.
        """
        run = self._require_run("wait()")
        if not isinstance(run, ThreadedRun):
            raise PipelineStateError(
                "wait() after drive(): a drive returns once its frames are through, nothing "
                "runs to wait for; wait() follows start()"
            )
        try:
            if not self._over.wait(timeout):
                return False
        except KeyboardInterrupt:
            self.stop()
            raise
        self.stop()
        run.raise_error()
        return True

    async def run(self, *, poll_interval: float = 0.1, **config: Any) -> None:
        """Start, stay alive while the session transport is attached, stop on disconnect.

        Also returns when the pipeline completes, and stops it when the awaiting task is
        cancelled. ``poll_interval`` only bounds how fast a disconnect is seen. A stage that
        failed raises its :class:`PipelineError` here; a task of ``ctx.spawn`` that failed
        (during the run, or before it) ends it at once and raises its :class:`~rxstream.TaskError`
        (every run of the context under way raises it). When it ends and no other run of the
        context is under way, it cancels the context's spawned tasks.
        """
        if poll_interval <= 0:
            raise ArgumentError(f"poll_interval must be > 0 seconds, got {poll_interval}")
        tasks = self._context._tasks
        failed = tasks.take_failure()
        if failed is not None:  # a spawned task failed before the run: it does not start
            if not tasks.running:
                await tasks.cancel_all()
            raise failed
        loop = asyncio.get_running_loop()
        run = self._start(config, loop=loop)
        finished = asyncio.Event()
        self._over.on_done(lambda: _call_soon(loop, finished.set))  # also a stop() elsewhere
        watch = tasks.enter_run(finished.set)  # a spawned task failed: end now, raise it
        try:
            while not finished.is_set() and self._context.connected:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), poll_interval)
        finally:
            failed = tasks.leave_run(watch)
            self.stop()
            if not tasks.running:  # the last run of the context: its tasks go with it
                await tasks.cancel_all()
        run.raise_error()
        if failed is not None:
            raise failed

    def drive(self, frames: int = 1, *, items: bool = False, interval: float = 0.0) -> Any:
        """Pull ``frames`` items from each source, run until drained, return what egressed.

        Synchronous and threadless: the same operators on an immediate hop and a virtual
        clock, so ``pace`` and time windows never sleep and a drive is repeatable. Source
        pulls are ``interval`` virtual seconds apart. Returns the payloads the pipeline's end
        received in order (``items=True``: the :class:`PipelineItem` s); with several ends, a
        dict by stage name.

        Consecutive drives are one continuing session: the virtual clock, the sources'
        positions, bound stages (``doc.bind``), windows, pace clocks and partial batches
        carry on from one drive to the next, and nothing completes at the end of a drive.
        :meth:`reset` (or :meth:`stop`) ends the session; the next drive starts over.
        A drive that would pull items but returns nothing because every source has ended,
        or because the pipeline had completed (every end) before it, raises
        :class:`PipelineStateError`; a drive that fails ends its session.
        """
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 0:
            raise ArgumentError(f"frames must be an int >= 0, got {frames!r}")
        if interval < 0:
            raise ArgumentError(f"interval must be >= 0 virtual seconds, got {interval}")
        with self._lifecycle:
            self._refuse_live("drive()")
        run = self._run
        if not isinstance(run, DrivenRun) or run.closed:
            run = DrivenRun(
                self.plan,
                bridge=AsyncBridge(),
                generations=self._context.generations,
                timing=self._context.timing,
                cuda_api=self._context.cuda_api,
                nvtx=self._context.nvtx,
            )
            self._run, self._ranks = run, None
            if self._session_end is not None:
                self._session_end.detach()
            # an abandoned pipeline (a notebook cell run again) ends its session, and with it
            # its doc.bind subscriptions: only live pipelines rebuild on a doc write
            self._session_end = weakref.finalize(self, run.close)
            self._session_end.atexit = False
        if self._context.self_testing and self not in self._context._self_test_drives:
            self._context._self_test_drives.append(self)  # the session ends with the block
        outputs = run.drive(frames, interval, items=items)
        if len(outputs) == 1:
            return next(iter(outputs.values()))
        return outputs

    def reset(self) -> None:
        """End the driven session: the next :meth:`drive` starts over.

        Closes the sources (an iterable starts again from its beginning, a generator function
        is called again; a generator object or iterator is one-shot and stays where it was
        closed) and what the stages hold (bound stages, buffered frames, open windows). The
        docs keep their state. A no-op when no driven session is open.
        """
        with self._lifecycle:
            self._refuse_live("reset()")
        self._end_session()

    def _end_session(self) -> None:
        """Close the driven session, if one is open (its statistics stay readable)."""
        run = self._run
        if isinstance(run, DrivenRun):
            run.close()
        if self._session_end is not None:  # its callback holds the run, and so this pipeline:
            self._session_end.detach()  # left registered, neither would ever be collected
            self._session_end = None

    def statistics(self) -> Mapping[str, StageStatistics]:
        """Each stage's statistics for the current (or last) run, by name; empty before one."""
        if self._run is None:
            return MappingProxyType({})
        return MappingProxyType(dict(self._run.statistics()))

    def _require_run(self, call: str) -> Run:
        if self._run is None:
            raise PipelineStateError(f"{call} before start(): nothing is running")
        return self._run


def running_pipelines(context: Context) -> list[Pipeline]:
    """The pipelines of ``context`` whose threaded run is going (started, not yet over)."""
    with _started_lock:
        started = list(_started)
    return [p for p in started if p._context is context and p.running]


def stream_names(pipeline: Pipeline) -> frozenset[str]:
    """The names of ``pipeline``'s egress streams (its ``ctx.stream`` sinks)."""
    return frozenset(name for name, stage in pipeline.stages.items() if stage.kind == "stream")


def started_pipelines() -> list[Pipeline]:
    """Every pipeline (any context) whose threaded run was started and not yet stopped."""
    with _started_lock:
        return list(_started)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
        loop.call_soon_threadsafe(callback)


def chain_stages(chain: object, where: str) -> list[Stage] | None:
    """A pipeline's stages in order when it is one chain (a walk of ``ctx.walks``), or ``None``
    when ``chain`` is not a pipeline; ``where`` names it in the errors."""
    if not isinstance(chain, Pipeline):
        return None
    if len(chain._tails) != 1:
        raise StageBuildError(
            f"{where} must be one chain of stages, got a pipeline with {len(chain._tails)} ends"
        )
    node = chain._tails[0]
    stages = [node.stage]
    while node.inputs:
        if len(node.inputs) > 1:
            raise StageBuildError(
                f"{where} must be one chain of stages, got fan-in into {node.stage.name!r}"
            )
        node = node.inputs[0]
        stages.append(node.stage)
    stages.reverse()
    return stages
