"""``Context``: the stage builders, over the process environment.

Scripts, tests and notebooks make one with ``rxstream.Context()``; the CLI hands one to the
app's ``build(ctx)``. The builders (``ctx.source``, ``ctx.pipe``, …) are here; what a process's
pipelines share (the transport, rank and world, the docs, ``self_test``…) is its base class,
:class:`~rxstream._environment.Environment`.

Over ~600 lines on purpose: one builder per stage kind, each its kind's public signature,
docstring and argument checks, read side by side; what a kind runs is its operator module's.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from fractions import Fraction
from typing import Any, ClassVar, get_args

from reactivex import Observable

from rxstream._environment import Environment
from rxstream._exceptions import ArgumentTypeError, StageBuildError, shown
from rxstream._kernel._inbox import DEFAULT_CAPACITY, InboxSpec
from rxstream._kernel._options import (
    BindOptions,
    InputOptions,
    PaceOptions,
    PipeOptions,
    SourceOptions,
    StreamOptions,
)
from rxstream._kernel._resources import Resource, resources_in
from rxstream.doc import Doc, Ref, Snapshot
from rxstream.operators import (
    COMBINE_KIND,
    MERGE_KIND,
    PACE_KIND,
    PIPE_KIND,
    RX_KIND,
    STREAM_KIND,
    TAP_KIND,
    UNBATCH_KIND,
    WINDOW_KIND,
    ZIP_KIND,
    check_source,
    combine_operator,
    merge_operator,
    pace_operator,
    pipe_operator,
    rx_operator,
    sink_operator,
    tap_operator,
    unbatch_operator,
    window_operator,
    zip_operator,
)
from rxstream.operators._bind import BIND_KIND, bind_declaration, bind_operator
from rxstream.operators._input import INPUT_KIND, InputFeed
from rxstream.operators._source import SOURCE_KIND
from rxstream.operators._throttle import THROTTLE_KIND, throttle_operator
from rxstream.operators._walks import WALKS_KIND, WalkPick, walks_declaration
from rxstream.pipeline import Pipeline, chain_stages, running_pipelines
from rxstream.runtime._fuse import check_fuse
from rxstream.stage import Node, Stage, StageKind
from rxstream.timing._record import TimingRecord
from rxstream.topology import ChunkPolicyFactory, ClientStreamLimits, ConsumerWalk
from rxstream.topology._edges import WALKS, check_chunks
from rxstream.transport import CODECS, Transport
from rxstream.typing import InboxPolicy, OnError, PaceOverflow, PacePhase, StageFn

__all__ = ["Context"]

_OVERFLOWS = get_args(PaceOverflow)
_PHASES = get_args(PacePhase)


class Context(Environment):
    """Builds stages, over a process :class:`~rxstream._environment.Environment`.

    Its keyword arguments are the environment's: ``transport`` receives what ``ctx.stream``
    sinks egress (default: a :class:`~rxstream.transport.MemoryTransport` keeping the last 256
    items per stream); ``harness=True`` marks a run under the CPU harness (``rxstream test``);
    ``timing=False`` turns the per-hop stamps and the timing records off; ``config`` is the
    initial desired state of the control doc; the launcher passes ``rank``, ``world``,
    ``replicas`` and ``cuda_api``; ``nvtx=True`` makes each stage call an NVTX range (``None``:
    ``RXSTREAM_NVTX``; see :class:`~rxstream._environment.Environment`).
    """

    _composes: ClassVar[type[Pipeline]] = Pipeline
    """What ``stage | x`` builds for this context's stages (``Stage.__or__`` asks its
    stage's context: ``stage.py``, below ``pipeline``, does not import it)."""

    def _builders(self) -> Context:
        return self

    def __repr__(self) -> str:
        running = running_pipelines(self)
        return (
            f"<rxstream.Context docs={sorted(self.docs)} "
            f"transport={type(self.transport).__name__} rank={self.rank}/{self.world} "
            f"running={len(running)}>"
        )

    # --- the app's tasks --------------------------------------------------------------------

    def spawn(
        self, coroutine: Coroutine[Any, Any, Any], *, name: str | None = None
    ) -> asyncio.Task[Any]:
        """Run ``coroutine`` beside the pipelines as a task of the running loop; the task.

        Use it instead of ``asyncio.ensure_future`` for an app's own loops (an autopilot, a
        feeder): a task that raises ends every ``pipeline.run()`` of the context under way (or
        the next one) at once with a :class:`~rxstream.TaskError` naming it (``rxstream run``
        exits 1 with ``task 'autopilot' failed: …``), where an ``ensure_future`` task would die
        unseen. The last ``pipeline.run()`` of the context to end cancels the spawned tasks.
        ``name`` defaults to the coroutine function's name.
        """
        return self._tasks.spawn(coroutine, name)

    # --- builders -------------------------------------------------------------------------

    def _stage(
        self,
        kind: StageKind,
        name: str | None,
        default_name: str,
        build: Any,
        made_from: object = None,
        uses: Resource[Any] | Sequence[Resource[Any]] | None = None,
        **declaration: Any,
    ) -> Stage:
        """A stage; ``made_from`` (besides its target or source) is what else it is made
        from that may read a resource (a bind's construct); ``uses``, when given, are the
        resources it reads, instead of those a scan of what it is made from finds."""
        stage_name = default_name if name is None else name
        if uses is None:
            made = (declaration.get("target"), declaration.get("source"), made_from)
            read = resources_in(*made)
        else:
            read = _resources_named(uses, stage_name)
        return Stage(
            kind=kind,
            name=stage_name,
            explicit_name=name is not None,
            build=build,
            context=self,
            uses=read,
            **declaration,
        )

    def source(
        self,
        it_or_fn: object,
        *,
        name: str | None = None,
        rank: int | None = None,
        device: str | None = None,
        on_error: OnError = "raise",
        reads: Stage | Sequence[Stage] = (),
        uses: Resource[Any] | Sequence[Resource[Any]] | None = None,
    ) -> Stage:
        """A source: a generator, iterable, async generator, or a callable (see the docs).

        ``reads`` names the ``ctx.input`` stages whose newest sample the source reads with
        ``input.latest()`` (the pointer now, for a world model's tick): the pipeline takes
        their feeds, and each item carries the correlation of the sample read during its pull,
        so its sink writes one timing record per sample that reached it. ``uses`` (as for
        :meth:`pipe`) names the resources it reads.
        """
        default = _fn_name(it_or_fn, "source")
        check_source(it_or_fn, name or default)
        read = _inputs_read(reads, name or default)
        return self._stage(
            SOURCE_KIND,
            name,
            default,
            build=_no_operator,
            inputs=(0, 0),
            rank=rank,
            device=device,
            on_error=on_error,
            source=it_or_fn,
            options=SourceOptions(reads=read),
            uses=uses,
        )

    def input(
        self,
        name: str,
        limits: ClientStreamLimits | None = None,
        *,
        capacity: int = 64,
        rank: int | None = None,
        chunks: ChunkPolicyFactory | None = None,
        schema: object = None,
    ) -> Stage:
        """A client-fed stream: ``pipeline.feed(name, sample, at_ms=None)`` pushes samples in.

        Each sample becomes an item with ``input_seq`` (from 1), ``input_at_ms`` and an
        ``input.recv`` stamp; ``limits`` bound what a client may feed in a session. When
        ``capacity`` samples wait unread, the oldest is dropped (counted, reason ``latest``).
        ``chunks`` (a chunk policy factory) releases the samples as chunks: lists of samples.
        ``schema`` declares what a sample must look like (a type, a ``Field``, a ``Literal``,
        a tuple, a dict or a one-item list of those, or a callable validator); ``feed``
        refuses a sample that breaks it (``InvalidSample``) before it reaches a stage.
        """
        if limits is not None and not isinstance(limits, ClientStreamLimits):
            raise StageBuildError(
                f"limits must be a ClientStreamLimits, got {limits!r} for input {name!r}"
            )
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise StageBuildError(
                f"input capacity must be an int >= 1, got {capacity!r} for input {name!r}"
            )
        check_chunks(chunks, name)
        return self._stage(
            INPUT_KIND,
            name,
            name,
            build=_no_operator,
            inputs=(0, 0),
            rank=rank,
            source=InputFeed(name, limits, capacity, schema),
            options=InputOptions(chunks=chunks, limits=limits, schema=schema),
        )

    def pipe(
        self,
        fn: StageFn,
        *,
        name: str | None = None,
        rank: int | None = None,
        device: str | None = None,
        capacity: int = DEFAULT_CAPACITY,
        policy: InboxPolicy = "block",
        on_error: OnError = "raise",
        items: bool = False,
        chunks: ChunkPolicyFactory | None = None,
        fuse: bool = False,
        uses: Resource[Any] | Sequence[Resource[Any]] | None = None,
    ) -> Stage:
        """A 1:1 stage, ``fn(payload) -> payload`` (``items=True``: the item itself).

        Under fan-in (``[a, b] | ctx.pipe(f)``) it combines the latest of each input and
        calls ``f(*payloads)``. An ``async def`` runs on the pipeline's event loop. ``chunks``
        (a chunk policy factory) gates each input, a connection from another rank, through a
        stream buffer: ``fn`` gets chunks, lists of payloads. ``fuse=True`` (for light
        functions) runs the stage on the thread of the stage before it, with no inbox and no
        thread hop: its one upstream, on its rank, with no other consumer
        (docs/concepts.md, "Fusing light stages"). ``uses`` names the resources
        (``ctx.resource``) ``fn`` reads, which a run loads on the stage's rank before its first
        item; without it they are found in what ``fn`` holds (docs/ranks.md).
        """
        _check_callable(fn, "pipe")
        check_chunks(chunks, name or _fn_name(fn, "pipe"))
        check_fuse(
            name or _fn_name(fn, "pipe"),
            fuse,
            fn=fn,
            capacity=capacity,
            policy=policy,
            chunks=chunks,
        )
        return self._stage(
            PIPE_KIND,
            name,
            _fn_name(fn, "pipe"),
            build=pipe_operator(fn, items=items),
            target=fn,
            options=PipeOptions(chunks=chunks, items=items, fuse=fuse),
            inputs=(1, None),
            rank=rank,
            device=device,
            inbox=InboxSpec(capacity, policy),
            on_error=on_error,
            uses=uses,
        )

    def tap(
        self,
        fn: StageFn,
        *,
        name: str | None = None,
        rank: int | None = None,
        capacity: int = DEFAULT_CAPACITY,
        policy: InboxPolicy = "block",
        on_error: OnError = "raise",
        uses: Resource[Any] | Sequence[Resource[Any]] | None = None,
    ) -> Stage:
        """A side effect ``fn(payload)``; the item passes on unchanged (``uses``: as for
        :meth:`pipe`)."""
        _check_callable(fn, "tap")
        return self._stage(
            TAP_KIND,
            name,
            _fn_name(fn, "tap"),
            build=tap_operator(fn),
            target=fn,
            rank=rank,
            inbox=InboxSpec(capacity, policy),
            on_error=on_error,
            uses=uses,
        )

    def pace(
        self,
        fps: float,
        *,
        time_base: Fraction | None = None,
        overflow: PaceOverflow = "throttle",
        capacity: int = DEFAULT_CAPACITY,
        name: str | None = None,
        rank: int | None = None,
        phase: PacePhase = "lock",
    ) -> Stage:
        """Steady output at ``fps``; ``pts`` counts in ``time_base`` (default ``1/fps``).

        On underflow the last frame repeats marked ``idle=True``; on overflow ``throttle``
        holds the upstream (backpressure) and ``latest`` drops the oldest frame. ``phase``
        ``"lock"`` places the ticks just after the frames arrive (each period within ±10 % of
        ``1/fps``); ``"fixed"`` keeps a fixed grid from the first frame.
        """
        label = name or "pace"
        if isinstance(fps, bool) or not isinstance(fps, int | float | Fraction):
            raise StageBuildError(f"fps must be a number > 0, got {fps!r} for stage {label!r}")
        if not math.isfinite(fps) or fps <= 0:
            raise StageBuildError(f"fps must be a finite number > 0, got {fps} for stage {label!r}")
        if overflow not in _OVERFLOWS:
            raise StageBuildError(
                f"overflow must be one of {', '.join(_OVERFLOWS)}, got {overflow!r} "
                f"for stage {label!r}"
            )
        if phase not in _PHASES:
            raise StageBuildError(
                f"phase must be one of {', '.join(_PHASES)}, got {phase!r} for stage {label!r}"
            )
        period = Fraction(fps).limit_denominator(1001) ** -1
        base = period if time_base is None else Fraction(time_base)
        if base <= 0:
            raise StageBuildError(f"time_base must be > 0, got {time_base} for stage {label!r}")
        ratio = period / base
        if ratio.denominator != 1:
            raise StageBuildError(
                f"time_base must divide the frame period 1/{fps} s into whole ticks, "
                f"got {time_base} for stage {label!r}"
            )
        return self._stage(
            PACE_KIND,
            name,
            "pace",
            build=pace_operator(float(period), int(ratio), capacity, overflow, phase),
            rank=rank,
            inbox=InboxSpec(capacity, "latest" if overflow == "latest" else "block"),
            options=PaceOptions(fps=fps, time_base=base, overflow=overflow, phase=phase),
        )

    def throttle(
        self,
        ms: float,
        *,
        name: str | None = None,
        rank: int | None = None,
        capacity: int = DEFAULT_CAPACITY,
        policy: InboxPolicy = "block",
    ) -> Stage:
        """At most one item per ``ms`` milliseconds: an item passes and the ones arriving in
        the next ``ms`` are dropped (counted ``throttled``); nothing is held or repeated."""
        if (
            isinstance(ms, bool)
            or not isinstance(ms, int | float)
            or not math.isfinite(ms)
            or ms <= 0
        ):
            raise StageBuildError(
                f"throttle ms must be a finite number > 0, got {ms!r} "
                f"for stage {name or 'throttle'!r}"
            )
        return self._stage(
            THROTTLE_KIND,
            name,
            "throttle",
            build=throttle_operator(ms),
            rank=rank,
            inbox=InboxSpec(capacity, policy),
        )

    def unbatch(
        self,
        *,
        pts_step: int | None = None,
        name: str | None = None,
        rank: int | None = None,
        capacity: int = DEFAULT_CAPACITY,
        policy: InboxPolicy = "block",
    ) -> Stage:
        """1:N over a batch's leading dimension (or a list); ``pts`` advances by ``pts_step``."""
        if pts_step is not None and (isinstance(pts_step, bool) or not isinstance(pts_step, int)):
            raise StageBuildError(
                f"pts_step must be an int or None, got {pts_step!r} for stage {name or 'unbatch'!r}"
            )
        return self._stage(
            UNBATCH_KIND,
            name,
            "unbatch",
            build=unbatch_operator(pts_step),
            rank=rank,
            inbox=InboxSpec(capacity, policy),
        )

    def window(
        self,
        count: int | None = None,
        ms: float | None = None,
        *,
        name: str | None = None,
        rank: int | None = None,
        capacity: int = DEFAULT_CAPACITY,
        policy: InboxPolicy = "block",
        until: Callable[[Any], bool] | None = None,
    ) -> Stage:
        """N:1 windows of at most ``count`` items, closed at most ``ms`` after they open.

        ``until(payload)`` true closes the window with that item (a clock's tick, say).
        """
        label = name or "window"
        if count is None and ms is None and until is None:
            raise StageBuildError(
                f"window needs count=, ms= or until=, got none of them for {label!r}"
            )
        if until is not None and not callable(until):
            raise StageBuildError(
                f"window until must be a callable, got {until!r} for stage {label!r}"
            )
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise StageBuildError(
                f"window count must be an int >= 1, got {count!r} for stage {label!r}"
            )
        if ms is not None and (
            isinstance(ms, bool)
            or not isinstance(ms, int | float)
            or not math.isfinite(ms)
            or ms <= 0
        ):
            raise StageBuildError(f"window ms must be > 0, got {ms!r} for stage {label!r}")
        return self._stage(
            WINDOW_KIND,
            name,
            "window",
            build=window_operator(count, ms, until),
            rank=rank,
            inbox=InboxSpec(capacity, policy),
        )

    def stream(
        self,
        name: str,
        codec: str | None = None,
        on_timing: Callable[[TimingRecord], None] | None = None,
        transport: Transport | None = None,
        *,
        rank: int | None = None,
        capacity: int = DEFAULT_CAPACITY,
        policy: InboxPolicy = "block",
    ) -> Stage:
        """The egress sink ``name``: sends every item to the session transport.

        It also folds per-hop timing into one ``[timing:<name>]`` record per input (per
        ``input_seq``) or cutover, logged and handed to ``on_timing(record)``.
        """
        if codec is not None and codec not in CODECS:
            raise StageBuildError(
                f"codec must be one of {', '.join(CODECS)} (or None: raw), "
                f"got {codec!r} for stream {name!r}"
            )
        if on_timing is not None and not callable(on_timing):
            raise StageBuildError(
                f"on_timing must be a callable taking a TimingRecord, got {on_timing!r} "
                f"for stream {name!r}"
            )
        chosen = transport
        return self._stage(
            STREAM_KIND,
            name,
            name,
            build=sink_operator(
                name,
                lambda: chosen if chosen is not None else self.transport,
                on_timing,
                codec=codec or "raw",
                self_testing=lambda: self.self_testing,
            ),
            rank=rank,
            inbox=InboxSpec(capacity, policy),
            options=StreamOptions(codec=codec or "raw"),
        )

    def merge(self, *, name: str | None = None, capacity: int = DEFAULT_CAPACITY) -> Stage:
        """Fan-in: every item of every input, in arrival order."""
        return self._fan_in(MERGE_KIND, name, merge_operator(), capacity)

    def zip(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        capacity: int = DEFAULT_CAPACITY,
    ) -> Stage:
        """Fan-in: the inputs paired index by index; ``fn(*payloads)`` or the tuple."""
        return self._fan_in(ZIP_KIND, name, zip_operator(fn), capacity)

    def combine(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        capacity: int = DEFAULT_CAPACITY,
    ) -> Stage:
        """Fan-in: the latest of every input on each arrival; ``fn(*payloads)`` or the tuple."""
        return self._fan_in(COMBINE_KIND, name, combine_operator(fn), capacity)

    def _fan_in(self, kind: StageKind, name: str | None, build: Any, capacity: int) -> Stage:
        return self._stage(
            kind, name, kind.name, build=build, inputs=(1, None), inbox=InboxSpec(capacity)
        )

    def bind(
        self,
        doc: Doc,
        construct: Callable[[Snapshot], Stage | Callable[[Any], Any]],
        deps: Sequence[Ref],
        *,
        name: str | None = None,
        rank: int | None = None,
        uses: Resource[Any] | Sequence[Resource[Any]] | None = None,
    ) -> Stage:
        """``doc.bind(construct, deps)``: a stage rebuilt from ``doc`` when a dep changes
        (``uses``: the resources its stages read, as for :meth:`pipe`)."""
        label, paths = bind_declaration(doc, construct, deps)
        made: list[Stage] = []

        def loading() -> bool:
            return any(not resource.loaded for resource in made[0].uses)

        build = bind_operator(doc, self.pipe, construct, paths, loading)
        made.append(
            self._stage(
                BIND_KIND,
                name,
                label,
                build=build,
                made_from=construct,
                rank=rank,
                options=BindOptions(deps=tuple(paths)),
                uses=uses,
            )
        )
        return made[0]

    def walks(
        self,
        walks: Mapping[str, Stage | Pipeline],
        *,
        pick: WalkPick | None = None,
        consumer_walk: ConsumerWalk | None = None,
        chunks: ChunkPolicyFactory | None = None,
        name: str | None = None,
        rank: int | None = None,
        capacity: int = DEFAULT_CAPACITY,
        policy: InboxPolicy = "block",
        on_error: OnError = "raise",
    ) -> Stage:
        """A partition's named walks (chains of 1-input stages); each pass runs one of them.

        The conductor picks the walk per pass (``pick``: a doc ref like ``doc.desired.walk``,
        or a function of the control doc's snapshot), or the producer does
        (``consumer_walk(ProducerWalkCtx)``, run on the producer's rank per emitted item).
        ``chunks`` (a chunk policy factory) makes each pass a chunk of the input connection.
        See :mod:`rxstream.operators._walks` and ``docs/topology.md``.
        """
        build, options = walks_declaration(
            self,
            walks,
            pick=pick,
            consumer_walk=consumer_walk,
            chunks=chunks,
            name=name,
            chain_of=chain_stages,
        )
        return self._stage(
            WALKS_KIND,
            name,
            WALKS,
            build=build,
            inputs=(1, 1),
            rank=rank,
            inbox=InboxSpec(capacity, policy),
            on_error=on_error,
            options=options,
        )

    def rx(
        self,
        op: Callable[[Observable[Any]], Observable[Any]],
        *,
        items: bool = False,
        name: str | None = None,
        rank: int | None = None,
        capacity: int = DEFAULT_CAPACITY,
        policy: InboxPolicy = "block",
    ) -> Stage:
        """Lift a reactivex operator (over payloads; ``items=True``: over items) into a stage."""
        _check_callable(op, "rx")
        return self._stage(
            RX_KIND,
            name,
            _fn_name(op, "rx"),
            build=rx_operator(op, items=items),
            rank=rank,
            inbox=InboxSpec(capacity, policy),
        )

    def graph(self, *pipelines: Pipeline) -> Pipeline:
        """One pipeline of several ends (each usually a sink), run and driven together."""
        tails: list[Node] = []
        for pipeline in pipelines:
            if not isinstance(pipeline, Pipeline):
                raise StageBuildError(f"graph takes pipelines, got {type(pipeline).__name__}")
            tails.extend(pipeline._tails)
        if not tails:
            raise StageBuildError("graph needs at least one pipeline, got none")
        return Pipeline(tuple(tails), self)


def _fn_name(fn: object, default: str) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        return default
    return name


def _check_callable(fn: object, kind: str) -> None:
    if not callable(fn):
        raise StageBuildError(f"ctx.{kind} needs a callable, got {type(fn).__name__} {shown(fn)}")


def _inputs_read(reads: object, source: str) -> tuple[Stage, ...]:
    """The input stages a source reads (``reads=``: one, or a list of them), checked."""
    found = (reads,) if isinstance(reads, Stage) else reads
    if not isinstance(found, list | tuple) or not all(
        isinstance(stage, Stage) and stage.kind == "input" for stage in found
    ):
        raise StageBuildError(
            f"reads must be a ctx.input stage or a list of them, got {shown(reads)} "
            f"for source {source!r}"
        )
    names = [stage.name for stage in found]
    if len(set(names)) != len(names):
        raise StageBuildError(f"reads names an input twice, got {names} for source {source!r}")
    return tuple(found)


def _no_operator(_shell: object) -> Any:
    raise AssertionError("a source has no operator: the runtime pulls it")


def _resources_named(uses: object, stage: str) -> tuple[Resource[Any], ...]:
    """A builder's ``uses=``: one handle or a sequence of handles (``ctx.resource``)."""
    given = (uses,) if isinstance(uses, Resource) else uses
    if not isinstance(given, Sequence) or isinstance(given, str):
        raise ArgumentTypeError(
            f"stage {stage!r}: uses must be a Resource or a sequence of them, got "
            f"{type(uses).__name__} {uses!r}"
        )
    for handle in given:
        if not isinstance(handle, Resource):
            raise ArgumentTypeError(
                f"stage {stage!r}: uses must hold Resource handles (ctx.resource), got "
                f"{type(handle).__name__} {handle!r}"
            )
    return tuple(dict.fromkeys(given))
