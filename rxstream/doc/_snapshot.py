"""Immutable desired-state snapshots and the path references that read them.

A snapshot is a frozen nested mapping. ``Ref`` is a reference to one path: ``ref.value`` (or
``ref()``) reads it from the current root, ``ref.a`` / ``ref["a"]`` go deeper. A doc's refs
read its live snapshot; a snapshot's refs read that snapshot alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rxstream._exceptions import ArgumentTypeError, DocPathError

if TYPE_CHECKING:
    from reactivex import Observable

__all__ = ["Ref", "Snapshot", "freeze", "lookup", "thaw"]

Path = tuple[str, ...]


class Snapshot(Mapping[str, Any]):
    """A frozen nested mapping of the desired state; read ``s["a"]["b"]`` or ``s.a.b.value``."""

    __slots__ = ("_data", "_name", "_path")

    def __init__(self, data: Mapping[str, Any], name: str = "doc", path: Path = ()) -> None:
        self._data = dict(data)
        self._name = name
        self._path = path

    def __getitem__(self, key: str) -> Any:
        try:
            value = self._data[key]
        except KeyError:
            raise DocPathError(_missing(self._name, (*self._path, key), self)) from None
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __getattr__(self, key: str) -> Ref:
        if key.startswith("_"):
            raise AttributeError(key)
        root = self
        return Ref(lambda: root, self._name, (key,), None)

    def __repr__(self) -> str:
        return f"Snapshot({thaw(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Snapshot):
            return self._data == other._data
        if isinstance(other, Mapping):
            return thaw(self) == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, _hashable(v)) for k, v in self._data.items())))


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def freeze(data: Mapping[str, Any], name: str = "doc", path: Path = ()) -> Snapshot:
    """A deep :class:`Snapshot` of ``data`` (nested mappings become snapshots)."""
    return Snapshot(
        {
            key: freeze(value, name, (*path, key)) if isinstance(value, Mapping) else value
            for key, value in data.items()
        },
        name,
        path,
    )


def thaw(data: Mapping[str, Any]) -> dict[str, Any]:
    """A plain nested ``dict`` copy of a snapshot (for JSON, merging, validation)."""
    return {
        key: thaw(value) if isinstance(value, Mapping) else value for key, value in data.items()
    }


def lookup(root: Mapping[str, Any], path: Path, name: str = "doc") -> Any:
    """The value at ``path`` under ``root``; :class:`DocPathError` when it does not exist."""
    node: Any = root
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping) or key not in node:
            raise DocPathError(_missing(name, path[: depth + 1], node))
        node = node[key]
    return node


def _missing(name: str, path: Path, parent: Any) -> str:
    where = ".".join((name, *path))
    if isinstance(parent, Mapping):
        keys = ", ".join(sorted(parent)) or "none"
        return f"{where} does not exist; the keys there are: {keys}"
    return f"{where} does not exist; {'.'.join((name, *path[:-1]))} is a value, not a section"


class Ref:
    """A reference to one path of a desired state.

    ``value`` (or calling the ref) is the cheap inline read; ``get(default)`` reads with a
    fallback; ``changes`` is an Observable of the path's distinct values (doc refs only).
    A key that clashes with these names is reached with ``ref["value"]``.
    """

    __slots__ = ("_changes", "_name", "_path", "_root")

    def __init__(
        self,
        root: Callable[[], Mapping[str, Any]],
        name: str,
        path: Path,
        changes: Callable[[Path], Observable[Any]] | None,
    ) -> None:
        self._root = root
        self._name = name
        self._path = path
        self._changes = changes

    @property
    def path(self) -> Path:
        """The keys from the root to this ref."""
        return self._path

    @property
    def dotted(self) -> str:
        """The path as ``a.b.c``."""
        return ".".join(self._path)

    @property
    def value(self) -> Any:
        """The value at this path now (a :class:`Snapshot` for a section)."""
        return lookup(self._root(), self._path, self._name)

    def __call__(self) -> Any:
        return self.value

    def get(self, default: Any = None) -> Any:
        """The value at this path, or ``default`` when the path does not exist."""
        try:
            return self.value
        except DocPathError:
            return default

    @property
    def changes(self) -> Observable[Any]:
        """The path's current value, then each distinct new value as writes happen."""
        if self._changes is None:
            raise ArgumentTypeError(
                f"{self._name}.{self.dotted} reads a snapshot, which never changes"
            )
        return self._changes(self._path)

    def __getattr__(self, key: str) -> Ref:
        if key.startswith("_"):
            raise AttributeError(key)
        return Ref(self._root, self._name, (*self._path, key), self._changes)

    def __getitem__(self, key: str) -> Ref:
        return Ref(self._root, self._name, (*self._path, key), self._changes)

    def __repr__(self) -> str:
        return f"<Ref {self._name}.{self.dotted}>"
