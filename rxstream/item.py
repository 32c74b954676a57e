"""Items, their metadata, and the rules for stamping and merging metadata.

Every emission inside the engine is a :class:`PipelineItem`. Stage functions see payloads;
the stage shell keeps the metadata: 1:1 stages keep it and add their stamps, 1:N stages copy
it to every child, N:1 stages merge it with :func:`merge_metadata`.
"""

import contextlib
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

    # four slots and a weak reference's, no ``__dict__`` (see "the item's representation")
    __slots__ = ("__weakref__", "_md", "_st", "metadata", "payload")

    payload: Any
    metadata: PipelineMetadata

    def __post_init__(self) -> None:
        # an item made by its constructor: its metadata built (no base, no chain)
        if not isinstance(self.metadata, PipelineMetadata):
            raise ArgumentTypeError(
                f"PipelineItem.metadata must be a PipelineMetadata, got {self.metadata!r:.80} "
                f"({type(self.metadata).__name__})"
            )
        _set_md(self, None)
        _set_st(self, None)

    def __getattr__(self, name: str) -> Any:
        # Only for a slot with no value: a lazy item's ``metadata``, built on first read
        # from its base and chain, and kept; ``_md``/``_st`` of an item whose
        # ``__post_init__`` did not run (a subclass's own): no base, no chain.
        if name == "_md" or name == "_st":
            return None
        if name == "metadata":
            base = self._md
            if base is not None:
                metadata = _with_stamps(base, _unchain(self._st))
                _set_metadata(self, metadata)
                return metadata
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle, copy and deepcopy: the frozen slots refuse the default's setattr
        return _reduced(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


_new = object.__new__
_set_payload = PipelineItem.__dict__["payload"].__set__
_set_metadata = PipelineItem.__dict__["metadata"].__set__
_set_md = PipelineItem.__dict__["_md"].__set__
_set_st = PipelineItem.__dict__["_st"].__set__
"""The slots' own setters: the frozen class refuses ``item.x = ...``; the engine builds items
with these (a C call each, no ``__setattr__``)."""


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


def _trusted_metadata(
    prompt_generation: int,
    flush_generation: int,
    cutover: bool,
    drop_generation: int,
    pts: int,
    idle: bool,
    capture_ts: float | None,
    input_seq: int,
    input_at_ms: int,
    timeline: Timeline,
) -> PipelineMetadata:
    """A PipelineMetadata of every field, trusted: no ``__init__``, no checks.

    For values the engine made or checked itself (a source's generations and counters, a
    merge, what crossed a boundary): the frozen ``__init__`` and its checks cost several times
    this. Values from users go through ``PipelineMetadata(...)`` or :func:`evolve_metadata`.
    """
    fresh = _new(PipelineMetadata)
    state = fresh.__dict__
    state["prompt_generation"] = prompt_generation
    state["flush_generation"] = flush_generation
    state["cutover"] = cutover
    state["drop_generation"] = drop_generation
    state["pts"] = pts
    state["idle"] = idle
    state["capture_ts"] = capture_ts
    state["input_seq"] = input_seq
    state["input_at_ms"] = input_at_ms
    state["timeline"] = timeline
    return fresh


# --- the item's representation --------------------------------------------------------------
#
# Private to this module; every other module goes through the functions below. An item has
# four slots and no ``__dict__``: ``payload``; ``metadata``, set when built (made by the
# constructor, or read once); ``_md`` and ``_st``, the base metadata and the stamp chain
# gathered since (lazy: ``metadata`` unset until first read, then built and kept), both
# ``None`` on an item whose metadata was built from the start. A chain is ``None`` or a link
# ``(previous link, hop, t, hop, t…)``: one tuple per hop, never flattened on the way (about
# half the cost of a metadata copy per hop, and one object for the garbage collector to
# count, not four; docs/performance.md). Slots, not a ``__dict__``: one object an item, not
# two, made with three C calls (docs/decisions.md, "Items in slots").

Chain = tuple[Any, ...] | None
"""A stamp chain: opaque outside this module (made and read by the functions below)."""


def _item(payload: Any, metadata: PipelineMetadata) -> PipelineItem:
    """An item of ``payload`` and built ``metadata``, without the frozen ``__init__``."""
    fresh = _new(PipelineItem)
    _set_payload(fresh, payload)
    _set_metadata(fresh, metadata)
    _set_md(fresh, None)
    _set_st(fresh, None)
    return fresh


def _from_parts(payload: Any, base: PipelineMetadata, chain: Chain) -> PipelineItem:
    """An item of ``payload`` whose metadata is ``base`` plus the stamps of ``chain``."""
    fresh = _new(PipelineItem)
    _set_payload(fresh, payload)
    _set_md(fresh, base)
    _set_st(fresh, chain)
    return fresh


def _parts(item: PipelineItem) -> tuple[PipelineMetadata, Chain]:
    """``item``'s base metadata and stamp chain: :func:`_from_parts` of them is ``item`` again."""
    base = item._md
    if base is None:
        return item.metadata, None
    return base, item._st


def _base(item: PipelineItem) -> PipelineMetadata:
    """``item``'s metadata without the stamps of its latest hops: every field but the timeline
    is the item's own (what the per-hop checks read without building the metadata)."""
    base: PipelineMetadata | None = item._md
    return item.metadata if base is None else base


def _is_lazy(item: PipelineItem) -> bool:
    """Whether ``item``'s metadata is still its base and chain, not built yet (tests ask)."""
    try:
        _get_metadata(item)
    except AttributeError:
        return True
    return False


def _forward(
    item: PipelineItem, payload: Any, in_hop: str, started: float, out_hop: str, done: float
) -> PipelineItem:
    """The 1:1 rule for one hop: ``payload`` with ``item``'s metadata and the hop's stamps
    ``(in_hop, started)``, ``(out_hop, done)`` (the stage shell's path, once per item per
    stage: the metadata is not copied, the stamps are one link of the chain)."""
    base = item._md
    if base is None:
        base, link = item.metadata, None
    else:
        link = item._st
    fresh = _new(PipelineItem)
    _set_payload(fresh, payload)
    _set_md(fresh, base)
    _set_st(fresh, (link, in_hop, started, out_hop, done))
    return fresh


def _stamped(item: PipelineItem, payload: Any, stamps: tuple[Any, ...]) -> PipelineItem:
    """``payload`` with ``item``'s metadata plus ``stamps`` (the 1:1 rule, hot path).

    ``stamps`` is flat: ``hop, t, hop, t…``; they become one link of the chain (none if
    empty). :func:`_forward` is the same for one hop's two stamps.
    """
    base = item._md
    if base is None:
        base, link = item.metadata, None
    else:
        link = item._st
    fresh = _new(PipelineItem)
    _set_payload(fresh, payload)
    _set_md(fresh, base)
    _set_st(fresh, (link, *stamps) if stamps else link)
    return fresh


def _linked(item: PipelineItem, payload: Any, row: list[Any], first: int) -> PipelineItem:
    """``payload`` with ``item``'s metadata plus the stamps ``row[first + 1:]`` (flat: ``hop,
    t…``) as one link of the chain (a fused chain's stamps, written in place per item).

    ``row[first]`` is overwritten with ``item``'s link: the new link is ``row[first:]`` as
    one tuple, no other tuple made.
    """
    base = item._md
    if base is None:
        base, link = item.metadata, None
    else:
        link = item._st
    row[first] = link
    fresh = _new(PipelineItem)
    _set_payload(fresh, payload)
    _set_md(fresh, base)
    _set_st(fresh, tuple(row[first:] if first else row))
    return fresh


def _sourced(
    payload: Any,
    prompt_generation: int,
    flush_generation: int,
    cutover: bool,
    drop_generation: int,
    pts: int,
    input_seq: int,
    input_at_ms: int,
    origin: tuple[Any, ...],
    in_hop: str,
    started: float,
    out_hop: str,
    done: float,
) -> PipelineItem:
    """A source's new item and its metadata, trusted (as :func:`_trusted_metadata`'s: the
    fields given, not ``idle``, no ``capture_ts``, the timeline empty), in one call a pull;
    the stamps ``origin`` (flat, may be empty), ``(in_hop, started)``, ``(out_hop, done)``
    are the chain's first link."""
    metadata = _new(PipelineMetadata)
    fields = metadata.__dict__
    fields["prompt_generation"] = prompt_generation
    fields["flush_generation"] = flush_generation
    fields["cutover"] = cutover
    fields["drop_generation"] = drop_generation
    fields["pts"] = pts
    fields["idle"] = False
    fields["capture_ts"] = None
    fields["input_seq"] = input_seq
    fields["input_at_ms"] = input_at_ms
    fields["timeline"] = ()
    fresh = _new(PipelineItem)
    _set_payload(fresh, payload)
    _set_md(fresh, metadata)
    if origin:
        _set_st(fresh, (None, *origin, in_hop, started, out_hop, done))
    else:  # the common case, built without unpacking (~50 ns)
        _set_st(fresh, (None, in_hop, started, out_hop, done))
    return fresh


def _extended(chain: Chain, stamps: tuple[Any, ...]) -> Chain:
    """``chain`` with ``stamps`` (flat: ``hop, t…``) as one more link (``chain`` if none)."""
    return (chain, *stamps) if stamps else chain


def _chain_of(stamps: tuple[Any, ...]) -> Chain:
    """A chain of one link: ``stamps``, flat (``hop, t…``)."""
    return (None, *stamps)


def _flat(chain: Chain) -> tuple[Any, ...]:
    """The stamps of ``chain`` flat, oldest first: ``hop, t, hop, t…``."""
    parts = []
    while chain is not None:
        parts.append(chain[1:])
        chain = chain[0]
    return tuple(value for part in reversed(parts) for value in part)


def _unchain(chain: Chain) -> Timeline:
    """The stamps of ``chain``, oldest first, as ``(hop, t)`` pairs."""
    flat = _flat(chain)
    return tuple(zip(flat[::2], flat[1::2], strict=True))


def _reduced(item: PipelineItem) -> tuple[Any, ...]:
    """How pickle (and ``copy``/``deepcopy``) carries ``item``: made blank, then its slots set
    as they are (a lazy item stays lazy; the frozen class refuses the default's ``setattr``).
    A subclass's own slots and ``__dict__`` go too; the object exists before its state is
    copied, so a payload that refers back to its item deep-copies to the copy."""
    if type(item) is PipelineItem:
        state = {"payload": item.payload, "_md": item._md, "_st": item._st}
        with contextlib.suppress(AttributeError):  # unset on a lazy item: built on first read
            state["metadata"] = _get_metadata(item)
    else:
        state = dict(getattr(item, "__dict__", {}))
        for kind in type(item).__mro__:
            slots = kind.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__"):
                    with contextlib.suppress(AttributeError):  # a slot with no value
                        state[name] = object.__getattribute__(item, name)
    return _blank, (type(item),), state


def _blank(kind: type[PipelineItem]) -> PipelineItem:
    """An item of ``kind`` with no slot set (:func:`_reduced`'s state fills them)."""
    return _new(kind)


_get_metadata = PipelineItem.__dict__["metadata"].__get__


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
    newest = metadatas[_newest(metadatas)]
    return _trusted_metadata(
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


def _newest(metadatas: Sequence[PipelineMetadata]) -> int:
    """The index of the input whose correlation and timeline :func:`merge_metadata` keeps (of
    the inputs that carry an ``input_seq``, the latest ``input_at_ms``, the later position on
    ties; else the last input). ``window`` asks it for the arrival time of that input."""
    newest = len(metadatas) - 1
    best: PipelineMetadata | None = None
    for index, md in enumerate(metadatas):
        if md.input_seq and (best is None or md.input_at_ms >= best.input_at_ms):
            best, newest = md, index
    return newest
