"""Small helpers the packages share; nothing here is public."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TextIO, cast

import structlog

__all__ = [
    "LibraryLogger",
    "StdoutGuard",
    "finite_only",
    "fixup_module_metadata",
    "library_logger",
    "lone_surrogate",
]


def fixup_module_metadata(
    name: str, namespace: Mapping[str, object], names: Iterable[str] | None = None
) -> None:
    """Make the classes and functions a public package exports say that package's name.

    Called at the end of a public package's ``__init__`` (``fixup_module_metadata(__name__,
    globals())``), so reprs, ``help()``, docs and pickles say ``rxstream.transport.Tee``, not
    ``rxstream.transport._tee.Tee``. For each name of ``names`` (default: the namespace's
    ``__all__``) that is a class or a function, ``__module__`` is rewritten when it is a
    private module (a dotted part starting with ``_``) or a public package below ``name``: so
    the shallowest package that exports an object names it, whichever package runs first
    (``rxstream.Doc``, not ``rxstream.doc.Doc``), and a class one package only re-exports from
    another public package (``rxstream.testing.MemoryTransport``) keeps its own.
    (trio's ``_util.fixup_module_metadata``.)
    """
    if names is None:
        names = cast("Iterable[str]", namespace["__all__"])
    for attr in names:
        obj = namespace.get(attr)
        if not isinstance(obj, (type, types.FunctionType)):
            continue
        current = obj.__module__
        if not current.startswith("rxstream"):
            continue
        private = any(part.startswith("_") for part in current.split("."))
        if private or current.startswith(f"{name}."):
            if isinstance(obj, type):
                _resolve_annotations(obj)
            obj.__module__ = name


def _resolve_annotations(cls: type) -> None:
    """Evaluate ``cls``'s string annotations where they were written, before its module moves.

    ``typing.get_type_hints`` resolves a class's annotations in the globals of the module its
    ``__module__`` names, which lacks the names the private module imported; evaluated once
    here, they need no module. Annotations that cannot be evaluated now (a name imported only
    for type checking) stay strings.
    """
    own = inspect.get_annotations(cls)
    if not own:
        return
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except (NameError, TypeError):
        return
    cls.__annotations__ = {key: hints.get(key, value) for key, value in own.items()}


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (what ``json.loads`` makes of
    ``"\\ud800"``: a string Python holds but UTF-8 cannot encode), ``None`` when it is valid
    Unicode. The session, the docs and the client streams refuse such strings."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def finite_only(value: Any, places: list[str], path: str = "") -> Any:
    """``value`` (JSON-like: mappings, lists, tuples, scalars) with every non-finite float
    replaced by ``None``, the path of each (``a.b[2]``, ``$`` for the value itself) appended to
    ``places``: what JSON can carry, and where it could not (the log's and the page's
    renderers)."""
    if isinstance(value, float) and not math.isfinite(value):
        places.append(path or "$")
        return None
    if isinstance(value, Mapping):
        return {
            k: finite_only(v, places, f"{path}.{k}" if path else str(k)) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [finite_only(v, places, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


class StdoutGuard:
    """``sys.stdout`` while ``rxstream run`` runs, in the controller and in every spawned rank
    (``rank_main``): once its reader left (``| head -1``), what the app or the summary prints
    goes to devnull, and the run goes on to its end — the file finished, every rank stopped —
    instead of a stage failing at the next ``print`` with ``BrokenPipeError``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._silence()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _silence(self) -> None:
        """Point stdout's descriptor at devnull: the pending bytes and the exit's flush go there."""
        self.broken = True
        with contextlib.suppress(OSError, ValueError):  # a stream without a descriptor
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.stream.fileno())
            finally:
                os.close(devnull)


class _Stderr:
    """The quiet default's output: each line to the ``sys.stderr`` of the moment."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    warning = error = critical = exception = msg


class LibraryLogger:
    """One of rxstream's loggers (:func:`library_logger`): a library prints nothing unasked.

    Once structlog is configured (by :func:`rxstream.timing.configure_logging`, by
    ``rxstream run``, or by the app's own ``structlog.configure``) it is structlog's logger of
    that name, so every event goes where that configuration says. Until then its default drops
    debug and info events (the ``[timing:<stream>]`` records, ``self_test_passed``: a script
    driving a pipeline prints nothing) and writes warnings and errors to stderr as one text
    line each. structlog's global configuration is never touched.
    """

    __slots__ = ("_configured", "_quiet")

    def __init__(self, name: str) -> None:
        self._configured: Any = structlog.get_logger(name)
        self._quiet: Any = structlog.wrap_logger(
            _Stderr(),
            processors=[
                structlog.processors.add_log_level,
                structlog.dev.ConsoleRenderer(colors=False),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        ).bind()  # bound once: its processors are fixed (the configured one stays lazy)

    def _target(self) -> Any:
        return self._configured if structlog.is_configured() else self._quiet

    def info(self, event: str, **fields: Any) -> None:
        """An info event (dropped until structlog is configured: one check, nothing built)."""
        if structlog.is_configured():
            self._configured.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        """A warning event (to stderr until structlog is configured)."""
        self._target().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        """An error event (to stderr until structlog is configured)."""
        self._target().error(event, **fields)


def library_logger(name: str) -> LibraryLogger:
    """rxstream's logger ``name`` (``"rxstream"``, ``"rxstream.timing"``…): see
    :class:`LibraryLogger`."""
    return LibraryLogger(name)
