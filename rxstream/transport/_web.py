"""The web session transport: one local page that shows the stream and steers the pipeline.

``WebTransport`` is the page protocol (``_pageprotocol.py``) over the WebSocket wire
(``_wsserver.py``): a page (``GET /``) and a WebSocket (``/ws``) served from their own thread
and event loop, so the pipeline's threads never wait on the network:

- egress: every item of every ``ctx.stream`` goes to each attached page as one binary
  message — ``b"F"``, a 4-byte big-endian header length, a JSON header (stream, codec,
  width, height, seq, pts, input_seq, generation, cutover, idle), then the encoded frame — in
  the stream's codec when the page can play it (it lists what it can in its ``hello``), else
  as JPEG. Latency first: a frame that would queue on a page's link (more in flight than the
  link carries, from the page's ``got`` acks, or unsent bytes waiting) is not sent to that
  page (counted in :attr:`WebTransport.dropped` and :attr:`WebTransport.drops`), never the
  pipeline's time.
- control: the page sends JSON messages — ``hello``, ``input`` (a sample for a
  ``ctx.input`` stream), ``set`` and ``steer`` (doc writes), ``keyframe`` (its decoder
  lost the stream: the next frame is an IDR), ``pong`` (its answer to the server's ``ping``:
  the clock offset), ``got`` (a frame arrived: the link estimate) and ``shown`` (a frame
  it presented: the record's client hops, see ``_photon.py``). Each is validated; an unknown
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

import ssl

from rxstream._exceptions import ArgumentError
from rxstream._util import library_logger
from rxstream.item import PipelineItem
from rxstream.timing import TimingRecord
from rxstream.transport._base import Session, Transport
from rxstream.transport._guard import (
    Gate,
    SessionLimits,
    check_token,
    is_loopback,
    new_token,
    shown,
)
from rxstream.transport._page import Page
from rxstream.transport._pageprotocol import PageProtocol
from rxstream.transport._webdocs import DOC_EVERY_S
from rxstream.transport._webmessages import MESSAGE_TYPES
from rxstream.transport._webwatch import silent_bound
from rxstream.transport._wsserver import CLOSE_S, MetricsHandler, SocketWire

__all__ = ["CLOSE_S", "DOC_EVERY_S", "MESSAGE_TYPES", "WebTransport"]

_log = library_logger("rxstream.web")


class WebTransport(Transport):
    """Serve the session page on ``http://host:port/`` (loopback unless ``allow_remote``),
    or on ``https://host:port/`` given ``tls`` (a server ``ssl.SSLContext``, e.g.
    ``rxstream.transport._tls.server_context(cert, key)``): a remote page is then a secure
    context and gets the WebCodecs path.

    ``port=0`` picks a free port (read :attr:`url` after the run started). ``grace_s`` is
    how long ``connected`` stays true after the last page left; ``max_message_bytes`` bounds
    one message from a page; ``client_frames`` how many frames may wait for a slow page;
    ``fps`` is the frame rate written into h264 fragments; ``jpeg_quality`` 1..95.

    ``token``: True (default) makes a fresh secret for this transport, a string is used as
    the secret (16..256 URL-safe characters), False serves without one (a warning is logged:
    any process that reaches the port may then watch and steer). ``limits`` bounds what each
    connection may send (:class:`SessionLimits`); ``allowed_hosts`` adds names a ``Host``
    header may carry besides the bound address and ``localhost`` (for ``allow_remote``).
    Without ``tls`` on a host that is not loopback a warning is logged (``web_not_secure``):
    a remote visitor's page is not a secure context and falls back to JPEG.

    ``rate_control`` (default on): each stream's encoder follows its pages' links, from their
    frame acks (a ``RateController`` per page and stream; a shared encoder takes the lowest
    rate any of its pages asks for; each page is told in a ``rate`` message).

    ``metrics``: the launch that runs this session makes its Prometheus metrics and this
    server answers ``GET /metrics`` with them (:attr:`metrics_url`), behind the same token
    and ``Host`` check as the page; the token in the query or as ``Authorization: Bearer``.
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
        rate_control: bool = True,
        metrics: bool = False,
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
        self.metrics = metrics
        """Whether the launch serves its Prometheus metrics here (at :attr:`metrics_url`)."""
        self.session_id = new_token()[:16]
        """This session's id (not its secret): what its traces carry as ``rxstream.session``."""
        self.token: str | None = (
            new_token() if token is True else None if token is False else check_token(token)
        )
        """The per-run secret the page and ``/ws`` need (None: served without one)."""
        self.limits = SessionLimits() if limits is None else limits
        self.tls = tls
        """The server's TLS context (None: plain http)."""
        self.host = host
        self.port = port
        self.grace_s = grace_s
        self.max_message_bytes = max_message_bytes
        self.client_frames = client_frames
        self.jpeg_quality = jpeg_quality
        self.fps = fps
        self.protocol = PageProtocol(
            limits=self.limits,
            grace_s=grace_s,
            max_message_bytes=max_message_bytes,
            fps=fps,
            jpeg_quality=jpeg_quality,
            rate_control=rate_control,
        )
        """The page protocol: messages, doc states, photon reports, frames per page."""
        self.server = SocketWire(
            self.protocol,
            host=host,
            port=port,
            tls=tls,
            gate=Gate(
                host=host, token=self.token, allow_remote=allow_remote, allowed_hosts=allowed_hosts
            ),
            limits=self.limits,
            frames=client_frames,
            hard_message_bytes=self.hard_message_bytes,
            silent_s=silent_bound(grace_s),
        )
        """The WebSocket wire: the page, ``/ws``, the Gate, TLS."""

    # --- the Transport contract -----------------------------------------------------------

    @property
    def url(self) -> str:
        """The page's address with its token (the bound port once the server runs)."""
        return f"{self.scheme}://{self.server.address}/" + (
            "" if self.token is None else f"?token={self.token}"
        )

    @property
    def metrics_url(self) -> str:
        """The run's Prometheus metrics, with the token (served with ``metrics=True``)."""
        return f"{self.scheme}://{self.server.address}/metrics" + (
            "" if self.token is None else f"?token={self.token}"
        )

    def serve_metrics(self, handler: MetricsHandler | None) -> None:
        """Answer ``GET /metrics`` with ``handler`` (an aiohttp handler, e.g.
        ``RunMetrics.aiohttp_handler()``) behind the token; None: 404 again (any thread)."""
        self.server.metrics = handler

    @property
    def ws_url(self) -> str:
        """The WebSocket's address with the token, for a client that is not the page."""
        ws = "wss" if self.tls is not None else "ws"
        return f"{ws}://{self.server.address}/ws" + (
            "" if self.token is None else f"?token={self.token}"
        )

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
    def bound_port(self) -> int | None:
        """The port the server listens on (None until it runs)."""
        return self.server.bound_port

    @property
    def hard_message_bytes(self) -> int:
        """Past this a message is not even read: the socket is closed (1009, too big)."""
        return max(4 * self.max_message_bytes, 1 << 20)

    @property
    def connected(self) -> bool:
        return self.protocol.connected

    @property
    def attached(self) -> int:
        """Pages attached so far (reloads count)."""
        return self.protocol.attached

    @property
    def pages(self) -> int:
        """Pages attached now."""
        return self.protocol.pages

    @property
    def dropped(self) -> int:
        """Frames not sent to a page because its link could not take them (all reasons)."""
        return sum(self.protocol.drops.values())

    @property
    def drops(self) -> dict[str, int]:
        """Frames not sent to a page, by reason: ``link`` (it would have queued: more in
        flight or unsent than the page's link carries), ``queue`` (its frame queue was full)."""
        return self.protocol.drops

    def pages_now(self) -> tuple[Page, ...]:
        """The pages attached now (each with its ``link_state()``)."""
        return self.protocol.pages_now()

    def open(self, session: Session) -> None:
        if not self.server.running:
            self.server.serve(self.url)
            self._started()
        self.protocol.start(self.server.call_later)
        self.protocol.open(session)

    def send(self, stream: str, item: PipelineItem) -> None:
        self.protocol.send(stream, item)

    def on_timing(self, record: TimingRecord) -> None:
        self.protocol.on_timing(record)

    def close(self) -> None:
        self.protocol.close()
        if not self.server.running:
            return
        self.server.stop()
        self.protocol.start(None)  # its loop is gone: a due doc state will never be sent
        self.protocol.close_encoders()

    def _started(self) -> None:
        url = f"{self.scheme}://{self.server.address}/"
        _log.info("web_session_serving", url=url)
        if not self.secure_context:
            _log.warning(
                "web_not_secure",
                url=url,
                risk="a remote visitor's page is not a secure context: no WebCodecs (JPEG at "
                "several times the bytes), no pointer raw updates; serve it over TLS",
            )
        if self.token is None:
            _log.warning(
                "web_session_without_token",
                url=self.url,
                risk="any process that reaches the port may watch and steer this session",
            )
