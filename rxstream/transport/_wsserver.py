"""The WebSocket wire: an aiohttp server on its own thread and event loop that serves the
page (``GET /``) and its socket (``/ws``) behind the :class:`Gate` (token, Host, Origin),
and, when a run hands one over, its Prometheus metrics (``GET /metrics``, behind the same Gate),
over TLS when given a context. Each accepted socket is a :class:`SocketLink` to the page
protocol: a bounded frame queue and an :class:`Outbox` of texts, written by one task, with
the unsent bytes bounded (``TCP_NOTSENT_LOWAT`` and the transport's write buffer limits)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import socket
import ssl
import struct
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import WSMsgType, web

from rxstream._util import library_logger
from rxstream.transport._guard import Gate, SampledLog, SessionLimits
from rxstream.transport._link import Wire
from rxstream.transport._page import Page
from rxstream.transport._webclient import PINGS_S, Outbox
from rxstream.transport._webwatch import Silence

__all__ = [
    "CLOSE_S",
    "NOTSENT_LOWAT_BYTES",
    "PAGE_HEADERS",
    "RTO_MIN_S",
    "WRITE_BUFFER_BYTES",
    "MetricsHandler",
    "SocketLink",
    "SocketWire",
]

_log = library_logger("rxstream.web")

_START_S = 10.0

CLOSE_S = 1.0
"""When the session stops, a page gets this long to take the close frame (and a request in
flight this long to end); a page that does not read by then has its connection cut."""

NOTSENT_LOWAT_BYTES = 16 * 1024
"""``TCP_NOTSENT_LOWAT`` of each page's socket: the kernel holds at most about this much
not yet sent (not seconds of frames in a send buffer)."""

WRITE_BUFFER_BYTES = 64 * 1024
"""The transport's write buffer high-water mark (the writer waits past it)."""

RTO_MIN_S = 0.05
"""The shortest retransmission timeout of each page's socket (``TCP_RTO_MIN_US``, Linux 6.15
on; the kernel's default is 200 ms): a lost packet that nothing after it reveals (the last
of a frame, a lost retransmission) is resent after about a round trip and its variance, not
200 ms, on a link where a frame is due every 42 ms. Not on a loopback connection: nothing
is lost there, and with the floor that low a loopback page's frame went unacknowledged past
the estimate's FORGET_S now and then (the cause not found)."""

_TCP_RTO_MIN_US = 45  # linux/tcp.h

_SIOCOUTQNSD = 0x894B  # Linux: bytes in the send queue not yet sent

PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
}
"""The page's URL holds the token: never cached, never sent as a referrer, never framed."""


MetricsHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
"""An aiohttp handler answering ``GET /metrics``."""


def peer_port(request: web.Request) -> int | str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return peer[1] if isinstance(peer, tuple) and len(peer) > 1 else "?"


class SocketLink:
    """One page's WebSocket as a :class:`~rxstream.transport._link.PageLink`."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        *,
        peer: str,
        frames: int,
        limits: SessionLimits,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport | None,
    ) -> None:
        self.ws = ws
        self._peer = peer
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.transport = transport
        """The connection under the socket: cut when the page does not take a close frame."""
        self.frames: deque[bytes] = deque()
        self.max_frames = frames
        self.texts = Outbox(limits.queued_texts, limits.queued_text_bytes)
        self.ready = asyncio.Event()
        self.ping_due = False
        self.page: Page | None = None
        self._lock = threading.Lock()
        self._frame_bytes = 0
        self._socket = _bound(transport)

    @property
    def peer(self) -> str:
        return self._peer

    def unsent_bytes(self) -> int:
        with self._lock:
            queued = self._frame_bytes
        transport = self.transport
        buffered = 0
        if transport is not None and not transport.is_closing():
            with contextlib.suppress(Exception):
                buffered = transport.get_write_buffer_size()
        return queued + buffered + _notsent(self._socket)

    def send_frame(self, stream: str, data: bytes) -> bool:
        with self._lock:
            if len(self.frames) >= self.max_frames:
                return False
            self.frames.append(data)
            self._frame_bytes += len(data)
        self._wake()
        return True

    def pop_frame(self) -> bytes | None:
        with self._lock:
            if not self.frames:
                return None
            data = self.frames.popleft()
            self._frame_bytes -= len(data)
            return data

    def send_text(self, text: str, kind: str = "other", ident: Any = None, key: str = "") -> None:
        if threading.get_ident() == self._loop_thread:
            self._push_text(text, kind, ident, key)
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the page is gone
                self._loop.call_soon_threadsafe(self._push_text, text, kind, ident, key)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(self.ws.close(), self._loop)

    def _push_text(self, text: str, kind: str, ident: Any, key: str) -> None:
        # a text dropped is reported to the page once it reads
        if not self.texts.push(text, kind, ident, key) and self.page is not None:
            self.page.guard.log.warning("web_texts_dropped", kind=kind, queued=len(self.texts))
        self.ready.set()

    def _wake(self) -> None:
        if threading.get_ident() == self._loop_thread:
            self.ready.set()
        else:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.ready.set)


def _bound(transport: asyncio.Transport | None) -> Any:
    """Bound what waits unsent on the page's connection: TCP_NOTSENT_LOWAT on its socket
    (Linux) and the transport's write buffer; the socket (None where not a TCP socket)."""
    if transport is None:
        return None
    with contextlib.suppress(Exception):
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    lowat = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, lowat, NOTSENT_LOWAT_BYTES)
    except OSError:
        return None
    if not _loopback(sock):  # see RTO_MIN_S
        with contextlib.suppress(OSError):  # Linux 6.15 on; older kernels keep 200 ms
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_RTO_MIN_US, int(RTO_MIN_S * 1e6))
    return sock


def _loopback(sock: socket.socket) -> bool:
    """Whether ``sock``'s peer is on this host's loopback (where nothing is lost)."""
    try:
        return ipaddress.ip_address(sock.getpeername()[0]).is_loopback
    except (OSError, ValueError, IndexError):
        return False


def _notsent(sock: Any) -> int:
    """Bytes the kernel holds not yet sent on ``sock`` (0 where it cannot say)."""
    if sock is None:
        return 0
    try:
        answer = fcntl.ioctl(sock.fileno(), _SIOCOUTQNSD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", answer)[0])


class SocketWire:
    """The aiohttp server: the page, its socket, the Gate, TLS, one writer per page.

    ``protocol`` hears each page (attach, its messages, leave); ``gate`` decides who may
    have the page and the socket; ``frames`` bounds each page's frame queue.
    """

    def __init__(
        self,
        protocol: Wire,
        *,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        gate: Gate,
        limits: SessionLimits,
        frames: int,
        hard_message_bytes: int,
        silent_s: float,
    ) -> None:
        self.protocol = protocol
        self.silent_s = silent_s
        """A page that sends nothing (not even a ``pong``) this long has its connection cut
        (``_webwatch.py``): a half-open link never closes by itself."""
        self.host = host
        self.port = port
        self.tls = tls
        self.gate = gate
        self.limits = limits
        self.frames = frames
        self.hard_message_bytes = hard_message_bytes
        self.scheme = "http" if tls is None else "https"
        self.bound_port: int | None = None
        """The port listened on (None until the server runs)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The server's event loop (None while it does not run)."""
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._handshakes = SampledLog(limits.log_every_s)
        self._links: set[SocketLink] = set()
        self._connecting = 0
        self.metrics: MetricsHandler | None = None
        """What answers ``GET /metrics`` behind the Gate (a run's Prometheus exposition;
        None: 404, this session serves none). Any thread may set it."""

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.bound_port or self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None

    def call_later(self, delay: float, fn: Any) -> None:
        """Call ``fn`` on the server's loop ``delay`` seconds from now (any thread)."""
        loop = self.loop
        if loop is None:
            raise RuntimeError("the server's loop is not running")
        loop.call_soon_threadsafe(loop.call_later, delay, fn)

    def serve(self, url: str) -> None:
        started = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            try:
                loop.run_until_complete(self._start())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                _settle(loop)
                loop.close()

        thread = threading.Thread(target=main, name="rxstream:web", daemon=True)
        thread.start()
        if not started.wait(_START_S) or failure:
            thread.join(_START_S)
            self.loop = None
            cause = failure[0] if failure else TimeoutError("the server did not start")
            raise OSError(f"cannot serve the session page on {url}: {cause}") from cause
        self._thread = thread

    def stop(self) -> None:
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            return
        try:  # bounded (CLOSE_S per step); whatever it raised, the loop stops
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_START_S)
        except Exception:  # a shutdown cancelled or past its time: nothing of it is owed to the run
            _log.warning("web_shutdown_incomplete", exc_info=True)
        with contextlib.suppress(RuntimeError):  # the loop may have closed already
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_START_S)
        self.loop = self._thread = self._runner = None

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/ws", self._socket)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=CLOSE_S,
            keepalive_timeout=self.limits.idle_connection_s,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.tls)
        await site.start()
        self._runner = runner
        server = site._server
        sockets = getattr(server, "sockets", None) or ()
        self.bound_port = sockets[0].getsockname()[1] if sockets else self.port

    async def _shutdown(self) -> None:
        await asyncio.gather(*(self._cut(link) for link in tuple(self._links)))
        if self._runner is not None:
            try:
                await asyncio.wait_for(self._runner.cleanup(), 2 * CLOSE_S)
            except (Exception, asyncio.CancelledError):
                _log.warning("web_cleanup_incomplete", exc_info=True)
        current = asyncio.current_task()
        await _cancel([task for task in asyncio.all_tasks() if task is not current])

    async def _cut(self, link: SocketLink) -> None:
        """Close one page's socket; one that does not take the close frame in CLOSE_S is cut."""
        try:
            await asyncio.wait_for(link.ws.close(code=1001, message=b"session stopped"), CLOSE_S)
        except (Exception, asyncio.CancelledError):
            if link.page is not None:
                link.page.guard.log.warning(
                    "web_page_cut", reason="it did not take the close frame"
                )
            if link.transport is not None:  # close() would wait for the peer to read
                link.transport.abort()

    def _refusal(self, request: web.Request, *, bearer: bool = False) -> str | None:
        """Why this request may not have the page or the socket (None: it may); ``bearer``:
        the token may also come as ``Authorization: Bearer <token>`` (a scraper's way)."""
        token = request.query.get("token")
        if bearer and token is None:
            scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
            token = credentials.strip() if scheme.lower() == "bearer" else None
        reason = self.gate.refuse(
            host=request.headers.get("Host"),
            origin=request.headers.get("Origin"),
            token=token,
            scheme=self.scheme,
        )
        if reason is not None:
            self._handshakes.warning(
                "web_handshake_refused", path=request.path, peer=request.remote, reason=reason
            )
        return reason

    async def _page(self, request: web.Request) -> web.Response:
        reason = self._refusal(request)
        if reason is not None:
            return web.Response(status=403, text=f"403 Forbidden: {reason}\n")
        text = resources.files("rxstream.transport").joinpath("static/index.html").read_text()
        return web.Response(text=text, content_type="text/html", headers=PAGE_HEADERS)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        """The run's metrics, for a scraper: the Gate's token and Host (an ``Origin`` only
        when a browser sends one), the token in the query or as a bearer token."""
        reason = self._refusal(request, bearer=True)
        if reason is not None:
            return web.Response(status=403, text=f"403 Forbidden: {reason}\n")
        handler = self.metrics
        if handler is None:
            return web.Response(
                status=404,
                text="404 Not Found: this session serves no metrics (rxstream run --serve "
                "--metrics)\n",
            )
        return await handler(request)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        reason = self._refusal(request)
        if reason is not None:
            return web.Response(status=403, text=f"403 Forbidden: {reason}\n")
        if self.protocol.pages + self._connecting >= self.limits.max_connections:
            self._handshakes.warning("web_handshake_refused", peer=request.remote, reason="full")
            return web.Response(
                status=503,
                text=f"503 Service Unavailable: {self.limits.max_connections} connections are "
                "attached already (SessionLimits.max_connections)\n",
            )
        # No permessage-deflate: frames are JPEG or h264 already (raw would be deflated in an
        # executor thread), and deflating each message cost both ends ~0.15 ms of a frame's way
        # to the screen for nothing (docs/decisions.md).
        ws = web.WebSocketResponse(max_msg_size=self.hard_message_bytes, compress=False)
        link = SocketLink(
            ws,
            peer=f"{request.remote}:{peer_port(request)}",
            frames=self.frames,
            limits=self.limits,
            loop=asyncio.get_running_loop(),
            transport=request.transport,
        )
        self._connecting += 1  # counted before prepare() yields, so the cap holds for a burst
        try:
            await ws.prepare(request)
        except BaseException:
            self._connecting -= 1
            raise
        self._connecting -= 1
        page = self.protocol.attach(link)
        link.page = page
        self._links.add(link)
        writer = asyncio.ensure_future(self._write(link))
        pinger = asyncio.ensure_future(self._pinger(link))
        silence = Silence(self.silent_s)
        watcher = asyncio.ensure_future(silence.watch(link.transport, page.guard))
        try:
            async for message in ws:
                silence.hear()
                if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    refused = self.protocol.receive(page, message.data)
                else:  # ERROR: the frame was refused by the protocol (too big, bad UTF-8)
                    page.guard.log.warning("web_socket_failed", error=str(ws.exception()))
                    continue
                wait = page.guard.paced(refused)
                if wait > 0:  # over its rate: read this connection no faster (backpressure)
                    await asyncio.sleep(wait)
        finally:
            for task in (writer, pinger, watcher):
                task.cancel()
            self._links.discard(link)
            self.protocol.leave(page)
        return ws

    async def _write(self, link: SocketLink) -> None:
        ws = link.ws
        with contextlib.suppress(ConnectionError, RuntimeError):
            while not ws.closed:
                await link.ready.wait()
                link.ready.clear()
                if link.ping_due and link.page is not None:  # stamped as it leaves
                    link.ping_due = False
                    await ws.send_str(self.protocol.ping(link.page))
                # frames before texts: a frame's timing record is pushed just after the frame,
                # and the page handles messages in order (the timing table's DOM work would
                # come between the frame's arrival and its decode)
                while (frame := link.pop_frame()) is not None:
                    await ws.send_bytes(frame)
                while (text := link.texts.pop()) is not None:
                    await ws.send_str(text)

    async def _pinger(self, link: SocketLink) -> None:
        """Ask the page for its clock now and then (see :class:`ClockOffset`)."""
        pauses = iter(PINGS_S)
        while True:
            link.ping_due = True
            link.ready.set()
            await asyncio.sleep(next(pauses, PINGS_S[-1]))


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` (handlers stuck on a peer) and wait CLOSE_S at most for them to end."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=CLOSE_S)


def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """End what is still pending on ``loop`` before it closes (no "Task was destroyed")."""
    with contextlib.suppress(Exception):
        loop.run_until_complete(_cancel(list(asyncio.all_tasks(loop))))
        loop.run_until_complete(loop.shutdown_asyncgens())
