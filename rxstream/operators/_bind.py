"""``doc.bind(construct, [deps])``: a stage rebuilt when its dependencies change (useMemo).

The doc's snapshots are mapped to the tuple of the dependencies' values (``map``), and only a
tuple unlike the last one passes (``distinct_until_changed``): every write is one snapshot, so
a write that changes two deps rebuilds once, and a write that changes none (another path, or
the same value again) rebuilds nothing. This reads all the deps from one snapshot; a
``combine_latest`` over each dep's own stream would see a two-dep write as two changes and
build twice. Under threads, ``construct`` runs on the stage's builder thread, off the hot path,
while the old inner stage keeps serving; the finished stage is handed to the stage's own
thread, which switches between two items (the ``switch_map`` step), closes the old one
(``close()`` on its function, when it has one) and marks the first item out of the new one
``cutover=True``. A ``construct`` that raises keeps the old stage and is reported in
``doc.errors`` and the log. Under ``drive()`` the rebuild is synchronous, inside the write,
before the next item; consecutive drives are one session, so the stage built by the first drive
serves the next ones until a dep changes. Under threads, a first ``construct`` whose stage
reads a resource not loaded yet (``ctx.resource``) runs on a thread of its own, so that the
run's start (and a stop asked meanwhile) does not wait for the load: the stage's first item,
which comes once the rank's loads are done, waits for that construct.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from reactivex import abc, operators
from reactivex.disposable import CompositeDisposable, Disposable
from reactivex.subject import Subject

from rxstream._exceptions import ArgumentTypeError, StageBuildError
from rxstream._kernel._kind import StageKind
from rxstream._kernel._options import BindOptions
from rxstream._kernel._shell import StageShell
from rxstream.doc._doc import BindFailure, Doc
from rxstream.doc._snapshot import Ref, Snapshot, lookup
from rxstream.item import PipelineItem, evolve_metadata
from rxstream.operators._core import one_input
from rxstream.stage import Stage
from rxstream.typing import ItemStream, Operator

__all__ = ["BIND_KIND", "bind_declaration", "bind_operator"]

BIND_KIND = StageKind("bind", "free", options=BindOptions)
"""``doc.bind``: whatever the stage it builds does."""

Construct = Callable[[Snapshot], "Stage | Callable[[Any], Any]"]
Paths = tuple[tuple[str, ...], ...]
Pipe = Callable[[Callable[[Any], Any]], Stage]
"""How a construct's plain callable becomes a stage (``ctx.pipe``)."""


def bind_declaration(doc: Doc, construct: Construct, deps: Sequence[Ref]) -> tuple[str, Paths]:
    """The bound stage's default name and its deps' paths, checked now (a missing dep fails)."""
    label = getattr(construct, "__name__", "")
    if not isinstance(label, str) or not label.isidentifier():
        label = "bind"
    if not callable(construct):
        raise StageBuildError(f"doc.bind needs a callable construct, got {construct!r}")
    refs = tuple(deps)
    for ref in refs:
        if not isinstance(ref, Ref):
            raise StageBuildError(
                f"doc.bind deps must be refs like doc.desired.a.b, got {ref!r} for stage {label!r}"
            )
        lookup(doc.snapshot(), ref.path, doc.name)  # a dep that does not exist fails now
    return label, tuple(ref.path for ref in refs)


def bind_operator(
    doc: Doc,
    pipe: Pipe,
    construct: Construct,
    paths: Paths,
    loading: Callable[[], bool] = lambda: False,
) -> Callable[[StageShell], Operator]:
    """The bound stage's operator (see the module docstring); ``loading()``: whether a
    resource the stage reads is not loaded yet in this process."""

    def build(shell: StageShell) -> Operator:
        def subscribe(
            source: ItemStream,
            observer: abc.ObserverBase[PipelineItem],
            scheduler: abc.SchedulerBase | None,
        ) -> abc.DisposableBase:
            binder = _Binder(doc, pipe, construct, paths, shell, observer)
            return binder.attach(source, scheduler, first_apart=not shell.driven and loading())

        return one_input(subscribe)

    return build


class _Inner:
    """One built inner stage, subscribed: its input subject and its subscription."""

    def __init__(self, stage: Stage, shell: StageShell, downstream: _Binder) -> None:
        self.stage = stage
        self.input: Subject[PipelineItem] = Subject()
        self.cutover = False
        output = stage.build(shell)([self.input])
        self.subscription = output.subscribe(
            downstream.on_inner_next, downstream.on_inner_error, downstream.on_inner_completed
        )

    def close(self) -> None:
        self.subscription.dispose()
        closer = getattr(self.stage.target, "close", None)
        if callable(closer):
            closer()


class _Binder:
    """The state of one subscription to a bound stage."""

    def __init__(
        self,
        doc: Doc,
        pipe: Pipe,
        construct: Construct,
        paths: Paths,
        shell: StageShell,
        observer: abc.ObserverBase[PipelineItem],
    ) -> None:
        self.doc = doc
        self.pipe = pipe
        self.construct = construct
        self.paths = paths
        self.shell = shell
        self.observer = observer
        self.current: _Inner | None = None
        self.builds = 0
        self._builder: _Builder | None = None
        self._first: threading.Event | None = None
        """Set once the first ``construct`` ran, when it runs on a thread of its own."""
        self._disposed = False

    def attach(
        self, source: ItemStream, scheduler: abc.SchedulerBase | None, *, first_apart: bool = False
    ) -> abc.DisposableBase:
        snapshot = self.doc.snapshot()
        self.shell.reset = self._reset
        if first_apart:  # its resources load meanwhile: neither start() nor stop() waits
            self._first = threading.Event()
            threading.Thread(
                target=self._first_construct,
                args=(snapshot,),
                name=f"rxstream:{self.shell.name}.construct",
                daemon=True,
            ).start()
        else:
            self._first_construct(snapshot)
        if not self.shell.driven:
            self._builder = _Builder(self, f"rxstream:{self.shell.name}.build")
        deps = self.doc.snapshots.pipe(
            operators.map(self._dep_values),
            operators.distinct_until_changed(_values_of),
            operators.skip(1),
        ).subscribe(self._on_deps)
        upstream = source.subscribe(
            self.on_next, self.observer.on_error, self.on_completed, scheduler=scheduler
        )
        return CompositeDisposable(upstream, deps, Disposable(self._dispose))

    def _first_construct(self, snapshot: Snapshot) -> None:
        try:
            stage = self._construct(snapshot)
        except Exception as exc:  # no stage to serve: the run fails, naming this stage
            self.shell.crashed(exc)
        else:
            self.shell.on_error = stage.on_error
            inner = _Inner(stage, self.shell, self)
            if self._disposed:  # the run stopped while it was made: nothing serves it
                inner.close()
            else:
                self.current = inner
        finally:
            if self._first is not None:
                self._first.set()

    def _dep_values(self, snapshot: Snapshot) -> tuple[Snapshot, tuple[Any, ...]]:
        return snapshot, tuple(lookup(snapshot, path, self.doc.name) for path in self.paths)

    def _construct(self, snapshot: Snapshot) -> Stage:
        self.builds += 1
        made = self.construct(snapshot)
        if isinstance(made, Stage):
            stage = made
        elif callable(made):
            stage = self.pipe(made)
        else:
            raise ArgumentTypeError(f"construct must return a Stage or a callable, got {made!r}")
        if stage.is_source or stage.is_sink or stage.max_inputs == 0:
            raise ArgumentTypeError(f"construct must return a 1-input stage, got {stage!r}")
        return stage

    # --- rebuilds ---------------------------------------------------------------------------

    def _on_deps(self, pair: tuple[Snapshot, tuple[Any, ...]]) -> None:
        snapshot, _values = pair
        version = self.doc.version
        if self._builder is None:  # drive: rebuild now, before the next item
            self._rebuild(snapshot, version)
        else:
            self._builder.request(snapshot, version)

    def _rebuild(self, snapshot: Snapshot, version: int) -> None:
        stage = self.build_or_report(snapshot, version)
        if stage is not None:
            self.switch(stage)

    def build_or_report(self, snapshot: Snapshot, version: int) -> Stage | None:
        """``construct(snapshot)``, or ``None`` with the failure recorded on the doc."""
        try:
            return self._construct(snapshot)
        except Exception as exc:
            self.doc._record_failure(
                BindFailure(self.shell.name, version, f"{type(exc).__name__}: {exc}")
            )
            return None

    def switch(self, stage: Stage) -> None:
        """Swap the inner stage between two items; runs on the stage's thread."""
        old = self.current
        self.shell.on_error = stage.on_error  # the inner stage's policy is the one in force
        fresh = _Inner(stage, self.shell, self)
        fresh.cutover = True
        self.current = fresh
        if old is not None:
            old.close()

    def _reset(self) -> None:
        current = self.current
        if current is not None:
            reset = getattr(current.stage.target, "reset", None)
            if callable(reset):
                reset()

    # --- items ------------------------------------------------------------------------------

    def on_next(self, item: PipelineItem) -> None:
        if self._first is not None:  # the first construct, on its thread: done, or soon
            self._first.wait()
        if self.current is not None:
            self.current.input.on_next(item)

    def on_completed(self) -> None:
        if self._first is not None:
            self._first.wait()
        if self.current is not None:
            self.current.input.on_completed()
        else:
            self.observer.on_completed()

    def on_inner_next(self, item: PipelineItem) -> None:
        current = self.current
        if current is not None and current.cutover:
            current.cutover = False
            item = PipelineItem(item.payload, evolve_metadata(item.metadata, cutover=True))
        self.observer.on_next(item)

    def on_inner_error(self, error: Exception) -> None:
        self.observer.on_error(error)

    def on_inner_completed(self) -> None:
        self.observer.on_completed()

    def _dispose(self) -> None:
        self._disposed = True
        if self._builder is not None:
            self._builder.close()
        current, self.current = self.current, None
        if current is not None:
            current.close()


class _Builder:
    """The thread that runs ``construct`` off the hot path; coalesces requests to the newest."""

    def __init__(self, binder: _Binder, name: str) -> None:
        self._binder = binder
        self._cond = threading.Condition()
        self._request: tuple[Snapshot, int] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def request(self, snapshot: Snapshot, version: int) -> None:
        with self._cond:
            self._request = (snapshot, version)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def _loop(self) -> None:
        binder = self._binder
        while True:
            with self._cond:
                while self._request is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                assert self._request is not None
                (snapshot, version), self._request = self._request, None
            first = binder._first  # a rebuild comes after the first construct
            while first is not None and not first.wait(0.1):
                if self._closed:
                    return
            stage = binder.build_or_report(snapshot, version)
            if stage is not None:
                binder.shell.scheduler.schedule(_switch_to, (binder, stage))


def _values_of(pair: tuple[Snapshot, tuple[Any, ...]]) -> tuple[Any, ...]:
    return pair[1]


def _switch_to(_scheduler: abc.SchedulerBase, state: tuple[_Binder, Stage] | None) -> None:
    assert state is not None
    binder, stage = state
    binder.switch(stage)
