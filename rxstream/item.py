"""Items, their metadata, and the rules for stamping and merging metadata.

Every emission inside the engine is a :class:`PipelineItem`. Stage functions see payloads;
the stage shell keeps the metadata: 1:1 stages keep it and add their stamps, 1:N stages copy
it to every child, N:1 stages merge it with :func:`merge_metadata`.
"""

import numbers
import operator
import time
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from rxstream._exceptions import ArgumentError, ArgumentTypeError

__all__ = [
    "PipelineItem",
    "PipelineMetadata",
    "Timeline",
    "evolve_metadata",
    "merge_metadata",
    "now",
]

Timeline = tuple[tuple[str, float], ...]
"""``(hop, t)`` pairs in the order they happened; ``t`` from :func:`time.monotonic`."""

now = time.monotonic
"""The one clock of every stamp: monotonic, shared by every process on a host."""


@dataclass(frozen=True)
class PipelineMetadata:
    """Control metadata that travels with a payload across stage hops and rank boundaries."""

    prompt_generation: int = 0
    flush_generation: int = 0
    cutover: bool = False
    drop_generation: int = 0
    pts: int = 0
    idle: bool = False
    capture_ts: float | None = None
    input_seq: int = 0
    input_at_ms: int = 0
    timeline: Timeline = ()

    def __post_init__(self) -> None:
        """Every value as the plain Python type its field declares (a numpy ``pts`` as ``int``).

        So metadata crosses ranks as it is: marshal, which carries it, writes anything with a
        buffer (a numpy scalar) as ``bytes``. A value that is not of its field's kind raises
        ``TypeError`` naming the field.
        """
        state = self.__dict__
        for name, value in state.items():
            if type(value) is not _KINDS[name]:
                state[name] = _plain(name, value)
        timeline = state["timeline"]
        if timeline and not _stamps_plain(timeline):
            state["timeline"] = _plain("timeline", list(timeline))


@dataclass(frozen=True)
class PipelineItem:
    """A payload and the metadata that travels with it."""

    payload: Any
    metadata: PipelineMetadata

    def __getattr__(self, name: str) -> Any:
        # Items made on the hot path (``_stamped``) hold their metadata as a base and the
        # stamps added since; ``metadata`` is built on first read and kept.
        if name == "metadata":
            state = self.__dict__
            try:
                base, chain = state["_md"], state["_st"]
            except KeyError:
                raise AttributeError(name) from None
            metadata = _with_stamps(base, _unchain(chain))
            state["metadata"] = metadata
            return metadata
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_new = object.__new__


def evolve_metadata(metadata: PipelineMetadata, **changes: Any) -> PipelineMetadata:
    """A copy of ``metadata`` with ``changes`` applied (unknown fields raise ``TypeError``).

    The copy bypasses ``__init__``: the per-hop path cannot afford a ten-field frozen
    constructor (several times slower), and the fields are checked against the class instead.
    """
    for key, value in changes.items():
        if key not in _FIELDS:
            raise ArgumentTypeError(
                f"PipelineMetadata has no field {key!r}; fields are {sorted(_FIELDS)}"
            )
        if type(value) is not _KINDS[key] or (key == "timeline" and not _stamps_plain(value)):
            changes[key] = _plain(key, value)
    fresh = _new(PipelineMetadata)
    state = fresh.__dict__
    state.update(metadata.__dict__)
    state.update(changes)
    return fresh


def _with_stamps(metadata: PipelineMetadata, stamps: Timeline) -> PipelineMetadata:
    """``metadata`` with ``stamps`` appended to its timeline (the hot-path twin of evolve)."""
    fresh = _new(PipelineMetadata)
    state = fresh.__dict__
    state.update(metadata.__dict__)
    state["timeline"] = metadata.timeline + stamps
    return fresh


def _stamped(item: PipelineItem, payload: Any, stamps: tuple[Any, ...]) -> PipelineItem:
    """``payload`` with ``item``'s metadata plus ``stamps`` (the 1:1 rule, hot path).

    The metadata is not copied per hop: the new item keeps the same base metadata and a chain
    of the stamps gathered since — one tuple a hop, ``(previous link, hop, t, hop, t…)`` — and
    builds ``metadata`` only when someone reads it (about half the cost of a copy, see
    docs/performance.md, and one object a hop for the garbage collector to count, not four).
    ``stamps`` is flat: ``hop, t, hop, t…``.
    """
    state = item.__dict__
    base = state.get("_md")
    if base is None:
        base, link = state["metadata"], None
    else:
        link = state["_st"]
    fresh = _new(PipelineItem)
    fresh_state = fresh.__dict__
    fresh_state["payload"] = payload
    fresh_state["_md"] = base
    fresh_state["_st"] = (link, *stamps) if stamps else link
    return fresh


def _linked(payload: Any, base: PipelineMetadata, link: tuple[Any, ...] | None) -> PipelineItem:
    """A new item of ``payload`` over ``base`` whose stamp chain is ``link`` (or none)."""
    fresh = _new(PipelineItem)
    state = fresh.__dict__
    state["payload"] = payload
    state["_md"] = base
    state["_st"] = link
    return fresh


def _unchain(link: tuple[Any, ...] | None) -> Timeline:
    """The stamps of a chain of links, oldest first, as ``(hop, t)`` pairs."""
    links = []
    while link is not None:
        links.append(link)
        link = link[0]
    flat = [value for node in reversed(links) for value in node[1:]]
    return tuple(zip(flat[::2], flat[1::2], strict=True))


def _base(item: PipelineItem) -> PipelineMetadata:
    """``item``'s metadata without the stamps of its latest hops: every field but the timeline
    is the item's own (what the per-hop checks read without building the metadata)."""
    base: PipelineMetadata | None = item.__dict__.get("_md")
    return item.metadata if base is None else base


def _item(payload: Any, metadata: PipelineMetadata) -> PipelineItem:
    """A PipelineItem built without the frozen ``__init__`` (hot path)."""
    fresh = _new(PipelineItem)
    state = fresh.__dict__
    state["payload"] = payload
    state["metadata"] = metadata
    return fresh


_FIELDS = frozenset(PipelineMetadata.__dataclass_fields__)


def _kind(hint: Any) -> type:
    """The plain type of an annotation: ``int``, ``float`` for ``float | None``, ``tuple``."""
    origin = typing.get_origin(hint)
    if origin is None:
        return cast(type, hint)
    if origin is tuple:
        return tuple
    (kind,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
    return cast(type, kind)


_KINDS = {name: _kind(hint) for name, hint in typing.get_type_hints(PipelineMetadata).items()}
"""Each field's plain Python type (``float`` for ``capture_ts``, which may also be ``None``)."""


def _built(**values: Any) -> PipelineMetadata:
    """A PipelineMetadata of ``values`` (every field, plain already), without ``__init__``."""
    fresh = _new(PipelineMetadata)
    fresh.__dict__.update(values)
    return fresh


def _plain(name: str, value: Any) -> Any:
    """``value`` as field ``name``'s plain type, or ``TypeError`` naming field and value."""
    kind = _KINDS[name]
    try:
        if kind is int:
            return operator.index(value)  # numpy integers, bools; not floats or strings
        if kind is bool:
            if value in (0, 1) and not isinstance(value, (str, bytes)):
                return bool(value)
        elif kind is float:
            if value is None:
                return None
            if isinstance(value, numbers.Real):
                return float(value)
        elif isinstance(value, Iterable):  # the timeline
            return tuple((_hop(hop), float(t)) for hop, t in value)
    except (TypeError, ValueError):
        pass
    rule = {
        int: "an integer",
        bool: "a bool",
        float: "a real number or None",
        tuple: "a sequence of (hop, time) pairs: a str and a real number each",
    }[kind]
    raise ArgumentTypeError(
        f"PipelineMetadata.{name} must be {rule}, got {value!r} ({type(value).__name__})"
    )


def _stamps_plain(timeline: Any) -> bool:
    """Whether every stamp of ``timeline`` is a plain ``(str, float)`` pair."""
    return all(map(_is_stamp, timeline))


def _is_stamp(stamp: Any) -> bool:
    """Whether ``stamp`` is a plain ``(str, float)`` pair."""
    return (
        type(stamp) is tuple
        and len(stamp) == 2
        and type(stamp[0]) is str
        and type(stamp[1]) is float
    )


def _hop(hop: Any) -> str:
    if type(hop) is not str:
        raise TypeError(hop)
    return hop


def merge_metadata(
    metadatas: Sequence[PipelineMetadata], stamps: Iterable[tuple[str, float]] = ()
) -> PipelineMetadata:
    """The N:1 rule: merge the metadata of the inputs that formed one output.

    The newest input correlation (``input_seq``/``input_at_ms`` of the newest tick: of the
    inputs that carry one, the latest ``input_at_ms``, the later position on ties; else the
    last input), the highest generations, ``cutover`` if any input had it, ``idle`` only if all
    were idle, the ``pts`` and ``capture_ts`` of the last input, and the timeline of the newest
    input plus ``stamps``.
    """
    if not metadatas:
        raise ArgumentError("merge_metadata needs at least one metadata, got none")
    last = metadatas[-1]
    newest: PipelineMetadata | None = None
    for md in metadatas:
        if md.input_seq and (newest is None or md.input_at_ms >= newest.input_at_ms):
            newest = md
    if newest is None:
        newest = last
    return _built(
        prompt_generation=max(md.prompt_generation for md in metadatas),
        flush_generation=max(md.flush_generation for md in metadatas),
        cutover=any(md.cutover for md in metadatas),
        drop_generation=max(md.drop_generation for md in metadatas),
        pts=last.pts,
        idle=all(md.idle for md in metadatas),
        capture_ts=last.capture_ts,
        input_seq=newest.input_seq,
        input_at_ms=newest.input_at_ms,
        timeline=newest.timeline + tuple(stamps),
    )
