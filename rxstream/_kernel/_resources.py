"""What an app declares expensive to make (weights, kernels): ``ctx.resource(name, loader)``.

A :class:`Resource` is a handle, made at once and cheaply where the app builds its graph; its
value is made by calling ``loader()``, once per process, the first time it is needed: at the
start of a run whose stages on this rank read it (the run loads it before the stage's first
item, :func:`load_for`), or at the first :meth:`Resource.get` otherwise. A build that only
composes (the launcher's check of the app, a rank that runs none of its readers) loads
nothing. Handles live in one registry per process, by name, so the value outlives the
context, the pipeline and the run that made it: a worker that runs one session after another
loads its model once.

Which stages read a resource is found in what a stage is made from (:func:`resources_in`): the
stage's function or object, what its closure, defaults and the globals its code names hold,
a ``functools.partial``'s arguments, a callable object's attributes, a ``doc.bind``
construct's, a few levels deep (the first 256 items of a container). A resource reached in
another way is still loaded, at its first ``get()``, on the stage's thread.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from rxstream._exceptions import ArgumentError, ArgumentTypeError, ResourceError
from rxstream._util import library_logger

__all__ = ["Resource", "declare", "load_for", "resources_in"]

T = TypeVar("T")

_log = library_logger("rxstream")
_registry: dict[str, Resource[Any]] = {}
_registry_lock = threading.Lock()
_DEPTH = 4
"""How many levels deep :func:`resources_in` looks (a stage's function, what it calls, …)."""
_ITEMS = 256
"""How many items of a container (a list, a dict's values) it looks at: a stage's lookup table
of a million numbers is no place for a model's handle."""


class Resource(Generic[T]):
    """A value made once per process by ``loader()``, when first needed; made by
    ``ctx.resource(name, loader)``.

    ``get()`` (or calling the handle) is the value: made by the first call in this process
    (other threads asking meanwhile wait for that one load), then a plain read.
    """

    __slots__ = ("_lock", "_value", "load_s", "loader", "loads", "name")

    def __init__(self, name: str, loader: Callable[[], T]) -> None:
        self.name = name
        """The resource's name, unique in the process."""
        self.loader = loader
        """What makes the value (called with no argument)."""
        self.load_s: float | None = None
        """How long the load took, in seconds (``None``: not loaded in this process)."""
        self.loads = 0
        """How many loads finished in this process (1 once loaded; 2 after a release)."""
        self._lock = threading.Lock()
        self._value: Any = _UNSET

    def __repr__(self) -> str:
        state = "unloaded" if self._value is _UNSET else f"loaded in {self.load_s:.3f} s"
        return f"<Resource {self.name!r} {state}>"

    @property
    def loaded(self) -> bool:
        """Whether the value is made in this process."""
        return self._value is not _UNSET

    def get(self) -> T:
        """The value, made by ``loader()`` if this process has not made it yet.

        A loader that raises raises :class:`~rxstream.ResourceError` naming the resource
        (nothing is kept: the next ``get()`` tries again).
        """
        value = self._value
        if value is not _UNSET:
            return value  # type: ignore[no-any-return]
        with self._lock:  # one load: a second stage asking meanwhile waits for it
            if self._value is _UNSET:
                started = time.monotonic()
                try:
                    made = self.loader()
                except Exception as exc:
                    raise ResourceError(self.name, _label(self.loader), exc) from exc
                self.load_s = time.monotonic() - started
                self.loads += 1
                self._value = made
                seconds = round(self.load_s, 3)
                _log.info("resource_loaded", resource=self.name, seconds=seconds, pid=os.getpid())
            return self._value  # type: ignore[no-any-return]

    __call__ = get

    def release(self) -> None:
        """Drop the value (calling its ``close()`` when it has one) and free the name: the next
        ``ctx.resource(name, …)`` makes a new handle, with any loader."""
        with self._lock:
            value, self._value = self._value, _UNSET
            self.load_s = None
        with _registry_lock:
            if _registry.get(self.name) is self:
                del _registry[self.name]
        close = getattr(value, "close", None) if value is not _UNSET else None
        if callable(close):
            close()


_UNSET: Any = object()


def declare(name: str, loader: Callable[[], T]) -> Resource[T]:
    """The process's resource ``name``, made by ``loader``: the handle already registered
    under the name when the same loader made it (a build run again, in any context), else a
    new one. The same loader is the same function (the same place in the source: each build's
    fresh closure over it, or the app's module imported again, count as the same), a
    ``functools.partial`` of it with equal arguments, or an equal object; another loader
    under a taken name is refused (:class:`~rxstream.ArgumentError`)."""
    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"resource name must be a non-empty str, got {name!r}")
    if not callable(loader):
        raise ArgumentTypeError(
            f"resource {name!r}: loader must be a callable of no argument, got "
            f"{type(loader).__name__} {loader!r}"
        )
    with _registry_lock:
        known = _registry.get(name)
        if known is None:
            made: Resource[T] = Resource(name, loader)
            _registry[name] = made
            return made
    if not _same_loader(known.loader, loader):
        raise ArgumentError(
            f"resource {name!r} is made by {_label(known.loader)} in this process; a second "
            f"loader {_label(loader)} cannot take the name: give it a name of its own"
        )
    return known


def _same_loader(a: object, b: object) -> bool:
    if a is b:
        return True
    if isinstance(a, types.FunctionType) and isinstance(b, types.FunctionType):
        return _where(a) == _where(b)
    if isinstance(a, types.MethodType) and isinstance(b, types.MethodType):
        return _same_loader(a.__func__, b.__func__) and a.__self__ is b.__self__
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return _same_loader(a.func, b.func) and _equal((a.args, a.keywords), (b.args, b.keywords))
    return _equal(a, b)


def _where(function: types.FunctionType) -> tuple[str, str, int]:
    """A function's place in the source: the same for each build's fresh closure over it and
    for the app's module imported again."""
    code = function.__code__
    return function.__qualname__, code.co_filename, code.co_firstlineno


def _equal(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an == that raises (arrays): not the same
        return False


def _label(loader: object) -> str:
    """``load_vae (app.py:12)`` (a lambda in ``build``: ``build.<lambda> (app.py:3)``), or
    the loader's repr."""
    target = loader.func if isinstance(loader, functools.partial) else loader
    code = getattr(target, "__code__", None)
    name = str(getattr(target, "__qualname__", None) or repr(target)).replace(".<locals>", "")
    if code is None:
        return name
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


# --- which stages read which resources -------------------------------------------------------


def resources_in(*made_from: object) -> tuple[Resource[Any], ...]:
    """The resources that ``made_from`` (a stage's function, object or construct) reaches: in
    itself, its closure, defaults and the globals its code names, a partial's arguments, an
    object's attributes, containers of them, to a few levels deep; in the order found."""
    found: dict[int, Resource[Any]] = {}
    seen: set[int] = set()
    for start in made_from:
        _scan(start, _DEPTH, found, seen)
    return tuple(found.values())


def _scan(value: object, depth: int, found: dict[int, Resource[Any]], seen: set[int]) -> None:
    if isinstance(value, Resource):
        found.setdefault(id(value), value)
        return
    if depth <= 0 or id(value) in seen or _opaque(value):
        return
    seen.add(id(value))
    for inner in _reached(value):
        _scan(inner, depth - 1, found, seen)


def _opaque(value: object) -> bool:
    """What holds no resource worth looking in: plain values, modules, classes, builtins."""
    return value is None or isinstance(
        value,
        str
        | bytes
        | int
        | float
        | complex
        | bool
        | type
        | types.ModuleType
        | types.BuiltinFunctionType,
    )


def _reached(value: object) -> Iterable[object]:
    if isinstance(value, types.FunctionType):
        yield from (cell.cell_contents for cell in value.__closure__ or () if _full(cell))
        yield from value.__defaults__ or ()
        yield from (value.__kwdefaults__ or {}).values()
        scope = value.__globals__
        yield from (scope[name] for name in _names(value.__code__) if name in scope)
    elif isinstance(value, types.MethodType):
        yield value.__func__
        yield value.__self__
    elif isinstance(value, functools.partial):
        yield value.func
        yield from value.args
        yield from value.keywords.values()
    elif isinstance(value, list | tuple | set | frozenset):
        yield from itertools.islice(value, _ITEMS)
    elif isinstance(value, Mapping):
        yield from itertools.islice(value.values(), _ITEMS)
    else:
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            yield from attributes.values()
        call = inspect.getattr_static(type(value), "__call__", None)  # a callable object's
        if isinstance(call, types.FunctionType):
            yield call


def _full(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def _names(code: types.CodeType) -> Iterable[str]:
    """The global names ``code`` and the functions defined in it read."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


# --- loading them where they run -------------------------------------------------------------


class Loading:
    """The loads of a run's resources, each on a thread of its own (:func:`load_for`)."""

    def __init__(self, needed: Mapping[Resource[Any], str]) -> None:
        self.failure: tuple[str, BaseException] | None = None
        """The first load that failed: (the stage that needed it, its error)."""
        self._left = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        todo = [(resource, stage) for resource, stage in needed.items() if not resource.loaded]
        self._left = len(todo)
        if not todo:
            self._done.set()
        self._threads = [
            threading.Thread(
                target=self._load,
                args=(resource, stage),
                name=f"rxstream:load:{resource.name}",
                daemon=True,
            )
            for resource, stage in todo
        ]
        for thread in self._threads:
            thread.start()

    def _load(self, resource: Resource[Any], stage: str) -> None:
        try:
            resource.get()
        except BaseException as exc:
            with self._lock:
                if self.failure is None:
                    self.failure = (stage, exc)
        finally:
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every load ended (loaded or failed: see :attr:`failure`); whether they
        had within ``timeout`` seconds."""
        return self._done.wait(timeout)

    def join(self, timeout: float) -> bool:
        """Join the loading threads within ``timeout`` seconds; whether they all ended."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)


def load_for(stages: Iterable[tuple[str, Iterable[Resource[Any]]]]) -> Loading:
    """Start loading, in parallel, the resources read by ``stages`` (name, resources) that are
    not loaded yet in this process; each is named by the first stage that reads it."""
    needed: dict[Resource[Any], str] = {}
    for stage, resources in stages:
        for resource in resources:
            needed.setdefault(resource, stage)
    return Loading(needed)
