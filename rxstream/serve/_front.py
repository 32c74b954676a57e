"""The front of ``rxstream serve``: one aiohttp server on the public port that gives each
visitor a session on a free warm worker, queues them when none is, and relays their page.

Routes (``T``: the server's token, needed unless ``public``):

- ``GET /?token=T``: a new session, the visitor sent (303) to ``/s/<id>/?token=<session
  token>``; every worker busy: to the queue page ``/q/<ticket>`` (a browser) or 503 with
  ``Retry-After`` (an API client: ``Accept`` without ``text/html``); the queue full: 503.
  An API client given a session gets JSON (``id``, ``url``, ``ws``).
- ``GET /s/<id>/?token=S``: the session's page, relayed from its worker; 403 for another
  token, 410 with why once it ended.
- ``GET /ws?token=S`` (the page's socket; also ``/s/<id>/ws``): relayed both ways to the
  worker's WebTransport, one message at a time (each send awaits its drain), so the page's
  per-frame acks still pace the worker.
  A request with ``X-Rxstream-Queue: no`` gets the 503 too (a load balancer tries another).
- ``GET /q/<ticket>/state``: ``{"place": n}`` or ``{"url": ...}`` once served.
- ``GET /sessions?token=T``: the sessions, their fps, the queue; ``/healthz``, ``/readyz``.
- ``GET /metrics?token=T`` (or ``Authorization: Bearer T``; with ``metrics``): Prometheus
  exposition of the front and of every live session (``_metrics.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import ssl
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import aiohttp
from aiohttp import web

from rxstream.serve._metrics import FrontMetrics, merge, scrape
from rxstream.serve._pages import ended_page, full_page, queue_page
from rxstream.serve._pool import Worker, WorkerPool
from rxstream.serve._relay import relay
from rxstream.serve._sessions import AddressRate, Session, Sessions, Ticket, new_secret, same
from rxstream.serve._worker import WorkerSpec
from rxstream.timing._prometheus import CONTENT_TYPE
from rxstream.transport._guard import Gate

__all__ = ["Front", "ServeOptions"]

RETRY_S = 5
"""The ``Retry-After`` (seconds) of a 503: every worker busy, or the queue full."""
OPEN_S = 60.0
"""How long a session's page request waits for its worker to open the session."""
END_WAIT_S = 3.0
"""How long a page request whose worker closed waits for the worker to say why."""
TICK_S = 0.25
"""How often the front checks idle and maximum durations, expires tickets, redraws status."""
PROBES = frozenset({"/healthz", "/readyz"})
"""The paths a load balancer's probes ask for under any ``Host`` (they say nothing private)."""
ENDED_LISTED = 20
"""The newest ended sessions ``/sessions`` lists (with why and their books)."""
INPUT_TYPES = frozenset({"input", "set", "steer"})
"""The page messages that count as a visitor's input (``idle_s``)."""
NO_QUEUE = "X-Rxstream-Queue"
"""A request header: ``no`` asks for a 503 rather than a queue ticket when every worker is
busy (a load balancer's first try, so that it can try another server before queueing)."""
PAGE_HEADERS = (
    "Content-Type",
    "Cache-Control",
    "Content-Security-Policy",
    "Referrer-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
)


@dataclass(frozen=True)
class ServeOptions:
    """How ``rxstream serve`` serves: the public address, the limits, the token."""

    host: str = "127.0.0.1"
    port: int = 8765
    workers: int = 2
    queue: int = 16
    """Visitors that may wait for a worker; past it, 503 for everyone."""
    idle_s: float | None = 120.0
    """A session with no input (pointer, doc write) this long ends; ``None``: never."""
    max_session_s: float | None = None
    """A session ends this long after it started; ``None``: no bound."""
    public: bool = False
    """Anyone may open a session (no server token), rate-limited per client address."""
    token: str | None = None
    """The server's token (``None``: a fresh one)."""
    tls: ssl.SSLContext | None = None
    allowed_hosts: tuple[str, ...] = ()
    """Names a visitor's ``Host`` may carry besides the bound address and ``localhost``."""
    route: str = ""
    """This server's name behind a load balancer: every session id, session token and queue
    ticket it gives out starts with ``NAME-``, so the balancer can send a visitor's page,
    socket and queue polls to it (``""``: none)."""
    allow_remote: bool = False
    """A ``host`` that is not loopback was asked for (``--allow-remote``): a ``Host`` that is
    an IP literal is then accepted too."""
    metrics: bool = False
    """Serve ``GET /metrics`` (behind the server's token): the front's series and every live
    session's run metrics, each labelled with its ``session``."""


class Front:
    """The server: ``await front.serve(stop)`` runs it until ``stop`` is set."""

    def __init__(
        self, spec: WorkerSpec, options: ServeOptions, *, status: TextIO | None = None
    ) -> None:
        if options.metrics and not spec.metrics:  # the sessions' own metrics, to scrape
            spec = dataclasses.replace(spec, metrics=True)
        self.spec = spec
        self.options = options
        self.token = options.token or new_secret()
        self.sessions = Sessions(options.queue, options.route)
        self.pool = WorkerPool(spec, options.workers, self._on_message)
        self.rate = AddressRate()
        self._gate = Gate(
            host=options.host,
            token=None,
            allow_remote=options.allow_remote,
            allowed_hosts=options.allowed_hosts,
        )
        self.port: int | None = None
        self.ready = asyncio.Event()
        """Set once every worker imported the app (or one could not: :attr:`failed`)."""
        self.failed: str | None = None
        """Why a worker could not import the app."""
        self.usage = False
        """Whether :attr:`failed` is a flag the app refuses (``--ranks``), not the app's own
        failure."""
        self._status = status
        self._client: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.served = 0
        """Sessions given out so far."""
        self.counts = FrontMetrics()
        self.sessions.on_end = self.counts.session_ended

    # --- the URL -----------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "http" if self.options.tls is None else "https"

    @property
    def url(self) -> str:
        """Where a visitor opens a session (with the token unless public)."""
        host = self.options.host
        base = f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{self.port}/"
        return base if self.options.public else f"{base}?token={self.token}"

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the workers and listen; :attr:`ready` once every worker is warm."""
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        self.pool.start()
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._root)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/sessions", self._list)
        if self.options.metrics:
            app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/ws", self._socket)
        app.router.add_get("/q/{ticket}", self._queue_page)
        app.router.add_get("/q/{ticket}/state", self._queue_state)
        app.router.add_get("/s/{sid}/", self._page)
        app.router.add_get("/s/{sid}/ws", self._socket)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.options.host, self.options.port, ssl_context=self.options.tls
        )
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._ticker = asyncio.ensure_future(self._tick())

    async def close(self) -> None:
        """End every session, stop every worker (no process left), stop listening."""
        self._ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._ticker
        for session in list(self.sessions.live.values()):
            session.stopping = "the server stopped"
        await self.pool.close()
        for session in list(self.sessions.live.values()):
            self.sessions.end(session, "the server stopped")
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.close()

    # --- the workers' messages ---------------------------------------------------------------

    def _on_message(self, worker: Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "ready":
            worker.state = "free"
            self._check_ready()
            self._serve_queue()
        elif kind == "failed":
            worker.state = "dead"
            self.failed = str(message[1])
            self.usage = bool(message[2])
            self.ready.set()
        elif kind == "open":
            session = self.sessions.live.get(message[1])
            if session is not None:
                session.port = int(message[2])
                session.opened.set()
        elif kind == "status":
            session = self.sessions.live.get(message[1])
            if session is not None:
                session.fps = float(message[2])
        elif kind == "ended":
            session = self.sessions.find(message[1])
            worker.state, worker.session = "free", None
            if session is not None:
                session.books = dict(message[3])
                self._end(session, session.stopping or str(message[2]))
            self._serve_queue()
        elif kind == "died":
            session = self.sessions.live.get(worker.session or "")
            code = message[1]
            if session is not None:
                self._end(session, f"its worker process died (exit status {code})")
            self._say(f"worker {worker.index} (pid {worker.pid}) died (exit status {code})")
            self.pool.respawn(worker)

    def _check_ready(self) -> None:
        if all(w.state != "starting" for w in self.pool.workers):
            self.ready.set()

    def _end(self, session: Session, why: str) -> None:
        self.sessions.end(session, why)
        said = "" if not session.books else f" ({books_line(session)})"
        self._say(f"session {session.id} ended on worker {session.worker}: {why}{said}")

    # --- giving out sessions -----------------------------------------------------------------

    def _give(self) -> Session | None:
        """A new session on a free worker, or ``None`` when every one is busy."""
        free = self.pool.free()
        if not free:
            return None
        worker = free[0]
        session = self.sessions.open(worker.index)
        if not self.pool.send(worker, "start", session.id, session.token):
            self.sessions.end(session, "its worker process died")
            return None
        worker.state, worker.session = "busy", session.id
        worker.sessions += 1
        self.served += 1
        self.counts.session_started()
        self._say(f"session {session.id} started on worker {worker.index}")
        return session

    def _serve_queue(self) -> None:
        while self.sessions.queue and self.pool.free():
            ticket = self.sessions.next_ticket()
            assert ticket is not None
            ticket.session = self._give()

    def _session_url(self, session: Session) -> str:
        return f"/s/{session.id}/?token={session.token}"

    # --- routes ------------------------------------------------------------------------------

    async def _root(self, request: web.Request) -> web.StreamResponse:
        browser = "text/html" in request.headers.get("Accept", "")
        if self.options.public:
            wait = self.rate.take(request.remote or "", time.monotonic())
            if wait:
                return _retry(429, "too many new sessions from this address", wait, browser)
        elif not same(request.query.get("token"), self.token):
            return _refuse(403, "the server's token is missing or wrong (open the URL it printed)")
        session = None if self.sessions.queue else self._give()  # others wait: behind them
        if session is not None:
            if browser:
                raise web.HTTPSeeOther(self._session_url(session))
            return web.json_response(
                {
                    "id": session.id,
                    "url": self._session_url(session),
                    "ws": f"/ws?token={session.token}",
                }
            )
        if not browser or request.headers.get(NO_QUEUE, "").lower() == "no":
            return _retry(503, "every worker is busy", RETRY_S, browser)
        ticket = self.sessions.wait()
        if ticket is None:
            return _retry(503, "every worker is busy and the queue is full", RETRY_S, browser)
        raise web.HTTPSeeOther(f"/q/{ticket.id}")

    def _ticket(self, request: web.Request) -> Ticket:
        ticket = self.sessions.tickets.get(request.match_info["ticket"])
        if ticket is None:
            raise web.HTTPNotFound(text="no such place in the queue (it was given up)")
        ticket.polled_at = time.monotonic()
        return ticket

    async def _queue_page(self, request: web.Request) -> web.StreamResponse:
        ticket = self._ticket(request)
        if ticket.session is not None:
            raise web.HTTPSeeOther(self._session_url(ticket.session))
        return web.Response(
            text=queue_page(ticket.id, self.sessions.place(ticket)),
            content_type="text/html",
            headers={"Cache-Control": "no-store"},
        )

    async def _queue_state(self, request: web.Request) -> web.StreamResponse:
        ticket = self._ticket(request)
        if ticket.session is not None:
            self.sessions.tickets.pop(ticket.id, None)
            return web.json_response({"url": self._session_url(ticket.session)})
        return web.json_response(
            {"place": self.sessions.place(ticket), "queue": len(self.sessions.queue)}
        )

    def _session_of(self, request: web.Request) -> Session:
        session = self.sessions.find(request.match_info["sid"])
        if session is None:
            raise web.HTTPNotFound(text="no such session")
        if not same(request.query.get("token"), session.token):
            raise web.HTTPForbidden(text="this session's token is missing or wrong")
        return session

    async def _page(self, request: web.Request) -> web.StreamResponse:
        session = self._session_of(request)
        if not session.ended.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OPEN_S):
                    await _first(session.opened, session.ended)
        if session.ended.is_set() or session.port is None:
            why = session.why or "its worker did not open it in time"
            if "text/html" in request.headers.get("Accept", ""):
                return web.Response(status=410, text=ended_page(why), content_type="text/html")
            return web.json_response({"ended": why}, status=410)
        assert self._client is not None
        url = f"http://127.0.0.1:{session.port}/?token={session.token}"
        try:
            async with self._client.get(url) as got:
                body = await got.read()
                headers = {k: got.headers[k] for k in PAGE_HEADERS if k in got.headers}
                return web.Response(status=got.status, body=body, headers=headers)
        except aiohttp.ClientError:  # its worker closed it in between: why, once said
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(END_WAIT_S):
                    await session.ended.wait()
            why = session.why or "its worker did not answer"
            return web.json_response({"ended": why}, status=410)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token")
        session = self.sessions.by_token(token)
        sid = request.match_info.get("sid")
        if session is None or (sid is not None and sid != session.id):
            ended = self.sessions.find(sid or "")
            if ended is not None and ended.ended.is_set() and same(token, ended.token):
                raise web.HTTPGone(text=f"session ended: {ended.why}")
            raise web.HTTPForbidden(text="no live session has this token")
        if session.port is None:
            raise web.HTTPServiceUnavailable(text="the session is not open yet")
        return await relay(request, session, self._client, self._noted)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every request but the probes: a ``Host`` that is this server (a page of a rebound
        DNS name is refused) and, when present, an ``Origin`` that is its own: its scheme is
        ``X-Forwarded-Proto``'s when a balancer in front says one (a TLS balancer before a
        plain server; a page cannot set that header, and what can also sets ``Origin``)."""
        if request.path not in PROBES:
            forwarded = request.headers.get("X-Forwarded-Proto", "").lower()
            refused = self._gate.refuse(
                host=request.headers.get("Host"),
                origin=request.headers.get("Origin"),
                token=None,
                scheme=forwarded if forwarded in ("http", "https") else self.scheme,
            )
            if refused is not None:
                return _refuse(403, refused)
        response: web.StreamResponse = await handler(request)
        return response

    def _noted(self, session: Session, text: str) -> None:
        """A text message of the page: an input resets its idle clock."""
        if '"type"' not in text:
            return
        try:
            kind = json.loads(text).get("type")
        except (ValueError, AttributeError):
            return
        if kind in INPUT_TYPES:
            session.last_input = time.monotonic()

    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.StreamResponse:
        free = len(self.pool.free())
        text = f"{free} worker(s) free\n"
        return web.Response(status=200 if free else 503, text=text)

    async def _list(self, request: web.Request) -> web.StreamResponse:
        if not same(request.query.get("token"), self.token):
            return _refuse(403, "the server's token is missing or wrong")
        return web.json_response(self.describe())

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        """The front's series and every live session's run metrics (``--metrics``)."""
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not (same(request.query.get("token"), self.token) or same(bearer, self.token)):
            return _refuse(403, "the server's token is missing or wrong")
        assert self._client is not None
        front = self.counts.families(
            live=len(self.sessions.live),
            queue=len(self.sessions.queue),
            workers=[w.state for w in self.pool.workers],
        )
        open_ = [(s.id, s.port, s.token) for s in self.sessions.live.values() if s.port is not None]
        body = merge(front, await scrape(self._client, open_))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    def describe(self) -> dict[str, Any]:
        """What ``/sessions`` says: the workers, the sessions, the queue."""
        now = time.monotonic()
        return {
            "workers": [
                {
                    "index": w.index,
                    "pid": w.pid,
                    "state": w.state,
                    "session": w.session,
                    "sessions": w.sessions,
                }
                for w in self.pool.workers
            ],
            "free": len(self.pool.free()),
            "queue": len(self.sessions.queue),
            "served": self.served,
            "sessions": [s.describe(now) for s in self.sessions.live.values()],
            "ended": [
                {**s.describe(now), "why": s.why, "books": s.books}
                for s in list(self.sessions.ended.values())[-ENDED_LISTED:]
            ],
        }

    # --- limits and the status line ----------------------------------------------------------

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            self.sessions.expire(now)
            for session in list(self.sessions.live.values()):
                why = ""
                idle_s, max_s = self.options.idle_s, self.options.max_session_s
                if idle_s is not None and now - session.last_input > idle_s:
                    why = f"no input for {idle_s:g} s (--idle-s)"
                if max_s is not None and now - session.started_at > max_s:
                    why = f"it reached its maximum of {max_s:g} s (--max-session-s)"
                if why and not session.stopping:
                    session.stopping = why
                    worker = self.pool.workers[session.worker]
                    self.pool.send(worker, "stop", session.id, why)
            self._draw()

    def status_line(self) -> str:
        """The one line a terminal shows: workers free, sessions and their fps, the queue."""
        live = list(self.sessions.live.values())
        shown = ", ".join(f"{s.id} {s.fps:.0f} fps" for s in live[:6])
        more = f" (+{len(live) - 6})" if len(live) > 6 else ""
        return (
            f"rxstream serve: {len(self.pool.free())}/{len(self.pool.workers)} workers free, "
            f"{len(live)} session(s){': ' + shown if shown else ''}{more}, "
            f"queue {len(self.sessions.queue)}"
        )

    def _draw(self) -> None:
        if self._status is not None:
            self._status.write("\r\x1b[2K" + self.status_line())
            self._status.flush()

    def _say(self, line: str) -> None:
        out = self._status or sys.stderr
        prefix = "\r\x1b[2K" if self._status is not None else ""
        print(f"{prefix}rxstream serve: {line}", file=out, flush=True)


def books_line(session: Session) -> str:
    """An ended session's books: ``N frames produced: D delivered, X dropped`` (frames the
    relay had not passed on when the page left said too: the page took them or not)."""
    books = session.books
    produced, delivered = books["produced"], session.delivered
    dropped = books["unattached"] + books["dropped"]
    said = f"{produced} frames produced: {delivered} delivered, {dropped} dropped"
    lost = produced - delivered - dropped
    if lost > 0:
        said += f", {lost} in flight as the page left"
    elif lost < 0:
        said += f"; {-lost} more delivered and dropped than produced"
    return said


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _refuse(status: int, why: str) -> web.Response:
    return web.Response(status=status, text=why + "\n")


def _retry(status: int, why: str, after: float, browser: bool) -> web.Response:
    seconds = max(1, round(after))
    headers = {"Retry-After": str(seconds)}
    if browser:
        return web.Response(
            status=status, text=full_page(seconds), content_type="text/html", headers=headers
        )
    return web.json_response(
        {"error": why, "retry_after_s": seconds}, status=status, headers=headers
    )
