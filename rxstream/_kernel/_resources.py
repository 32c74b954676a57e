"""What an app declares expensive to make (weights, kernels): ``ctx.resource(name, loader)``.

A :class:`Resource` is a handle, made at once and cheaply where the app builds its graph; its
value is made by calling ``loader()``, once per process, the first time it is needed: at the
start of a run whose stages on this rank read it (the run loads it before the stage's first
item, :func:`load_for`), or at the first :meth:`Resource.get` otherwise. A build that only
composes (the launcher's check of the app, a rank that runs none of its readers) loads
nothing. Handles live in one registry per process, by name, so the value outlives the
context, the pipeline and the run that made it: a worker that runs one session after another
loads its model once. A ``ctx.self_test()`` block reads a handle's ``stand_in`` instead
(:func:`self_testing`): the check loads no model where it drives stages of other ranks.

Which stages read a resource is found in what a stage is made from (:func:`resources_in`): the
stage's function or object, what its closure, defaults and the globals its code loads hold
(only the attributes it reads off them, where it reads ``holder.attribute``), a
``functools.partial``'s arguments, an object's attributes, slots and class attributes, a
``doc.bind`` construct's, a few levels deep, nearest first (the first 256 items of a
container, 4096 items in all). A builder's ``uses=`` replaces the scan. A resource reached in
another way is still loaded, at its first ``get()``, on the stage's thread.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import itertools
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from rxstream._exceptions import (
    ArgumentError,
    ArgumentTypeError,
    PipelineStateError,
    ResourceError,
)
from rxstream._util import library_logger

__all__ = ["Loading", "Resource", "declare", "load_for", "resources_in", "self_testing"]

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
    (other threads asking meanwhile wait for that one load), then a plain read. Under a
    ``ctx.self_test()`` block a handle with a ``stand_in`` gives ``stand_in()``'s value
    instead (made once, never the real load).
    """

    __slots__ = (
        "_lock",
        "_released",
        "_stand_in_value",
        "_value",
        "load_s",
        "loader",
        "loads",
        "name",
        "stand_in",
    )

    def __init__(
        self, name: str, loader: Callable[[], T], stand_in: Callable[[], T] | None = None
    ) -> None:
        self.name = name
        """The resource's name, unique in the process."""
        self.loader = loader
        """What makes the value (called with no argument)."""
        self.stand_in = stand_in
        """What a self test reads instead (``None``: the real value, loaded where driven)."""
        self.load_s: float | None = None
        """How long the load took, in seconds (``None``: not loaded in this process)."""
        self.loads = 0
        """How many loads of this handle finished in this process: 0 or 1 (a released
        handle is done with: the next ``ctx.resource`` makes a new one)."""
        self._lock = threading.Lock()
        self._value: Any = _UNSET
        self._stand_in_value: Any = _UNSET
        self._released = False

    def __repr__(self) -> str:
        if self._released:
            return f"<Resource {self.name!r} released>"
        state = "unloaded" if self._value is _UNSET else f"loaded in {self.load_s:.3f} s"
        return f"<Resource {self.name!r} {state}>"

    @property
    def loaded(self) -> bool:
        """Whether the value is made in this process."""
        return self._value is not _UNSET

    def get(self) -> T:
        """The value, made by ``loader()`` if this process has not made it yet.

        A loader that raises raises :class:`~rxstream.ResourceError` naming the resource
        (nothing is kept: the next ``get()`` tries again); a released handle raises
        :class:`~rxstream.PipelineStateError` (its value would be a second live copy).
        """
        value = self._value
        if value is not _UNSET:
            return value  # type: ignore[no-any-return]
        if _self_tests and self.stand_in is not None:
            return self._stand_in()
        return self._load((), None)

    __call__ = get

    def _stand_in(self) -> T:
        with self._lock:
            if self._stand_in_value is _UNSET:
                try:
                    self._stand_in_value = self.stand_in()  # type: ignore[misc]
                except Exception as exc:
                    raise ResourceError(self.name, _label(self.stand_in), exc) from exc
            return self._stand_in_value  # type: ignore[no-any-return]

    def _load(self, stages: tuple[str, ...], rank: int | None) -> T:
        """The value, loaded here if not yet; ``resource_loaded`` names ``stages`` (the
        stages of ``rank`` that read it) when a run's loading made it."""
        with self._lock:  # one load: a second stage asking meanwhile waits for it
            if self._released:
                raise PipelineStateError(
                    f"resource {self.name!r} was released: its handle is done with; read the "
                    f"handle that ctx.resource({self.name!r}, ...) makes again"
                )
            if self._value is _UNSET:
                started = time.monotonic()
                try:
                    made = self.loader()
                except Exception as exc:
                    raise ResourceError(self.name, _label(self.loader), exc) from exc
                self.load_s = time.monotonic() - started
                self.loads += 1
                self._value = made
                where: dict[str, object] = {"stages": list(stages)} if stages else {}
                if rank is not None:
                    where["rank"] = rank
                seconds = round(self.load_s, 3)
                _log.info(
                    "resource_loaded", resource=self.name, seconds=seconds, pid=os.getpid(), **where
                )
            return self._value  # type: ignore[no-any-return]

    def release(self) -> None:
        """Drop the value (calling its ``close()`` when it has one) and free the name: the next
        ``ctx.resource(name, …)`` makes a new handle, with any loader. This handle is done
        with: its ``get()`` raises :class:`~rxstream.PipelineStateError` from now on."""
        with self._lock:
            value, self._value = self._value, _UNSET
            self._stand_in_value = _UNSET
            self._released = True
            self.load_s = None
        with _registry_lock:
            if _registry.get(self.name) is self:
                del _registry[self.name]
        close = getattr(value, "close", None) if value is not _UNSET else None
        if callable(close):
            close()


_UNSET: Any = object()
_self_tests = 0
"""How many ``ctx.self_test()`` blocks run in this process (:func:`self_testing`)."""


@contextlib.contextmanager
def self_testing() -> Iterator[None]:
    """While a ``ctx.self_test()`` block runs: handles with a ``stand_in`` give its value."""
    global _self_tests
    with _registry_lock:
        _self_tests += 1
    try:
        yield
    finally:
        with _registry_lock:
            _self_tests -= 1


def declare(
    name: str, loader: Callable[[], T], stand_in: Callable[[], T] | None = None
) -> Resource[T]:
    """The process's resource ``name``, made by ``loader``: the handle already registered
    under the name when the same loader made it (a build run again, in any context), else a
    new one. The same loader is the same function (the same place in the source: each build's
    fresh closure over it, or the app's module imported again, count as the same) with equal
    closure values and defaults (a value without an ``==`` of its own, a context or a doc,
    counts as equal to another of its type), a ``functools.partial`` of it with equal
    arguments, or an equal object; another loader, or the same one over other values (a
    build run again with another path), is refused (:class:`~rxstream.ArgumentError`)."""
    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"resource name must be a non-empty str, got {name!r}")
    for role, given in (("loader", loader), ("stand_in", stand_in)):
        if (role == "loader" or given is not None) and not callable(given):
            raise ArgumentTypeError(
                f"resource {name!r}: {role} must be a callable of no argument, got "
                f"{type(given).__name__} {given!r}"
            )
    with _registry_lock:
        known = _registry.get(name)
        if known is None:
            made: Resource[T] = Resource(name, loader, stand_in)
            _registry[name] = made
            return made
    differs = _differs(known.loader, loader)
    if differs is not None:
        raise ArgumentError(
            f"resource {name!r} is made by {_label(known.loader)} in this process; a second "
            f"loader {_label(loader)}{differs} cannot take the name: give it a name of its "
            f"own{_OR_RELEASE if differs else ''}"
        )
    if known.stand_in is None:
        known.stand_in = stand_in
    return known


_OR_RELEASE = " (the value in it: a name per path) or release() the first handle"


def _differs(a: object, b: object) -> str | None:
    """``None`` when ``a`` and ``b`` are the same loader, else what differs (``""``: the
    loaders themselves; ``" over path='new.pt' (was 'old.pt')"``: a value they hold)."""
    if a is b:
        return None
    if isinstance(a, types.FunctionType) and isinstance(b, types.FunctionType):
        return "" if _where(a) != _where(b) else _held_differs(a, b)
    if isinstance(a, types.MethodType) and isinstance(b, types.MethodType):
        same = a.__self__ is b.__self__ and _differs(a.__func__, b.__func__) is None
        return None if same else ""
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        inner = _differs(a.func, b.func)
        if inner is not None:
            return inner
        if not _equal(a.args, b.args):
            return f" over arguments {b.args!r} (was {a.args!r})"
        if not _equal(a.keywords, b.keywords):
            return f" over keywords {b.keywords!r} (was {a.keywords!r})"
        return None
    return None if _equal(a, b) else ""


def _held_differs(a: types.FunctionType, b: types.FunctionType) -> str | None:
    """What differs in the values two closures of one function hold: a closure cell's, a
    default's (by name); ``None`` when nothing does."""
    held_a, held_b = _held(a), _held(b)
    for name, value in held_b.items():
        if name in held_a and not _alike(held_a[name], value):
            return f" over {name}={_short(value)} (was {_short(held_a[name])})"
    return None


def _held(function: types.FunctionType) -> dict[str, object]:
    code = function.__code__
    held: dict[str, object] = {}
    for name, cell in zip(code.co_freevars, function.__closure__ or (), strict=False):
        if _full(cell):
            held[name] = cell.cell_contents
    names = code.co_varnames[: code.co_argcount]
    for name, value in zip(
        names[len(names) - len(function.__defaults__ or ()) :],
        function.__defaults__ or (),
        strict=False,
    ):
        held[name] = value
    held.update(function.__kwdefaults__ or {})
    return held


def _alike(a: object, b: object) -> bool:
    """Whether two values a loader holds count as the same: equal, of one type that has no
    ``==`` of its own (a fresh context, doc or function per build), or that ``==`` cannot
    compare (arrays)."""
    if a is b:
        return True
    if isinstance(a, types.FunctionType) and isinstance(b, types.FunctionType):
        return _differs(a, b) is None
    if type(a) is type(b) and type(a).__eq__ is object.__eq__:
        return True
    try:
        return bool(a == b)
    except Exception:  # an == that cannot answer (arrays): not told apart
        return True


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
    itself, its closure, defaults and the globals its code loads, a partial's arguments, an
    object's attributes (its instance dict, its slots, its class's attributes along the MRO
    that are not functions), containers of them, to a few levels deep, nearest first, looking
    at ``_BUDGET`` items at most; in the order found."""
    found: dict[int, Resource[Any]] = {}
    seen: set[int] = set()
    left = _BUDGET
    level: list[object] = list(made_from)
    for _ in range(_DEPTH + 1):  # breadth first: what a stage holds itself before the rest
        deeper: list[object] = []
        for value in level:
            left -= 1  # every item looked at counts, a plain number as much as a dict
            if left < 0:
                return tuple(found.values())
            if isinstance(value, Resource):
                found.setdefault(id(value), value)
            elif not _opaque(value) and id(value) not in seen:
                seen.add(id(value))
                deeper.extend(itertools.islice(_reached(value), max(0, left - len(deeper))))
        level = deeper
    return tuple(found.values())


_BUDGET = 4096
"""How many items one :func:`resources_in` looks at, at most: a stage whose globals hold a
big nested table is scanned in about a millisecond, not tens (a resource past it is still
loaded, at its first ``get()``; ``uses=`` names it)."""


def _opaque(value: object) -> bool:
    """What holds no resource worth looking in: plain values, modules, builtins, and the
    engine's own objects (a context, a doc, a stage a function reads: each stage is scanned
    on its own)."""
    return (
        value is None
        or isinstance(
            value,
            str
            | bytes
            | int
            | float
            | complex
            | bool
            | types.ModuleType
            | types.BuiltinFunctionType,
        )
        or _engine_own(type(value))
    )


def _engine_own(kind: type) -> bool:
    return kind.__module__.startswith("rxstream.") and kind is not Resource


def _reached(value: object) -> Iterable[object]:
    if isinstance(value, types.FunctionType):
        code = value.__code__
        reads = _names_read(code)
        cells = zip(code.co_freevars, value.__closure__ or (), strict=False)
        for name, cell in cells:
            if _full(cell):
                yield from _read(cell.cell_contents, reads.get(name))
        yield from value.__defaults__ or ()
        yield from (value.__kwdefaults__ or {}).values()
        scope = value.__globals__
        for name, attributes in reads.items():
            if name in scope and name not in code.co_freevars:
                yield from _read(scope[name], attributes)
    elif isinstance(value, types.MethodType):
        yield value.__func__
        yield value.__self__
    elif isinstance(value, functools.partial):
        yield value.func
        yield from value.args
        yield from value.keywords.values()
    elif isinstance(value, staticmethod | classmethod):
        yield value.__func__
    elif isinstance(value, list | tuple | set | frozenset):
        yield from itertools.islice(value, _ITEMS)
    elif isinstance(value, Mapping):
        yield from itertools.islice(value.values(), _ITEMS)
    elif isinstance(value, type):
        yield from _class_attributes(value)
    else:
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            yield from itertools.islice(attributes.values(), _ITEMS)
        yield from _slot_values(value)
        yield type(value)  # its class's attributes (``Dec.model = res`` read as self.model)


def _class_attributes(cls: type) -> Iterable[object]:
    """A class's own attributes along its MRO (not ``object``'s, not a builtin type's): the
    values (not its plain functions, which are its methods: a callable object's
    ``__call__`` and a classmethod's function are looked into), a classmethod's function."""
    if cls.__module__ == "builtins":
        return
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            continue
        for name, attribute in itertools.islice(vars(klass).items(), _ITEMS):
            if name.startswith("__") and name != "__call__":
                continue
            if isinstance(attribute, types.FunctionType) and name != "__call__":
                continue
            yield attribute


def _slot_values(value: object) -> Iterable[object]:
    for klass in type(value).__mro__:
        slots = vars(klass).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            try:
                yield object.__getattribute__(value, slot)
            except AttributeError:  # an unset slot
                continue


def _full(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _names_read(code: types.CodeType) -> dict[str, frozenset[str] | None]:
    """The global and closure names ``code`` and the functions defined in it load
    (``LOAD_GLOBAL``, ``LOAD_DEREF``; ``LOAD_NAME`` of a module's code), each with the
    attributes read off it when it is only ever read as ``name.attribute`` (``None``: read
    whole). Not its attribute names: ``x.a`` reads no global ``a``. Cached by code object: a
    bind's rebuild scans the same code again."""
    reads: dict[str, frozenset[str] | None] = {}
    instructions = list(dis.get_instructions(code))
    for at, instruction in enumerate(instructions):
        if instruction.opname not in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF"):
            continue
        name = str(instruction.argval)
        after = instructions[at + 1] if at + 1 < len(instructions) else None
        if after is not None and after.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            if name not in reads or reads[name] is not None:
                reads[name] = (reads.get(name) or frozenset()) | {str(after.argval)}
        else:
            reads[name] = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            for name, attributes in _names_read(const).items():
                known = reads.get(name, frozenset())
                reads[name] = None if known is None or attributes is None else known | attributes
    return reads


def _read(value: object, attributes: frozenset[str] | None) -> Iterable[object]:
    """What a function reaches through a name holding ``value``: the value, or only the
    ``attributes`` it reads off it (``models.vae``: not ``models.unet``) where they are plain
    attributes (a property, or one not found, counts as the whole value)."""
    if attributes is None or isinstance(value, Resource | types.ModuleType):
        yield value  # a module's attribute is found among its functions' globals instead
        return
    for attribute in sorted(attributes):
        try:
            found = inspect.getattr_static(value, attribute)
        except AttributeError:
            yield value
            return
        if isinstance(found, types.MemberDescriptorType):  # a slot
            found = getattr(value, attribute, value)
        elif hasattr(type(found), "__get__") and not isinstance(found, Resource):
            yield value  # a method, a property: what it reads off the value is not seen here
            return
        yield found


# --- loading them where they run -------------------------------------------------------------


class Loading:
    """The loads of a run's resources, each on a thread of its own (:func:`load_for`).

    Each loading thread runs on the CUDA device current where the loading was made (the
    rank's: ``torch.cuda.set_device`` holds for the thread that called it), when this process
    has torch imported and CUDA initialised."""

    def __init__(
        self, needed: Mapping[Resource[Any], tuple[str, ...]], rank: int | None = None
    ) -> None:
        self.failure: tuple[str, BaseException] | None = None
        """The first load that failed: (the stage that needed it, its error)."""
        self._rank = rank
        self._lock = threading.Lock()
        self._done = threading.Event()
        todo = [
            (resource, stages)
            for resource, stages in needed.items()
            if not resource.loaded and not (_self_tests and resource.stand_in is not None)
        ]
        self._pending = {resource.name: None for resource, _ in todo}
        if not todo:
            self._done.set()
        device = _cuda_device()
        self._threads = [
            threading.Thread(
                target=self._load,
                args=(resource, stages, device),
                name=f"rxstream:load:{resource.name}",
                daemon=True,
            )
            for resource, stages in todo
        ]
        for thread in self._threads:
            thread.start()

    def _load(self, resource: Resource[Any], stages: tuple[str, ...], device: int | None) -> None:
        try:
            if device is not None:
                sys.modules["torch"].cuda.set_device(device)
            resource._load(stages, self._rank)
        except BaseException as exc:
            with self._lock:
                if self.failure is None:
                    self.failure = (stages[0], exc)
        finally:
            with self._lock:
                del self._pending[resource.name]
                if not self._pending:
                    self._done.set()

    @property
    def pending(self) -> tuple[str, ...]:
        """The names of the resources still loading."""
        with self._lock:
            return tuple(self._pending)

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


def _cuda_device() -> int | None:
    """The current CUDA device of the calling thread, when torch is imported and CUDA
    initialised here (never imports torch, never initialises CUDA)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    return int(cuda.current_device())


def load_for(
    stages: Iterable[tuple[str, Iterable[Resource[Any]]]], rank: int | None = None
) -> Loading:
    """Start loading, in parallel, the resources read by ``stages`` (name, resources) of
    ``rank`` that are not loaded yet in this process (a self test's stand-ins are not)."""
    needed: dict[Resource[Any], tuple[str, ...]] = {}
    for stage, resources in stages:
        for resource in resources:
            needed[resource] = (*needed.get(resource, ()), stage)
    return Loading(needed, rank)
