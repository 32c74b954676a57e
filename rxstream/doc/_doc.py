"""``Doc``: a named desired state — inline reads, validated writes, steers, and ``bind``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reactivex import Observable, operators
from reactivex.subject import BehaviorSubject

from rxstream._exceptions import ArgumentTypeError
from rxstream._kernel._generations import Generations
from rxstream._util import library_logger
from rxstream.doc._snapshot import Ref, Snapshot, freeze, lookup, thaw
from rxstream.doc._validate import defaults_from_schema, make_validator

if TYPE_CHECKING:
    from rxstream._kernel._resources import Resource
    from rxstream.context import Context
    from rxstream.stage import Stage

__all__ = ["BindFailure", "Doc"]

_log = library_logger("rxstream")


@dataclass(frozen=True)
class BindFailure:
    """A ``construct`` that raised while rebuilding a bound stage (the old one kept serving)."""

    stage: str
    """The bound stage's name."""
    version: int
    """The doc version the rebuild was for."""
    error: str
    """``Type: message`` of what ``construct`` raised."""


class Doc:
    """A desired-state document: ``desired`` refs, ``set``/``steer`` writes, ``bind`` stages.

    Reads are lock-free (one immutable :class:`Snapshot` replaced per write); writes are
    serialised, validated (see :mod:`rxstream.doc._validate`) and versioned, and a refused
    write leaves the state unchanged.
    """

    def __init__(
        self,
        name: str,
        *,
        defaults: Mapping[str, Any] | None = None,
        schema: object = None,
        generations: Generations | None = None,
        context: Context | None = None,
    ) -> None:
        self.name = name
        self.schema = schema
        """The schema the doc validates with (a dataclass, a callable, or ``None``)."""
        if defaults is not None:
            _check_fields(name, "defaults", defaults)
        base = thaw(defaults) if defaults is not None else defaults_from_schema(name, schema)
        self._validate = make_validator(name, base, schema)
        self._validate(base, base)
        self._snapshot = freeze(base, name)
        self._version = 0
        self._lock = threading.RLock()
        self._subject: BehaviorSubject[Snapshot] = BehaviorSubject(self._snapshot)
        self.generations = generations if generations is not None else Generations()
        self.context = context
        self.errors: list[BindFailure] = []

    # --- reads ------------------------------------------------------------------------------

    @property
    def desired(self) -> Ref:
        """A reference to the root: ``doc.desired.a.b.value`` reads ``a.b`` now."""
        return Ref(self.snapshot, self.name, (), self._path_changes)

    def snapshot(self) -> Snapshot:
        """The whole state now, frozen."""
        return self._snapshot

    @property
    def version(self) -> int:
        """Writes so far (0 for the defaults)."""
        return self._version

    @property
    def snapshots(self) -> Observable[Snapshot]:
        """The current snapshot, then each new one (on the writer's thread, in order)."""
        return self._subject

    def _path_changes(self, path: tuple[str, ...]) -> Observable[Any]:
        name = self.name

        def read(snapshot: Snapshot) -> Any:
            return lookup(snapshot, path, name)

        return self._subject.pipe(operators.map(read), operators.distinct_until_changed())

    def to_json(self) -> str:
        """The state as JSON, with its name and version, for transports and logs."""
        return json.dumps(
            {"name": self.name, "version": self._version, "state": thaw(self._snapshot)},
            sort_keys=True,
            default=repr,
        )

    # --- writes -----------------------------------------------------------------------------

    def set(self, changes: Mapping[str, Any] | None = None, /, **kwargs: Any) -> int:
        """Deep-merge ``changes`` and ``kwargs`` into a new state; its version.

        Raises :class:`~rxstream.doc.DocValidationError` (state unchanged) when refused.
        """
        if changes is not None:
            _check_fields(self.name, "changes", changes)
        merged_changes = _merge(thaw(changes or {}), thaw(kwargs))
        with self._lock:
            state = _merge(thaw(self._snapshot), merged_changes)
            self._validate(merged_changes, state)
            self._snapshot = freeze(state, self.name)
            self._version += 1
            self._subject.on_next(self._snapshot)
            return self._version

    def replicate(self, state: Mapping[str, Any], version: int) -> None:
        """Take the controller's state as is (a replica on another rank); no validation.

        Versions only move forward: an older state that arrives late is ignored.
        """
        with self._lock:
            if version <= self._version:
                return
            self._snapshot = freeze(thaw(state), self.name)
            self._version = version
            self._subject.on_next(self._snapshot)

    def _rewind(self, snapshot: Snapshot, version: int, errors: int) -> None:
        """Put back a state this doc had (``snapshot`` at ``version``, its first ``errors``
        bind failures): the end of a self test, whose writes (and the rebuilds they failed)
        the run after it does not see. No validation (it was valid); subscribers get
        ``snapshot`` when it is not the state now.

        Versions go back too: a replica takes only newer ones, so rank > 0's copy (which ran
        its own self test, rewound the same way) takes the run's next write. A self test run
        while a run on several ranks is live is not rewound on those ranks (known limit)."""
        with self._lock:
            moved = snapshot is not self._snapshot
            self._snapshot = snapshot
            self._version = version
            del self.errors[errors:]
            if moved:
                self._subject.on_next(snapshot)

    def steer(self, changes: Mapping[str, Any] | None = None, /, **kwargs: Any) -> int:
        """A write that starts a new generation: items in flight go stale; its version."""
        with self._lock:
            version = self.set(changes, **kwargs)
            self.generations.steer()
            return version

    def flush(self) -> int:
        """Start a new flush generation: stages with ``reset()`` reset on its first item."""
        return self.generations.bump_flush()

    # --- structure ----------------------------------------------------------------------------

    def bind(
        self,
        construct: Callable[[Snapshot], Stage | Callable[[Any], Any]],
        deps: Sequence[Ref],
        *,
        name: str | None = None,
        rank: int | None = None,
        uses: Resource[Any] | Sequence[Resource[Any]] | None = None,
    ) -> Stage:
        """A stage whose inner stage is ``construct(snapshot)``, rebuilt when a dep changes.

        ``rank`` places it like any builder's ``rank=`` (the doc is replicated there);
        ``uses`` names the resources its stages read (``ctx.pipe``'s ``uses``). The stage is
        its context's to make: this is ``ctx.bind(doc, construct, deps)``.
        """
        if self.context is None:
            raise ArgumentTypeError(f"doc {self.name!r} has no context: make it with ctx.doc(...)")
        return self.context.bind(self, construct, deps, name=name, rank=rank, uses=uses)

    def _record_failure(self, failure: BindFailure) -> None:
        with self._lock:
            self.errors.append(failure)
        _log.error(
            "doc_bind_rebuild_failed",
            doc=self.name,
            stage=failure.stage,
            version=failure.version,
            error=failure.error,
        )

    def __repr__(self) -> str:
        return f"<Doc {self.name!r} v{self._version} {thaw(self._snapshot)!r}>"


def _merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` deep-merged in (sections merge, values replace)."""
    out = dict(base)
    for key, value in changes.items():
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            out[key] = _merge(dict(current), value)
        else:
            out[key] = value
    return out


def _check_fields(name: str, what: str, data: object, at: str = "") -> None:
    """``data`` (a doc's ``defaults``, a write's ``changes``) as a mapping of ``str`` field
    names at every depth, or an :class:`ArgumentTypeError` naming the doc, the rule and the
    value (and where it sits)."""
    if not isinstance(data, Mapping):
        raise ArgumentTypeError(
            f"doc {name!r}: {what}{at} must be a mapping of field names to values, "
            f"got {data!r:.80} ({type(data).__name__})"
        )
    for key, value in data.items():
        if not isinstance(key, str):
            raise ArgumentTypeError(
                f"doc {name!r}: {what} field names must be str, got {key!r:.80} "
                f"({type(key).__name__}){' in ' + what + at if at else ''}"
            )
        if isinstance(value, Mapping):
            _check_fields(name, what, value, f"{at}.{key}" if at else f".{key}")
