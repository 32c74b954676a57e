"""How a command says that the app failed: one line naming the exception and the app's own
line (``KeyError: 'b' (app.py:14 in main)``); the whole traceback on request (``--traceback``,
or :data:`TRACEBACK_ENV` set)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from rxstream.ranks._app import app_files, app_frame, describe, typed

__all__ = [
    "TRACEBACK_ENV",
    "app_failure",
    "app_files",
    "app_frame",
    "describe",
    "show_traceback",
    "typed",
    "wants_traceback",
]

TRACEBACK_ENV = "RXSTREAM_TRACEBACK"
"""Set to anything but ``""`` or ``0``, every command prints the whole traceback of a failure
before its one line, as ``--traceback`` does."""


def app_failure(exc: BaseException, entry: str) -> str:
    """Why loading (or building) the app ``entry`` failed, in one line: a missing file, a
    syntax error or no build/main as they read; what the app's own code raised, with its type
    and line (``ModuleNotFoundError: No module named 'cv3' (app.py:3 in <module>)``)."""
    files = app_files(entry)
    if isinstance(exc, SyntaxError) or app_frame(exc, files) is None:
        return str(exc)
    return describe(exc, files)


def wants_traceback(args: argparse.Namespace) -> bool:
    """Whether ``--traceback`` or :data:`TRACEBACK_ENV` asks for a failure's whole traceback."""
    return bool(getattr(args, "traceback", False)) or os.environ.get(TRACEBACK_ENV, "") not in (
        "",
        "0",
    )


def show_traceback(args: argparse.Namespace, exc: BaseException) -> None:
    """Print ``exc``'s whole traceback on stderr when :func:`wants_traceback`."""
    if wants_traceback(args):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
