"""``ctx.walks``: a partition's named walks, exactly one of which each pass runs.

A walks stage holds several named walks, each a chain of 1-input stages (a stage, or a
pipeline ``a | b`` with an open head). A pass is one item (one chunk when the stage declares
``chunks=``), and it runs the walk picked for it:

- by the **conductor** (``pick=``): a doc ref such as ``doc.desired.walk``, read per pass, or
  ``pick(snapshot)`` over the control doc's snapshot;
- by the **producer** (``consumer_walk=``), which makes the stage's partition
  producer-triggered. On the producer's side of the connection (its rank, on its thread,
  before the boundary) ``consumer_walk(ProducerWalkCtx)`` runs for every emitted item, and
  the item crosses as the pair ``(walk, payload)``; a chunk runs under its last item's walk.

The walks' stages run on the walks stage's thread (as a ``doc.bind`` stage's inner stage
does), each with a shell of its own named ``<walk>.<stage>``: its stamps are
``<walk>.<stage>.in``/``.out``, so an item's timeline says which walk it ran. The walks stage
counts passes in and items out; its inner stages' ``on_error`` applies to their own failures,
and a flush resets every inner stage that has a ``reset()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias

from reactivex import Observable, abc
from reactivex.disposable import CompositeDisposable
from reactivex.subject import Subject

from rxstream._exceptions import StageBuildError, TopologyError
from rxstream._kernel._kind import StageKind
from rxstream._kernel._options import Chunked, WalksOptions
from rxstream._kernel._shell import StageShell
from rxstream.doc._snapshot import Ref, Snapshot
from rxstream.item import PipelineItem, _stamped
from rxstream.operators._core import attach, one_input
from rxstream.stage import Stage
from rxstream.topology._edges import WALKS, check_chunks
from rxstream.topology._model import ConsumerWalk, ProducerWalkCtx
from rxstream.typing import ItemStream, Operator

if TYPE_CHECKING:
    from rxstream.context import Context
    from rxstream.pipeline import Pipeline
    from rxstream.topology._chunks import ChunkPolicyFactory

__all__ = ["WALKS_KIND", "ChainOf", "WalkPick", "producer_operator", "walks_declaration"]

WALKS_KIND = StageKind(WALKS, "free", options=WalksOptions)
"""``ctx.walks``: whatever the walk of each pass does."""

WalkPick: TypeAlias = "Ref | Callable[[Snapshot], str]"
"""How the conductor picks a walk per pass: a doc ref, or a function of the control doc."""

ChainOf: TypeAlias = Callable[[object, str], "list[Stage] | None"]
"""A pipeline's stages in order, checked to be one chain (``where`` names it in errors), or
``None`` for what is not a pipeline: the layer that knows ``Pipeline`` gives it."""

Chain = tuple[tuple[str, "Stage"], ...]
"""A walk's stages in order, each with its name in the run (``<walk>.<stage>``)."""


def walks_declaration(
    ctx: Context,
    walks: Mapping[str, Stage | Pipeline],
    *,
    pick: WalkPick | None,
    consumer_walk: ConsumerWalk | None,
    chunks: ChunkPolicyFactory | None,
    name: str | None,
    chain_of: ChainOf,
) -> tuple[Callable[[StageShell], Operator], WalksOptions]:
    """The walks stage's operator and options (see the module docstring); every argument
    checked here. ``chain_of`` gives a pipeline's stages in order (``None``: not a pipeline)."""
    label = name or WALKS
    if not isinstance(walks, Mapping) or not walks:
        raise StageBuildError(
            f"walks must be a non-empty mapping of walk name to stage or pipeline, "
            f"got {walks!r} for stage {label!r}"
        )
    chains: dict[str, Chain] = {}
    placed: dict[int, str] = {}
    for walk, chain in walks.items():
        if not isinstance(walk, str) or not walk or "." in walk or ">" in walk:
            raise StageBuildError(
                f"walk names must be non-empty strs without '.' or '>', got {walk!r} "
                f"for stage {label!r}"
            )
        chains[walk] = _chain(ctx, walk, chain, label, placed, chain_of)
    if (pick is None) == (consumer_walk is None):
        got = "neither" if pick is None else "both"
        raise StageBuildError(
            "walks needs pick= (the conductor picks each pass's walk) or consumer_walk= "
            f"(the producer picks it), got {got} for stage {label!r}"
        )
    if pick is not None and not isinstance(pick, Ref) and not callable(pick):
        raise StageBuildError(
            "pick must be a doc ref like doc.desired.walk or a function of the control doc's "
            f"snapshot, got {pick!r} for stage {label!r}"
        )
    if isinstance(pick, Ref):
        pick.value  # noqa: B018 - a path that does not exist fails here, not on the first pass
    if consumer_walk is not None and not callable(consumer_walk):
        raise StageBuildError(
            "consumer_walk must be a function of a ProducerWalkCtx that returns a walk name, "
            f"got {consumer_walk!r} for stage {label!r}"
        )
    made = check_chunks(chunks, label)
    if consumer_walk is not None and made is not None and made.overlapping:
        raise StageBuildError(
            "chunks into a producer-triggered partition must not overlap (a chunk runs under "
            f"one walk), got {made!r} for stage {label!r}"
        )
    options = WalksOptions(
        chunks=chunks,
        walks=tuple(chains),
        chains=MappingProxyType(chains),
        pick=pick,
        consumer_walk=consumer_walk,
    )
    return _walks_operator(ctx, MappingProxyType(chains), pick), options


def _chain(
    ctx: Context, walk: str, chain: object, label: str, placed: dict[int, str], chain_of: ChainOf
) -> Chain:
    """The stages of one walk, checked, each with its name in the run."""
    where = f"walk {walk!r} of stage {label!r}"
    if isinstance(chain, Stage):
        stages = [chain]
    else:
        found = chain_of(chain, where)
        if found is None:
            raise StageBuildError(
                f"{where} must be a stage or a pipeline of stages, got {type(chain).__name__}"
            )
        stages = found
    for stage in stages:
        if stage.context is not ctx:
            raise StageBuildError(f"stages of one pipeline must come from one Context ({where})")
        if stage.max_inputs == 0 or stage.is_sink or stage.kind == WALKS or stage.min_inputs > 1:
            raise StageBuildError(
                f"{where} is a chain of 1-input stages (no source, sink, fan-in or walks), "
                f"got {stage!r}"
            )
        if stage.rank is not None:
            raise StageBuildError(
                f"the stages of a walk run in the walks stage's partition, got rank="
                f"{stage.rank} on stage {stage.name!r} in {where}"
            )
        if isinstance(stage.options, Chunked) and stage.options.chunks is not None:
            raise StageBuildError(
                f"chunks= is declared on a connection's consuming stage, got it on stage "
                f"{stage.name!r} inside {where}"
            )
        other = placed.setdefault(id(stage), walk)
        if other != walk or stages.count(stage) > 1:
            twice = f"walk {walk!r}" if other == walk else f"walks {other!r} and {walk!r}"
            raise StageBuildError(
                f"stage {stage.name!r} is placed twice ({twice} of stage {label!r}); "
                "a stage object is one node: build another"
            )
    return tuple(zip(_names(stages, where, walk), stages, strict=True))


def _names(stages: Sequence[Stage], where: str, walk: str) -> list[str]:
    """``<walk>.<stage>`` for each stage: explicit names as given, derived ones made unique."""
    taken: set[str] = set()
    for stage in stages:
        if stage.explicit_name:
            if stage.name in taken:
                raise StageBuildError(
                    f"stage names must be unique in a walk, got {stage.name!r} twice in {where}"
                )
            taken.add(stage.name)
    names = []
    for stage in stages:
        name = stage.name
        if not stage.explicit_name:
            suffix = 2
            while name in taken:
                name = f"{stage.name}-{suffix}"
                suffix += 1
            taken.add(name)
        names.append(f"{walk}.{name}")
    return names


def _walks_operator(
    ctx: Context, chains: Mapping[str, Chain], pick: WalkPick | None
) -> Callable[[StageShell], Operator]:
    def build(shell: StageShell) -> Operator:
        shells = {
            walk: [
                StageShell(
                    qualified,
                    stage.kind,
                    shell.scheduler,
                    stage.on_error,
                    shell.crashed,
                    shell.call_async,
                    shell.generations,
                    _reset_of(stage),
                    shell.timing,
                )
                for qualified, stage in chain
            ]
            for walk, chain in chains.items()
        }
        inners = [inner for group in shells.values() for inner in group]

        def reset_all() -> None:
            for inner in inners:  # read at the flush: an inner doc.bind sets its reset late
                if inner.reset is not None:
                    inner.reset()

        shell.reset = reset_all
        choose = _chooser(ctx, pick, tuple(chains), shell.name)

        def subscribe(
            source: ItemStream,
            observer: abc.ObserverBase[PipelineItem],
            scheduler: abc.SchedulerBase | None,
        ) -> abc.DisposableBase:
            return _Router(chains, shells, shell, observer, choose).attach(source, scheduler)

        return one_input(subscribe)

    return build


def _reset_of(stage: Stage) -> Callable[[], Any] | None:
    reset = getattr(stage.target, "reset", None)
    return reset if callable(reset) else None


def _chooser(
    ctx: Context, pick: WalkPick | None, walks: tuple[str, ...], stage: str
) -> Callable[[PipelineItem], tuple[str, PipelineItem]]:
    """Per pass: the walk and the item the walk gets (decided once, at the run's start)."""
    if pick is None:  # producer-triggered: the walk came with the item

        def carried(item: PipelineItem) -> tuple[str, PipelineItem]:
            walk, payload = item.payload
            return walk, _stamped(item, payload, ())

        return carried
    if isinstance(pick, Ref):
        ref = pick
        where = f"doc path {ref.dotted}"

        def picked(item: PipelineItem) -> tuple[str, PipelineItem]:
            return _named(ref.value, walks, where, stage), item

        return picked
    control = ctx.control
    call = pick
    where = f"pick {getattr(pick, '__qualname__', None) or pick!r}"

    def called(item: PipelineItem) -> tuple[str, PipelineItem]:
        return _named(call(control.snapshot()), walks, where, stage), item

    return called


def _named(walk: object, walks: tuple[str, ...], where: str, stage: str) -> str:
    if not isinstance(walk, str) or walk not in walks:
        raise TopologyError(
            f"the conductor's pick must name one of the walks of stage {stage!r} "
            f"({', '.join(walks)}), got {walk!r} from {where}"
        )
    return walk


class _Router:
    """One subscription to a walks stage: every walk's chain, and the routing of passes."""

    def __init__(
        self,
        chains: Mapping[str, Chain],
        shells: Mapping[str, Sequence[StageShell]],
        shell: StageShell,
        observer: abc.ObserverBase[PipelineItem],
        choose: Callable[[PipelineItem], tuple[str, PipelineItem]],
    ) -> None:
        self.shell = shell
        self.observer = observer
        self.choose = choose
        self.inputs: dict[str, Subject[PipelineItem]] = {}
        self.open = len(chains)
        self.subscriptions = CompositeDisposable()
        for walk, chain in chains.items():
            head: Subject[PipelineItem] = Subject()
            stream: ItemStream = head
            for (_name, stage), inner in zip(chain, shells[walk], strict=True):
                stream = stage.build(inner)([stream])
            self.inputs[walk] = head
            self.subscriptions.add(
                attach(stream, self.on_inner_next, observer.on_error, self.on_inner_completed)
            )

    def attach(self, source: ItemStream, scheduler: abc.SchedulerBase | None) -> abc.DisposableBase:
        upstream = attach(
            source, self.on_next, self.observer.on_error, self.on_completed, scheduler
        )
        return CompositeDisposable(upstream, self.subscriptions)

    def on_next(self, item: PipelineItem) -> None:
        self.shell.counters.items_in += 1
        try:
            walk, item = self.choose(item)
        except Exception as exc:
            self.shell.failed(self.observer, item, exc)
            return
        self.inputs[walk].on_next(item)

    def on_completed(self) -> None:
        for head in self.inputs.values():
            head.on_completed()

    def on_inner_next(self, item: PipelineItem) -> None:
        self.shell.counters.items_out += 1
        self.observer.on_next(item)

    def on_inner_completed(self) -> None:
        self.open -= 1
        if self.open == 0:
            self.observer.on_completed()


def producer_operator(
    consumer_walk: ConsumerWalk,
    walks: tuple[str, ...],
    consumer: str,
    producer_walk: str,
    shell: StageShell,
) -> Callable[[ItemStream], ItemStream]:
    """The producer's side of a walk-driving connection into walks stage ``consumer``.

    Per emitted item, ``consumer_walk`` gets one :class:`ProducerWalkCtx` refilled with
    ``producer_walk``, the producer (``shell``'s stage), ``{producer: items emitted before}``
    and the item; the item goes on as ``(walk, payload)``. A hook that raises or names no walk
    of ``consumer`` fails the producer's item under its ``on_error``.
    """
    producer = shell.name

    def tagged(source: ItemStream) -> ItemStream:
        def subscribe(
            observer: abc.ObserverBase[PipelineItem], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            walk_ctx = ProducerWalkCtx()
            emitted = 0

            def on_next(item: PipelineItem) -> None:
                nonlocal emitted
                walk_ctx.refill(producer_walk, producer, {producer: emitted}, item)
                try:
                    walk = consumer_walk(walk_ctx)
                    if not isinstance(walk, str) or walk not in walks:
                        raise TopologyError(
                            f"consumer_walk must return one of the walks of stage {consumer!r} "
                            f"({', '.join(walks)}), got {walk!r}"
                        )
                except Exception as exc:
                    shell.counters.items_out -= 1  # on the producer's thread: it never left
                    shell.failed(observer, item, exc)
                    return
                emitted += 1
                observer.on_next(_stamped(item, (walk, item.payload), ()))

            return attach(source, on_next, observer.on_error, observer.on_completed, scheduler)

        return Observable(subscribe)

    return tagged
