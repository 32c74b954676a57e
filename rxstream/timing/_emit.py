"""Emitting timing records: one structlog event per record, plus hooks and test listeners."""

from __future__ import annotations

import contextlib
import json as _json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import structlog

from rxstream._util import finite_only, library_logger
from rxstream.timing._client import ClientTiming
from rxstream.timing._record import TimingRecord

__all__ = [
    "configure_launch_logging",
    "configure_logging",
    "configure_quiet_logging",
    "emit",
    "joined",
    "listen",
    "listen_photon",
    "strict_json",
    "tag_lines",
]

_log = library_logger("rxstream.timing")
_listeners: list[Callable[[TimingRecord], None]] = []
_listeners_lock = threading.Lock()
_opened: TextIO | None = None
_photon_listeners: list[Callable[[TimingRecord, ClientTiming], None]] = []
_tags: dict[str, str] = {}


def tag_lines(**fields: str | None) -> None:
    """Write ``fields`` into every line this process logs from now on, timing and photon lines
    included (a value ``None`` stops writing that one): a worker of ``rxstream serve`` tags
    its session's lines with ``session``, its id (``rxstream timing --session ID``)."""
    for key, value in fields.items():
        if value is None:
            _tags.pop(key, None)
        else:
            _tags[key] = value


def _tagged(logger: Any, method: str, event: Any) -> Any:
    """The processor that writes :func:`tag_lines`' fields (a line's own win)."""
    for key, value in tuple(_tags.items()):
        event.setdefault(key, value)
    return event


def emit(record: TimingRecord, hook: Callable[[TimingRecord], None] | None = None) -> None:
    """Log ``record`` as ``[timing:<stream>]`` and hand it to ``hook`` and the listeners."""
    _log.info(f"[timing:{record.stream}]", **record.fields())
    if hook is not None:
        hook(record)
    for listener in tuple(_listeners):
        listener(record)


@contextlib.contextmanager
def listen(listener: Callable[[TimingRecord], None]) -> Iterator[None]:
    """Call ``listener`` with every record emitted inside the block (any pipeline, any thread)."""
    with _listeners_lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _listeners_lock:
            _listeners.remove(listener)


def joined(record: TimingRecord, client: ClientTiming) -> None:
    """A page's report joined ``record`` (its ``[photon:…]`` line was logged): hand both to the
    photon listeners."""
    for listener in tuple(_photon_listeners):
        listener(record, client)


@contextlib.contextmanager
def listen_photon(listener: Callable[[TimingRecord, ClientTiming], None]) -> Iterator[None]:
    """Call ``listener`` with every record a page's report joins inside the block, and the
    page's part (any session, any thread)."""
    with _listeners_lock:
        _photon_listeners.append(listener)
    try:
        yield
    finally:
        with _listeners_lock:
            _photon_listeners.remove(listener)


def configure_logging(
    path: str | Path | None = None, *, json: bool = True, level: int = logging.INFO
) -> None:
    """Set structlog up for rxstream's logs: JSON lines (or console text) to a file or stderr.

    Each line carries ``event`` (``[timing:<stream>]`` for timing records), ``timestamp``
    (ISO 8601, UTC), ``level`` and the record's flat fields. Call it once, early. On a
    terminal each line first erases the line it starts on (a status line drawn in place).
    """
    _configure(path, json=json, level=level)


REPORTED_EVENTS = frozenset({"self_test_failed", "app_task_failed", "web_not_secure"})
"""Error events whose failure is raised to the caller, which says it, and warnings
``rxstream run`` says on a line of its own (``web_not_secure``): a launcher's quiet logs
leave them out, so that each is said once."""


def configure_quiet_logging() -> None:
    """A launcher's logs (``rxstream run``, ``launch(quiet=True)``, each rank): warnings and
    errors as text on stderr, without the error events whose failure the launcher says."""
    _configure(None, json=False, level=logging.WARNING, drop=REPORTED_EVENTS)


def configure_launch_logging(path: str | Path) -> None:
    """A quiet launcher's timing log (``rxstream run --log``): every event to the file ``path``
    as JSON lines, and the warnings and errors also to stderr as text, as without a log (less
    the failures the launcher says itself): a warning is said live either way."""
    _configure(path, json=True, level=logging.INFO, echo=REPORTED_EVENTS)


def _configure(
    path: str | Path | None,
    *,
    json: bool,
    level: int,
    drop: frozenset[str] = frozenset(),
    echo: frozenset[str] | None = None,
) -> None:
    global _opened
    if _opened is not None:  # a previous configure_logging's file
        _opened.close()
        _opened = None
    stream: TextIO = sys.stderr
    if path is not None:
        stream = _opened = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - kept open
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=strict_json)
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    processors: list[Any] = [
        _tagged,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        renderer,
    ]
    if drop:
        processors.insert(0, _Drop(drop))
    if echo is not None:
        processors.insert(-1, _Echo(echo))
    if _isatty(stream):
        processors.append(_line_start)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


class _Drop:
    """A processor that drops the events named."""

    def __init__(self, events: frozenset[str]) -> None:
        self.events = events

    def __call__(self, logger: Any, method: str, event: Any) -> Any:
        if event.get("event") in self.events:
            raise structlog.DropEvent
        return event


class _Echo:
    """A processor that also writes each warning and error to stderr as one line of text (the
    events named left out), the event going on to the log unchanged."""

    LEVELS = frozenset({"warning", "error", "critical", "exception"})

    def __init__(self, unsaid: frozenset[str]) -> None:
        self.unsaid = unsaid
        self.render = structlog.dev.ConsoleRenderer(colors=False)

    def __call__(self, logger: Any, method: str, event: Any) -> Any:
        if method in self.LEVELS and event.get("event") not in self.unsaid:
            line = self.render(logger, method, dict(event))
            stream = sys.stderr
            with contextlib.suppress(OSError, ValueError):  # a closed stderr: the log has it
                stream.write(f"{_line_start(logger, method, line) if _isatty(stream) else line}\n")
                stream.flush()
        return event


def _line_start(logger: Any, method: str, line: Any) -> Any:
    """A rendered line that first erases the terminal line it starts on: a status line the
    launcher drew there (``\\r`` and no newline) would otherwise run into it."""
    return f"\r\x1b[K{line}" if isinstance(line, str) else line


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


def strict_json(event: Any, **options: Any) -> str:
    """A log line as strict JSON: a NaN or infinite float is written ``null`` (never the bare
    ``NaN``/``Infinity`` that ``json.dumps`` writes by default and JSON readers refuse), and
    its key is listed in ``nonfinite``."""
    options.pop("allow_nan", None)
    try:
        return _json.dumps(event, allow_nan=False, **options)
    except ValueError:
        pass
    places: list[str] = []
    cleaned = finite_only(event, places)
    if isinstance(cleaned, dict):
        cleaned["nonfinite"] = places
    return _json.dumps(cleaned, allow_nan=False, **options)
