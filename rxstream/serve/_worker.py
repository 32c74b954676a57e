"""One warm worker process of ``rxstream serve``: the app imported once, then one session
after another, each a fresh launch of the app behind a WebTransport of its own.

The front (``_pool.py``) talks to it over a pipe, one tuple a message:

- front to worker: ``("start", sid, token)`` a session; ``("stop", sid, why)`` ends it;
  ``("quit",)`` ends the session there is and the process.
- worker to front: ``("ready", pid)`` once the app is imported; ``("failed", why, usage)``
  when it cannot be (``usage``: a flag the app refuses, such as ``--ranks``); ``("open", sid,
  port)`` once the session's page is served on ``127.0.0.1:port``; ``("status", sid, fps)``
  every half second; ``("ended", sid, why, books)`` when it is over.

Per session the launch builds a fresh ``Context``, doc, generations and pipeline with its own
run id; what the app made with ``ctx.resource`` stays loaded (its registry is per process).
Every log line of the session carries ``session``: its id.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

from rxstream._exceptions import ArgumentError, RxStreamError
from rxstream.item import PipelineItem
from rxstream.transport import WebTransport

__all__ = ["WorkerSpec", "worker_main"]


@dataclass(frozen=True)
class WorkerSpec:
    """What every session of a worker runs: the app and how."""

    entry: str
    """The app: ``path/app.py[:func]`` or ``module[:func]``."""
    ranks: int = 1
    """Rank processes per session (ranks 1.. are spawned per session)."""
    settings: tuple[str, ...] = ()
    """``--set KEY=VALUE`` writes for every session's control doc."""
    grace_s: float = 2.0
    """How long a session outlives its page (a reload within it keeps the session)."""
    log: str | None = None
    """The timing log every session appends to (JSON lines, each with its ``session``)."""
    metrics: bool = False
    """Every session's launch makes its run metrics, served at its WebTransport's
    ``/metrics`` behind the session's token (the front scrapes them)."""


class _Counted(WebTransport):
    """A session's WebTransport that counts what its sinks handed it: frames sent with a page
    attached and frames egressed while none was (the books' ``unattached``)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.offered = 0
        self.unattached = 0

    def send(self, stream: str, item: PipelineItem) -> None:
        self.offered += 1
        if not self.pages:
            self.unattached += 1
        super().send(stream, item)


class _Pipe:
    """The worker's end of the pipe: sends from any thread, one at a time."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, *message: Any) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._conn.send(message)


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """A worker process's body: import the app, then serve the sessions the front sends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the front stops us
    pipe = _Pipe(conn)
    orders: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
    stops: dict[str, tuple[threading.Event, list[str]]] = {}
    lock = threading.Lock()

    def stop(sid: str | None, why: str) -> None:
        with lock:
            for key, (event, said) in stops.items():
                if sid is None or key == sid:
                    said.append(why)
                    event.set()

    def terminated(signum: int, frame: object) -> None:
        stop(None, "the server stopped")
        orders.put(None)

    signal.signal(signal.SIGTERM, terminated)

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the front is gone: end what runs, then exit
                stop(None, "the server went away")
                orders.put(None)
                return
            if message[0] == "start":
                with lock:
                    stops[message[1]] = (threading.Event(), [])
                orders.put((message[1], message[2]))
            elif message[0] == "stop":
                stop(message[1], message[2])
            else:
                stop(None, "the server stopped")
                orders.put(None)
                return

    try:
        _warm(spec)
    except BaseException as exc:
        pipe.send("failed", _load_failure(exc, spec.entry), isinstance(exc, ArgumentError))
        return
    threading.Thread(target=read, name="rxstream-serve-orders", daemon=True).start()
    pipe.send("ready", os.getpid())
    while True:
        order = orders.get()
        if order is None:
            return
        sid, token = order
        with lock:
            event, said = stops[sid]
        why, books = _session(spec, sid, token, event, pipe)
        with lock:
            del stops[sid]
        pipe.send("ended", sid, said[0] if said else why, books)


def _load_failure(exc: BaseException, entry: str) -> str:
    """Why the app ``entry`` would not load, in one line, as ``rxstream run`` says it: a
    missing file, a syntax error or a refused flag as they read; what the app's own code
    raised with its type and line."""
    from rxstream.ranks._app import app_files, app_frame, describe

    files = app_files(entry)
    if isinstance(exc, SyntaxError | RxStreamError | OSError) and app_frame(exc, files) is None:
        return str(exc)
    return describe(exc, files)


def _warm(spec: WorkerSpec) -> None:
    """Import the app once and set this process's logging up (every session appends)."""
    from rxstream.ranks._app import load_app
    from rxstream.timing._emit import configure_launch_logging, configure_quiet_logging

    if spec.log is not None:
        configure_launch_logging(spec.log)
    else:
        configure_quiet_logging()
    load_app(spec.entry).check_ranks(spec.ranks)


def _session(
    spec: WorkerSpec, sid: str, token: str, stop: threading.Event, pipe: _Pipe
) -> tuple[str, dict[str, int]]:
    """Run one session to its end: why it ended and its books."""
    from rxstream.ranks._app import app_files, describe
    from rxstream.ranks._launch import launch
    from rxstream.timing._emit import tag_lines

    web = _Counted(
        host="127.0.0.1", port=0, token=token, grace_s=spec.grace_s, metrics=spec.metrics
    )
    rate = _Rate(web)

    def opened() -> None:
        pipe.send("open", sid, urlsplit(web.url).port)

    def status(_: Mapping[int, Any]) -> None:
        pipe.send("status", sid, rate.fps())

    why = "the page left"
    egressed: int | None = None
    tag_lines(session=sid)
    try:
        result = launch(
            spec.entry,
            spec.ranks,
            settings=spec.settings,
            transport=web,
            on_open=opened,
            on_status=status,
            stop=stop,
        )
        egressed = result.egressed
        if not stop.is_set() and web.pages:
            why = "the app's pipeline ended"
    except BaseException as exc:  # a stage raised, a rank died: this session only
        why = f"the app failed: {describe(exc, app_files(spec.entry))}"
    finally:
        tag_lines(session=None)
    books = {  # produced: what the sinks egressed (what they handed the page, when it failed)
        "produced": web.offered if egressed is None else egressed,
        "offered": web.offered,
        "unattached": web.unattached,
        "dropped": web.dropped,
    }
    return why, books


class _Rate:
    """Frames a second the session's transport was handed, over the last status period."""

    def __init__(self, web: _Counted) -> None:
        self._web = web
        self._last = (time.monotonic(), 0)

    def fps(self) -> float:
        now, count = time.monotonic(), self._web.offered
        then, before = self._last
        self._last = (now, count)
        return 0.0 if now <= then else (count - before) / (now - then)
