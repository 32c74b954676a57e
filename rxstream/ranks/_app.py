"""The app a launch runs: ``build(ctx)``, ``async def main(ctx)``, or both (:func:`load_app`)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rxstream._exceptions import (
    AppEntryError,
    ArgumentError,
    ArgumentTypeError,
    PipelineError,
    RxStreamError,
    SettingError,
    TaskError,
    shown,
)
from rxstream._settings import apply_settings
from rxstream.context import Context
from rxstream.doc import Doc
from rxstream.pipeline import Pipeline

Build = Callable[[Context], Pipeline]
Main = Callable[[Context], Coroutine[Any, Any, Any]]


# --- the app ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class App:
    """An app as :func:`load_app` found it: its ``build``, its ``main``, or both.

    Calling it is calling ``build`` (so ``load_app(entry)(ctx)`` builds the pipeline).
    """

    entry: str
    """What was loaded: ``path/app.py[:func]`` or ``module[:func]``."""
    build: Build | None
    """``build(ctx) -> Pipeline``, which every rank calls."""
    main: Main | None
    """``async def main(ctx)``: the app's own session, run on rank 0 (the other ranks of its
    runs call ``build``)."""

    def check_ranks(self, ranks: int) -> None:
        """Refuse a main app without a build on several ranks: ranks 1..N-1 call ``build``."""
        if self.main is not None and self.build is None and ranks > 1:
            raise ArgumentError(
                f"an async main(ctx) app runs on {ranks} ranks only with a build(ctx) -> "
                f"Pipeline too (ranks 1..{ranks - 1} call it to build the graph main runs); "
                f"{self.entry!r} has none"
            )

    def __call__(self, ctx: Context) -> Pipeline:
        if self.build is None:
            raise AppEntryError(
                f"app {self.entry!r} has no build(ctx) -> Pipeline, only an async main(ctx)"
            )
        pipeline = self.build(ctx)
        if not isinstance(pipeline, Pipeline):
            raise ArgumentTypeError(
                f"app {self.entry!r}: build(ctx) must return a Pipeline, got "
                f"{type(pipeline).__name__} {shown(pipeline)}"
            )
        return pipeline


def load_app(entry: str) -> App:
    """The app ``entry``: ``path/app.py[:func]`` or ``module[:func]``.

    Without ``func`` it finds ``build(ctx)`` and ``async def main(ctx)`` (a coroutine function
    of one argument; another ``main`` is ignored); with ``func``, that function alone — a main
    when it is a coroutine function, else a build.
    """
    target, _, attr = entry.partition(":")
    module = _import_app(entry, target)
    if attr:
        chosen = getattr(module, attr, None)
        if not callable(chosen):
            raise AppEntryError(
                f"app {entry!r} has no callable {attr!r} "
                f"(def {attr}(ctx) -> Pipeline or async def {attr}(ctx))"
            )
        if inspect.iscoroutinefunction(chosen):
            return App(entry, None, chosen)
        return App(entry, chosen, None)
    build = getattr(module, "build", None)
    main = getattr(module, "main", None)
    app = App(entry, build if callable(build) else None, main if _is_main(main) else None)
    if app.build is None and app.main is None:
        raise AppEntryError(
            f"app {entry!r} has neither a build(ctx) -> Pipeline nor an async def main(ctx)"
        )
    return app


def _import_app(entry: str, target: str) -> Any:
    if not (target.endswith(".py") or os.sep in target):
        return importlib.import_module(target)
    path = Path(target).resolve()
    if not path.exists():
        raise FileNotFoundError(f"app file {entry!r} does not exist")
    name = f"rxstream_app_{path.stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import app file {entry!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # a failed import leaves no half-made module behind
            raise
    return module


def _is_main(fn: object) -> bool:
    """Whether ``fn`` is an app's ``async def main(ctx)``."""
    if not inspect.iscoroutinefunction(fn):
        return False
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    return True


# --- where the app's own code went wrong --------------------------------------------------------


def app_files(entry: str, app: App | None = None) -> frozenset[str]:
    """The files of the app ``entry`` (``path/app.py[:func]`` or ``module[:func]``): its own
    file, and the files of its ``build`` and ``main`` once loaded (``app``)."""
    files: set[str] = set()
    target = entry.partition(":")[0]
    if target.endswith(".py") or os.sep in target:
        files.add(os.path.realpath(target))
    else:
        try:
            spec = importlib.util.find_spec(target)
        except Exception:  # (its parent package failed to import: it names no file then)
            spec = None
        if spec is not None and spec.origin is not None:
            files.add(os.path.realpath(spec.origin))
    for function in () if app is None else (app.build, app.main):
        code = getattr(function, "__code__", None)
        if code is not None:
            files.add(os.path.realpath(code.co_filename))
    return frozenset(files)


def app_frame(exc: BaseException, files: Iterable[str]) -> str | None:
    """Where the app's own code was when ``exc`` went through it: the innermost frame of its
    traceback in one of ``files``, as ``app.py:14 in main`` (the path relative to the current
    folder when it is under it); ``None`` when it never went through the app."""
    wanted = set(files)
    found = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if os.path.realpath(frame.f_code.co_filename) in wanted:
            found = frame.f_code, line
    if found is None:
        return None
    code, line = found
    path = os.path.relpath(code.co_filename)
    if path.startswith(os.pardir):
        path = code.co_filename
    return f"{path}:{line} in {code.co_name}"


def typed(exc: BaseException) -> str:
    """``KeyError: 'b'``: the exception's type and message, on one line."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def describe(exc: BaseException, files: Iterable[str] = ()) -> str:
    """A failure as one line, on any rank: rxstream's own errors as they read (they name the
    stage or the field, the rule and the value), any other with its type; then where in the
    app's ``files`` it went wrong (``(app.py:14 in main)``), except for a stage's failure,
    which names the stage; a spawned task's failure names the task and its own line (where
    the task went wrong, not where ``main`` awaited the run)."""
    if isinstance(exc, PipelineError):
        return str(exc)
    text = " ".join(str(exc).split()) if isinstance(exc, RxStreamError) else typed(exc)
    where = app_frame(exc.cause if isinstance(exc, TaskError) else exc, files)
    return text if where is None else f"{text} ({where})"


class AppContext(Context):
    """The launcher's context: writes the ``--set`` settings as the app makes the control doc."""

    def __init__(self, *, settings: Sequence[str] = (), **options: Any) -> None:
        super().__init__(**options)
        self._settings = tuple(settings)

    def _made(self, doc: Doc) -> None:
        if doc.name == "control" and self._settings:
            apply_settings(doc, self._settings)

    def check_settings(self) -> None:
        """Fail when there are settings and the app made no control doc to take them."""
        if self._settings and "control" not in self.docs:
            shown = " ".join(f"--set {text}" for text in self._settings)
            raise SettingError(
                f"{shown}: the app made no control doc (ctx.doc('control')) to write to"
            )
