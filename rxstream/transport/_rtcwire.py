"""The WebRTC wire: a page's frames over a WebRTC data channel (aiortc), signalled over its
authenticated WebSocket.

A page attached on the WebSocket wire (``_wsserver.py``: token, Host and Origin checked)
may send an ``rtc-offer``; :class:`RtcWire` answers it with an ``rtc-answer`` on the same
socket (its SDP carries the server's ICE host candidates: aiortc gathers them before it
answers) and, once the page's ``video`` data channel opens, that page's link becomes an
:class:`RtcLink`: frames (the same packed frames the socket sends) over the channel,
texts still over the socket. The page's ``input`` channel carries ``input`` and ``got``
messages (unordered: an input older than one already heard is dropped, the newest wins).
A peer connection exists only for a page that signalled it on its socket: nothing else
reaches this wire. aiortc is the optional extra ``rxstream[webrtc]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rxstream._util import library_logger
from rxstream.transport._guard import wire
from rxstream.transport._link import PageLink
from rxstream.transport._page import Page

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "LOCAL_MAX_MESSAGE_BYTES",
    "SCTP_RTO_MIN_S",
    "RtcCounters",
    "RtcLink",
    "RtcWire",
    "available",
    "max_message_bytes",
    "without_mdns",
]

_log = library_logger("rxstream.web")

DEFAULT_MAX_MESSAGE_BYTES = 65536
"""The largest data channel message an offer that states none takes (RFC 8841)."""

LOCAL_MAX_MESSAGE_BYTES = 262144
"""The largest message sent on a channel whatever the page says (aiortc's own receive bound,
Chromium's): a frame over it goes over the socket instead (counted, ``oversized``)."""

SCTP_RTO_MIN_S = 0.1
"""The shortest SCTP retransmission timeout of the server's associations (aiortc's own is
1 s: a lost chunk with nothing sent after it, no fast retransmit, waited a second and the
page's decoder with it). Set on aiortc's module once a page offers; a round trip's own
estimate (smoothed RTT + 4 variations) still rules above it."""

_MAX_MESSAGE = re.compile(r"^a=max-message-size:(\d+)\s*$", re.MULTILINE)
_MDNS_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ \S+\.local .*\r?\n", re.MULTILINE)


def available() -> bool:
    """Whether aiortc can be imported here (the ``rxstream[webrtc]`` extra)."""
    try:
        import aiortc  # noqa: F401
    except ImportError:
        return False
    return True


def without_mdns(sdp: str) -> str:
    """``sdp`` without its mDNS host candidates (``….local``, a browser's own): the server
    could only resolve one on the page's own link (aiortc spends a second trying), and the
    page's connectivity checks reach it anyway (a peer-reflexive candidate)."""
    return _MDNS_CANDIDATE.sub("", sdp)


def max_message_bytes(sdp: str) -> int:
    """The largest message the peer of ``sdp`` takes on a data channel, within our bound."""
    found = _MAX_MESSAGE.search(sdp)
    stated = int(found.group(1)) if found else DEFAULT_MAX_MESSAGE_BYTES
    return LOCAL_MAX_MESSAGE_BYTES if stated == 0 else min(stated, LOCAL_MAX_MESSAGE_BYTES)


def _tune_sctp() -> None:
    """aiortc's minimum SCTP retransmission timeout down to SCTP_RTO_MIN_S (never up)."""
    from aiortc import rtcsctptransport

    sctp: Any = rtcsctptransport  # its constant is typed int: a float goes in
    current = getattr(sctp, "SCTP_RTO_MIN", None)
    if isinstance(current, int | float) and current > SCTP_RTO_MIN_S:
        sctp.SCTP_RTO_MIN = SCTP_RTO_MIN_S


@dataclass
class RtcCounters:
    """What the WebRTC wire did, all pages so far."""

    offers: int = 0
    """``rtc-offer``s answered (an ``rtc-answer`` sent)."""
    failed: int = 0
    """Offers aiortc could not answer (the page was sent an ``error``)."""
    opened: int = 0
    """Pages whose ``video`` channel opened (their frames went over WebRTC)."""
    frames: int = 0
    """Frames sent over a data channel."""
    frame_bytes: int = 0
    """Bytes of those frames."""
    oversized: int = 0
    """Frames over the channel's message bound, sent over the socket instead."""
    messages: int = 0
    """Messages heard on the pages' ``input`` channels."""
    stale: int = 0
    """``input``s dropped: an older one than the page's newest heard on the channel."""


class RtcLink:
    """One page's link on WebRTC: frames on its ``video`` data channel, everything else on
    ``base`` (its WebSocket link). A :class:`~rxstream.transport._link.PageLink`."""

    def __init__(
        self,
        base: PageLink,
        channel: Any,
        *,
        loop: asyncio.AbstractEventLoop,
        frames: int,
        max_message: int,
        counters: RtcCounters,
    ) -> None:
        self.base = base
        self.channel = channel
        self.max_frames = frames
        self.max_message = max_message
        self.counters = counters
        self._loop = loop
        self._lock = threading.Lock()
        self._queued = 0
        self._queued_bytes = 0

    @property
    def peer(self) -> str:
        return self.base.peer

    def unsent_bytes(self) -> int:
        """Frames handed over and not yet on the network: ours not yet given to the channel,
        the channel's buffered amount and what its SCTP association holds back (its
        congestion window)."""
        with self._lock:
            queued = self._queued_bytes
        channel = self.channel
        held = 0
        with contextlib.suppress(Exception):  # aiortc's own queue: a private attribute
            held = sum(len(chunk.user_data) for chunk in channel.transport._outbound_queue)
        return queued + int(channel.bufferedAmount) + held

    def send_frame(self, stream: str, data: bytes) -> bool:
        if len(data) > self.max_message:
            self.counters.oversized += 1
            return self.base.send_frame(stream, data)
        with self._lock:
            if self._queued >= self.max_frames:
                return False
            self._queued += 1
            self._queued_bytes += len(data)
        try:
            self._loop.call_soon_threadsafe(self._send, data)
        except RuntimeError:  # the loop closed: the page is gone
            return False
        return True

    def _send(self, data: bytes) -> None:
        with self._lock:
            self._queued -= 1
            self._queued_bytes -= len(data)
        if self.channel.readyState != "open":
            return
        try:
            self.channel.send(data)
        except Exception:  # the channel closed under us: the link goes back to the socket
            return
        self.counters.frames += 1
        self.counters.frame_bytes += len(data)

    def send_text(self, text: str, kind: str = "other", ident: Any = None, key: str = "") -> None:
        self.base.send_text(text, kind, ident, key)

    def close(self) -> None:
        self.base.close()


class RtcWire:
    """Peer connections for the pages that offered one on their socket.

    ``receive(page, text)`` is the protocol's (a message heard on a page's ``input``
    channel); ``keyframe(stream)`` asks a stream's encoder for an IDR (a page that moved to
    the channel joins at a keyframe); ``frames`` bounds each page's queue of frames not yet
    given to its channel; ``ice_servers`` (``RTCIceServer`` arguments: ``urls``,
    ``username``, ``credential``) adds a TURN relay, none by default (host candidates).
    """

    def __init__(
        self,
        *,
        receive: Callable[[Page, str | bytes], bool],
        keyframe: Callable[[str], None],
        frames: int,
        ice_servers: tuple[dict[str, Any], ...] = (),
    ) -> None:
        self._receive = receive
        self._keyframe = keyframe
        self.frames = frames
        self.ice_servers = ice_servers
        self.counters = RtcCounters()
        self._peers: dict[Page, Any] = {}
        self._inputs: dict[Page, dict[str, int]] = {}
        self._tasks: set[asyncio.Future[None]] = set()

    @property
    def peers(self) -> int:
        """Peer connections open now."""
        return len(self._peers)

    def attach(self, page: Page) -> None:
        """Tell a page just attached that this server takes an ``rtc-offer`` (and the ICE
        servers its peer connection may use besides host candidates)."""
        servers = [dict(server) for server in self.ice_servers]
        page.push_text(wire({"type": "rtc-config", "ice_servers": servers}), "session")

    def offer(self, page: Page, sdp: str, error: Callable[[Page, str], None]) -> None:
        """Answer ``page``'s offer (on the wire's loop; from its socket's handler). A new
        offer replaces the page's peer connection; ``error(page, text)`` tells the page
        an offer that could not be answered."""
        self._spawn(self._answer(page, sdp, error))

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, page: Page, sdp: str, error: Callable[[Page, str], None]) -> None:
        from aiortc import (  # the optional extra: imported only once a page offers
            RTCConfiguration,
            RTCIceServer,
            RTCPeerConnection,
            RTCSessionDescription,
        )

        _tune_sctp()
        await self._drop(page)
        servers = [RTCIceServer(**server) for server in self.ice_servers]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=servers))
        self._peers[page] = pc
        bound = max_message_bytes(sdp)
        loop = asyncio.get_running_loop()

        @pc.on("datachannel")
        def on_channel(channel: Any) -> None:
            if self._peers.get(page) is not pc:
                return
            if channel.label == "video":
                self._video(page, channel, loop, bound)
            elif channel.label == "input":
                channel.on("message", lambda message: self._heard(page, message))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed") and self._peers.get(page) is pc:
                await self._drop(page)

        try:
            offer = RTCSessionDescription(sdp=without_mdns(sdp), type="offer")
            await pc.setRemoteDescription(offer)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:
            self.counters.failed += 1
            await self._drop(page)
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            error(page, f"rtc-offer.sdp must be an offer aiortc can answer, refused: {detail}")
            return
        self.counters.offers += 1
        page.push_text(wire({"type": "rtc-answer", "sdp": pc.localDescription.sdp}), "rtc")

    def _video(self, page: Page, channel: Any, loop: asyncio.AbstractEventLoop, bound: int) -> None:
        """``page``'s video channel opened: its frames go over it, from a keyframe."""
        base = page.link.base if isinstance(page.link, RtcLink) else page.link
        link = RtcLink(
            base,
            channel,
            loop=loop,
            frames=self.frames,
            max_message=bound,
            counters=self.counters,
        )
        page.link = link
        self.counters.opened += 1
        _log.info("web_rtc_open", client=link.peer, max_message=bound)
        self._rejoin(page)
        channel.on("close", lambda: self._back(page, link))

    def _back(self, page: Page, link: RtcLink) -> None:
        """``page``'s video channel closed: its frames go over its socket again."""
        if page.link is link:
            page.link = link.base
            _log.info("web_rtc_closed", client=link.peer)
            self._rejoin(page)

    def _rejoin(self, page: Page) -> None:
        """The page's h264 streams start again at a keyframe on its new path."""
        with page.lock:
            streams = tuple(page.live)
            page.live.clear()
        for stream in streams:
            self._keyframe(stream)

    def _heard(self, page: Page, message: Any) -> None:
        """One message on ``page``'s input channel: to the protocol, unless it is an input
        older than the newest heard (the channel is unordered)."""
        self.counters.messages += 1
        if isinstance(message, str) and self._stale(page, message):
            self.counters.stale += 1
            return
        self._receive(page, message)

    def _stale(self, page: Page, text: str) -> bool:
        try:
            message = json.loads(text)
        except ValueError:
            return False  # the protocol answers it
        if not isinstance(message, dict) or message.get("type") != "input":
            return False
        ident, stream = message.get("id"), message.get("stream")
        if isinstance(ident, bool) or not isinstance(ident, int) or not isinstance(stream, str):
            return False
        newest = self._inputs.setdefault(page, {})
        if ident <= newest.get(stream, 0):
            return True
        if len(newest) < 64 or stream in newest:  # bounded: a page names few streams
            newest[stream] = ident
        return False

    def leave(self, page: Page) -> None:
        """``page``'s socket closed: its peer connection ends too (on the wire's loop)."""
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop()
            self._spawn(self._drop(page))
            return
        self._peers.pop(page, None)  # no loop: the pc is gone with it

    async def _drop(self, page: Page) -> None:
        pc = self._peers.pop(page, None)
        self._inputs.pop(page, None)
        if isinstance(page.link, RtcLink):
            self._back(page, page.link)
        if pc is not None:
            with contextlib.suppress(Exception):
                await pc.close()

    async def close(self) -> None:
        """End every peer connection (the server stops)."""
        for page in tuple(self._peers):
            await self._drop(page)
