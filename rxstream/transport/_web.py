"""The web session transport: one local page that shows the stream and steers the pipeline.

``WebTransport`` serves a page (``GET /``) and a WebSocket (``/ws``) from its own thread and
event loop, so the pipeline's threads never wait on the network:

- egress: every item of every ``ctx.stream`` goes to each attached page as one binary
  message — ``b"F"``, a 4-byte big-endian header length, a JSON header (stream, codec,
  width, height, seq, pts, input_seq, generation, cutover, idle), then the encoded frame — in
  the stream's codec when the page can play it (it lists what it can in its ``hello``), else
  as JPEG. A page that falls behind loses its oldest frames (counted in
  :attr:`WebTransport.dropped`), never the pipeline's time.
- control: the page sends JSON messages — ``hello``, ``input`` (a sample for a
  ``ctx.input`` stream), ``set`` and ``steer`` (doc writes), ``keyframe`` (its decoder
  lost the stream: the next frame is an IDR), ``pong`` (its answer to the server's ``ping``:
  the clock offset) and ``shown`` (a frame it presented: the record's client hops, see
  ``_photon.py``). Each is validated; an unknown
  type, a malformed or oversized message, a write the doc's schema refuses, an unknown
  stream or an over-limit client stream is answered with ``{"type": "error", "code": …,
  "error": …}`` on that socket, and the session goes on. A handler that raises is answered
  too (``internal``); nothing a page sends ends the run.
- guard (``_guard.py``): the page and ``/ws`` need the per-run token (in :attr:`url`), a
  ``Host`` that is this server and, from a browser, the page's own ``Origin``; messages are
  parsed within :class:`SessionLimits` (depth, digits, string length) and rated per
  connection; refusals are logged once a second per connection at most.
- state: on attach the page gets a ``session`` message (streams, inputs, each doc's
  controls); then each doc's newest state after it changed (``doc``, DOC_EVERY_S apart at
  most), every timing record (``timing``) and an ``ack`` for each message with an ``id``.

- outages (``_webwatch.py``): a page that sends nothing, not even a ``pong``, for
  ``max(grace_s, SILENT_MIN_S)`` has its connection cut (a half-open link never closes by
  itself); each page is told both times on attach (``resume``) and reconnects within them.

``connected`` is true while a page is attached — and before the first one came, so a
session waits for its page — and turns false ``grace_s`` after the last page left, so
``pipeline.run()`` stops when the page is closed (a reload within the grace keeps it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import WSMsgType, web

from rxstream._exceptions import ArgumentError
from rxstream._util import library_logger
from rxstream.item import PipelineItem
from rxstream.timing import ClientTiming, TimingRecord
from rxstream.transport._base import Session, Transport
from rxstream.transport._codecs import Encoder, H264Fragments, encoder, preload, to_rgb24
from rxstream.transport._guard import (
    ClientGuard,
    Gate,
    SampledLog,
    SessionLimits,
    TokenBucket,
    check_token,
    is_loopback,
    new_token,
    shown,
    wire,
)
from rxstream.transport._photon import PhotonJoin, log_photon
from rxstream.transport._webclient import (
    PAGE_HEADERS,
    PINGS_S,
    Client,
    input_of,
    pack,
    pack_unit,
    peer_port,
)
from rxstream.transport._webdocs import DOC_EVERY_S, DocStates
from rxstream.transport._webmessages import MESSAGE_TYPES, RATED, PageMessages
from rxstream.transport._webwatch import Silence, resume_fields, silent_bound

__all__ = ["DOC_EVERY_S", "MESSAGE_TYPES", "WebTransport"]

_log = library_logger("rxstream.web")

_START_S = 10.0

CLOSE_S = 1.0
"""When the session stops, a page gets this long to take the close frame (and a request in
flight this long to end); a page that does not read by then has its connection cut."""


class WebTransport(DocStates, PageMessages, Transport):
    """Serve the session page on ``http://host:port/`` (loopback unless ``allow_remote``),
    or on ``https://host:port/`` given ``tls`` (a server ``ssl.SSLContext``, e.g.
    ``rxstream.transport._tls.server_context(cert, key)``): a remote page is then a secure
    context and gets the WebCodecs path.

    ``port=0`` picks a free port (read :attr:`url` after the run started). ``grace_s`` is
    how long ``connected`` stays true after the last page left (a page that reconnects within
    it resumes the session; one silent for ``max(grace_s, SILENT_MIN_S)`` is cut);
    ``max_message_bytes`` bounds one message from a page; ``client_frames`` how many frames
    may wait for a slow page; ``fps`` is the frame rate written into h264 fragments;
    ``jpeg_quality`` 1..95.

    ``token``: True (default) makes a fresh secret for this transport, a string is used as
    the secret (16..256 URL-safe characters), False serves without one (a warning is logged:
    any process that reaches the port may then watch and steer). ``limits`` bounds what each
    connection may send (:class:`SessionLimits`); ``allowed_hosts`` adds names a ``Host``
    header may carry besides the bound address and ``localhost`` (for ``allow_remote``).
    Without ``tls`` on a host that is not loopback a warning is logged (``web_not_secure``):
    a remote visitor's page is not a secure context and falls back to JPEG.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        allow_remote: bool = False,
        grace_s: float = 2.0,
        max_message_bytes: int = 64 * 1024,
        client_frames: int = 4,
        jpeg_quality: int = 80,
        fps: float = 24.0,
        token: str | bool = True,
        limits: SessionLimits | None = None,
        allowed_hosts: tuple[str, ...] = (),
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not is_loopback(host) and not allow_remote:
            raise ArgumentError(
                f"host must be a loopback address (127.0.0.1, ::1, localhost) unless "
                f"allow_remote=True (--allow-remote), got {host!r}"
            )
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ArgumentError(f"port must be an int in 0..65535, got {port!r}")
        if grace_s < 0:
            raise ArgumentError(f"grace_s must be >= 0 seconds, got {grace_s}")
        if max_message_bytes < 256:
            raise ArgumentError(f"max_message_bytes must be >= 256, got {max_message_bytes}")
        if client_frames < 1:
            raise ArgumentError(f"client_frames must be >= 1, got {client_frames}")
        if tls is not None and not isinstance(tls, ssl.SSLContext):
            raise ArgumentError(f"tls must be an ssl.SSLContext, got {shown(tls)}")
        if limits is not None and not isinstance(limits, SessionLimits):
            raise ArgumentError(f"limits must be a SessionLimits, got {shown(limits)}")
        self.token: str | None = (
            new_token() if token is True else None if token is False else check_token(token)
        )
        """The per-run secret the page and ``/ws`` need (None: served without one)."""
        self.limits = SessionLimits() if limits is None else limits
        self._gate = Gate(
            host=host, token=self.token, allow_remote=allow_remote, allowed_hosts=allowed_hosts
        )
        self._handshakes = SampledLog(self.limits.log_every_s)
        self._handlers: dict[str, Callable[[Client, dict[str, Any]], dict[str, Any]]] = {
            "hello": self._on_hello,
            "input": self._on_input,
            "set": self._on_set,
            "steer": self._on_steer,
            "keyframe": self._on_keyframe,
            "pong": self._on_pong,
            "shown": self._on_shown,
        }
        """The message types a page may send, each to its handler (add a type here)."""
        self.tls = tls
        """The server's TLS context (None: plain http)."""
        self.host = host
        self.port = port
        self.grace_s = grace_s
        self.max_message_bytes = max_message_bytes
        self.client_frames = client_frames
        self.jpeg_quality = jpeg_quality
        self.fps = fps
        self._session = Session()
        self._clients: set[Client] = set()
        self._lock = threading.Lock()
        self._ever_attached = False
        self._left_at = 0.0
        self._open = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None
        self._shared: dict[tuple[str, str], Encoder] = {}
        self._seq: dict[str, int] = {}
        self._subscriptions: list[Any] = []
        self._dropped_closed = 0
        self._photon = PhotonJoin()
        self._keyframes: dict[str, TokenBucket] = {}
        self._keyframes_lock = threading.Lock()
        self._clock = time.monotonic
        self._dirty_docs: set[str] = set()
        self._docs_due = False
        self._docs_sent_at = 0.0
        self._doc_writes = TokenBucket(self.limits.doc_writes)
        self.attached = 0
        """Pages attached so far (reloads count)."""

    # --- the Transport contract -----------------------------------------------------------

    @property
    def url(self) -> str:
        """The page's address with its token (the bound port once the server runs)."""
        return f"{self.scheme}://{self._address}/" + (
            "" if self.token is None else f"?token={self.token}"
        )

    @property
    def ws_url(self) -> str:
        """The WebSocket's address with the token, for a client that is not the page."""
        ws = "wss" if self.tls is not None else "ws"
        return f"{ws}://{self._address}/ws" + ("" if self.token is None else f"?token={self.token}")

    @property
    def scheme(self) -> str:
        """``https`` with ``tls``, else ``http``: the page's origin starts with it."""
        return "http" if self.tls is None else "https"

    @property
    def secure_context(self) -> bool:
        """Whether a page of this server is a secure context for every visitor: served over
        TLS, or bound to loopback (which only this machine reaches)."""
        return self.tls is not None or is_loopback(self.host)

    @property
    def _address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self._bound_port or self.port}"

    @property
    def connected(self) -> bool:
        if not self._open:
            return False
        with self._lock:
            if self._clients or not self._ever_attached:
                return True
            return time.monotonic() - self._left_at < self.grace_s

    @property
    def pages(self) -> int:
        """Pages attached now."""
        with self._lock:
            return len(self._clients)

    @property
    def dropped(self) -> int:
        """Frames dropped because a page was too slow to take them."""
        with self._lock:
            return self._dropped_closed + sum(c.dropped for c in self._clients)

    def open(self, session: Session) -> None:
        self._session = session
        for codec in {*session.streams.values(), "jpeg"}:  # jpeg: any page's fallback
            preload(codec)
        self._seq = dict.fromkeys(session.streams, 0)
        with self._lock:  # a send_docs the last close() stopped never ran: owe no page a state
            self._dirty_docs.clear()
            self._docs_due = False
        if self._thread is None:
            self._serve()
        self._open = True
        for name, doc in session.docs.items():
            self._subscriptions.append(doc.snapshots.subscribe(self._doc_listener(name)))
        self._broadcast_text(self._session_message())

    def send(self, stream: str, item: PipelineItem) -> None:
        seq = self._seq.get(stream, 0) + 1
        self._seq[stream] = seq
        with self._lock:
            clients = tuple(self._clients)
        if not clients or self._loop is None:
            return
        codec = self._session.streams.get(stream, "raw")
        frame = to_rgb24(item.payload, stream=stream)
        md = item.metadata
        header = {
            "stream": stream,
            "width": int(frame.shape[1]),
            "height": int(frame.shape[0]),
            "seq": seq,
            "pts": md.pts,
            "input_seq": md.input_seq,
            "generation": md.prompt_generation,
            "cutover": md.cutover,
            "idle": md.idle,
            "input": input_of(md.timeline),
        }
        self._photon.sent(stream, seq, md.timeline)
        payloads: dict[str, bytes] = {}
        packed: dict[str, bytes] = {}
        h264: H264Fragments | None = None
        for client in clients:
            chosen = codec if codec in client.accept else "jpeg"
            if chosen not in payloads:
                made = self._encoder(stream, chosen)
                payloads[chosen] = made.encode(frame)
                packed[chosen] = pack({**header, "codec": chosen}, payloads[chosen])
                if isinstance(made, H264Fragments):
                    h264 = made
            data = packed[chosen]
            joining = False
            if h264 is not None and chosen == "h264" and stream not in client.live:
                if not h264.keyframe:  # the page joins at the next keyframe
                    if client.guard.allows("keyframe"):  # its own rate, as for a request
                        self._request_keyframe(stream, h264)
                    continue
                client.live.add(stream)
                joining = True
            if h264 is not None and chosen == "h264" and "h264-au" in client.accept:
                if "h264-au" not in packed:  # WebCodecs: the access unit alone
                    packed["h264-au"] = pack_unit(header, h264)
                data = packed["h264-au"]
            elif h264 is not None and joining:
                init = h264.init_segment or b""
                body = payloads[chosen]
                data = pack(
                    {
                        **header,
                        "codec": chosen,
                        "init": True,
                        "mime": h264.mime_type,
                        "fps": self.fps,
                    },
                    body if body.startswith(init) else init + body,
                )
            self._loop.call_soon_threadsafe(client.push_frame, stream, chosen, data)

    def on_timing(self, record: TimingRecord) -> None:
        self._broadcast_text(wire({"type": "timing", "record": record.fields()}), "timing")
        for joined, client, page in self._photon.record(record):
            self._photon_joined(joined, client, page)

    def close(self) -> None:
        self._open = False
        for subscription in self._subscriptions:
            subscription.dispose()
        self._subscriptions.clear()
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:  # bounded (CLOSE_S per step); whatever it raised, the loop stops and encoders close
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_START_S)
        except Exception:  # a shutdown cancelled or past its time: nothing of it is owed to the run
            _log.warning("web_shutdown_incomplete", exc_info=True)
        with contextlib.suppress(RuntimeError):  # the loop may have closed already
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_START_S)
        self._loop = self._thread = self._runner = None
        with self._lock:  # its loop is gone: a due send_docs will never run
            self._dirty_docs.clear()
            self._docs_due = False
        for key in list(self._shared):
            self._shared.pop(key).close()

    # --- encoding -------------------------------------------------------------------------

    def _request_keyframe(self, stream: str, made: H264Fragments) -> bool:
        """Ask ``stream``'s shared encoder for an IDR frame within ``requested_keyframes``."""
        with self._keyframes_lock:
            if made.keyframe_requested:
                return True
            bucket = self._keyframes.get(stream)
            if bucket is None:
                bucket = TokenBucket(self.limits.requested_keyframes, self._clock)
                self._keyframes[stream] = bucket
            if not bucket.take():
                return False
            made.request_keyframe()
            return True

    def _encoder(self, stream: str, codec: str) -> Encoder:
        made = self._shared.get((stream, codec))
        if made is None:
            made = self._shared[(stream, codec)] = encoder(
                codec, stream=stream, fps=self.fps, quality=self.jpeg_quality
            )
        return made

    def _broadcast_text(self, text: str, kind: str = "other", key: str = "") -> None:
        loop = self._loop
        if loop is None:
            return
        with self._lock:
            clients = tuple(self._clients)
        for client in clients:
            loop.call_soon_threadsafe(client.push_text, text, kind, None, key)

    # --- the server -----------------------------------------------------------------------

    def _serve(self) -> None:
        started = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
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
            self._loop = None
            cause = failure[0] if failure else TimeoutError("the server did not start")
            raise OSError(f"cannot serve the session page on {self.url}: {cause}") from cause
        self._thread = thread

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/ws", self._socket)
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
        self._bound_port = sockets[0].getsockname()[1] if sockets else self.port
        _log.info("web_session_serving", url=f"{self.scheme}://{self._address}/")
        if not self.secure_context:
            _log.warning(
                "web_not_secure",
                url=f"{self.scheme}://{self._address}/",
                risk="a remote visitor's page is not a secure context: no WebCodecs (JPEG at "
                "several times the bytes), no pointer raw updates; serve it over TLS",
            )
        if self.token is None:
            _log.warning(
                "web_session_without_token",
                url=self.url,
                risk="any process that reaches the port may watch and steer this session",
            )

    async def _shutdown(self) -> None:
        with self._lock:
            clients = tuple(self._clients)
        await asyncio.gather(*(self._cut(client) for client in clients))
        if self._runner is not None:
            try:
                await asyncio.wait_for(self._runner.cleanup(), 2 * CLOSE_S)
            except (Exception, asyncio.CancelledError):
                _log.warning("web_cleanup_incomplete", exc_info=True)
        current = asyncio.current_task()
        await _cancel([task for task in asyncio.all_tasks() if task is not current])

    async def _cut(self, client: Client) -> None:
        """Close one page's socket; one that does not take the close frame in CLOSE_S is cut."""
        try:
            await asyncio.wait_for(client.ws.close(code=1001, message=b"session stopped"), CLOSE_S)
        except (Exception, asyncio.CancelledError):
            client.guard.log.warning("web_page_cut", reason="it did not take the close frame")
            if client.transport is not None:  # close() would wait for the peer to read
                client.transport.abort()

    def _refusal(self, request: web.Request) -> str | None:
        """Why this request may not have the page or the socket (None: it may)."""
        reason = self._gate.refuse(
            host=request.headers.get("Host"),
            origin=request.headers.get("Origin"),
            token=request.query.get("token"),
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

    @property
    def hard_message_bytes(self) -> int:
        """Past this a message is not even read: the socket is closed (1009, too big)."""
        return max(4 * self.max_message_bytes, 1 << 20)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        reason = self._refusal(request)
        if reason is not None:
            return web.Response(status=403, text=f"403 Forbidden: {reason}\n")
        if self.pages >= self.limits.max_connections:
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
        guard = ClientGuard(self.limits, f"{request.remote}:{peer_port(request)}", RATED)
        client = Client(ws, self.client_frames, guard)
        client.transport = request.transport
        with self._lock:  # counted before prepare() yields, so the cap holds for a burst
            self._clients.add(client)
        writer: asyncio.Future[None] | None = None
        pinger: asyncio.Future[None] | None = None
        silence = Silence(silent_bound(self.grace_s))
        watcher: asyncio.Future[None] | None = None
        try:
            await ws.prepare(request)
            with self._lock:
                self._ever_attached = True
                self.attached += 1
                client.number = self.attached
            client.push_text(self._session_message(), "session")
            client.push_text(wire({"type": "resume", **resume_fields(self.grace_s)}), "session")
            writer = asyncio.ensure_future(self._write(client))
            pinger = asyncio.ensure_future(self._ping(client))
            watcher = asyncio.ensure_future(silence.watch(client.transport, guard))
            async for message in ws:
                silence.hear()
                if message.type == WSMsgType.TEXT:
                    refused = self._receive(client, message.data)
                elif message.type == WSMsgType.BINARY:
                    self._error(client, None, "malformed", "messages must be JSON text")
                    refused = True
                else:  # ERROR: the frame was refused by the protocol (too big, bad UTF-8)
                    guard.log.warning("web_socket_failed", error=str(ws.exception()))
                    continue
                wait = guard.paced(refused)
                if wait > 0:  # over its rate: read this connection no faster (backpressure)
                    await asyncio.sleep(wait)
        finally:
            if writer is not None:
                writer.cancel()
            for task in (pinger, watcher):
                if task is not None:
                    task.cancel()
            guard.log.flush()
            with self._lock:
                self._clients.discard(client)
                self._dropped_closed += client.dropped
                self._left_at = time.monotonic()
        return ws

    async def _write(self, client: Client) -> None:
        ws = client.ws
        with contextlib.suppress(ConnectionError, RuntimeError):
            while not ws.closed:
                await client.ready.wait()
                client.ready.clear()
                if client.ping_due:  # stamped as it leaves: the round trip starts here
                    client.ping_due = False
                    sent = time.monotonic() * 1e3
                    client.pings.append(sent)
                    await ws.send_str(wire({"type": "ping", "t": sent}))
                # frames before texts: a frame's timing record is pushed just after the frame,
                # and the page handles messages in order (the timing table's DOM work would
                # come between the frame's arrival and its decode)
                while client.frames:
                    await ws.send_bytes(client.frames.popleft())
                while (text := client.texts.pop()) is not None:
                    await ws.send_str(text)

    async def _ping(self, client: Client) -> None:
        """Ask the page for its clock now and then (see :class:`ClockOffset`)."""
        pauses = iter(PINGS_S)
        while True:
            client.ping_due = True
            client.ready.set()
            await asyncio.sleep(next(pauses, PINGS_S[-1]))

    def _photon_joined(self, record: TimingRecord, timing: ClientTiming, page: int) -> None:
        fields = log_photon(record, timing, page)
        self._broadcast_text(wire({"type": "photon", **fields}), "photon")


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
