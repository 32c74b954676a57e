"""The page protocol: everything the session's pages and the server say to each other,
whatever the wire.

:class:`PageProtocol` knows nothing of sockets. A wire (``_link.py``) hands it each page's
link (:meth:`~PageProtocol.attach`), each text the page sent (:meth:`~PageProtocol.receive`)
and its leaving (:meth:`~PageProtocol.leave`); the protocol answers on the links: the
``session`` message, acks and errors (``_webmessages.py``), doc states (``_webdocs.py``),
timing and photon records, and each stream's frames, fanned out per page with latency-first
delivery: a frame that would queue on a page's link is not sent to that page (counted,
reason ``link``), decided before encoding; a frame no h264 page can take is not encoded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rxstream._util import library_logger
from rxstream.item import PipelineItem
from rxstream.timing import ClientTiming, TimingRecord
from rxstream.transport._base import Session
from rxstream.transport._codecs import Encoder, H264Fragments, encoder, preload, to_rgb24
from rxstream.transport._guard import ClientGuard, SessionLimits, TokenBucket, wire
from rxstream.transport._link import PageLink, Timer
from rxstream.transport._linkestimate import LinkEstimate
from rxstream.transport._page import DROP_REASONS, Page
from rxstream.transport._pagerate import RATE_START_KBPS, SharedRates
from rxstream.transport._photon import PhotonJoin, log_photon
from rxstream.transport._webclient import input_of, pack, pack_unit
from rxstream.transport._webdocs import DocStates, session_message
from rxstream.transport._webmessages import RATED, PageMessages
from rxstream.transport._webwatch import resume_fields

__all__ = ["PageProtocol"]

_log = library_logger("rxstream.web")


class PageProtocol:
    """The session's side of every attached page, over any number of wires.

    ``grace_s``: how long :attr:`connected` stays true after the last page left;
    ``fps`` is written into h264 fragments; ``jpeg_quality`` 1..95; ``rate_control``: each
    encoder's bitrate (JPEG quality) follows its pages' links (``_pagerate.py``); ``clock``
    times the keyframe budget and the links' estimates.
    """

    def __init__(
        self,
        *,
        limits: SessionLimits,
        grace_s: float,
        max_message_bytes: int,
        fps: float,
        jpeg_quality: int,
        rate_control: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.grace_s = grace_s
        self.fps = fps
        self.jpeg_quality = jpeg_quality
        self.clock = clock
        self.session = Session()
        """The open session (an empty one until :meth:`open`)."""
        self.opened = False
        """Between :meth:`open` and :meth:`close`: :attr:`connected` is false outside it."""
        self.attached = 0
        """Pages attached so far (reloads count)."""
        self.photon = PhotonJoin()
        self.rates = SharedRates(fps=fps) if rate_control else None
        """The pages' rate controllers and what each encoder is set to (None: off)."""
        self.encoders: dict[tuple[str, str], Encoder] = {}
        """Each (stream, codec)'s encoder, shared by every page that plays it."""
        self._pages: set[Page] = set()
        self._lock = threading.Lock()
        self._ever_attached = False
        self._left_at = 0.0
        self._left_drops: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._seq: dict[str, int] = {}
        self._keyframes: dict[str, TokenBucket] = {}
        self._keyframes_lock = threading.Lock()
        self._subscriptions: list[Any] = []
        self.attaching: list[Callable[[Page], None]] = []
        """Called with each page just attached, after its ``session`` message (a wire
        layered on another: the WebRTC wire offers itself)."""
        self.leaving: list[Callable[[Page], None]] = []
        """Called with each page whose connection ended (a wire layered on another: the
        WebRTC wire ends the page's peer connection)."""
        self.docs = DocStates(session=lambda: self.session, pages=self.pages_now)
        self.messages = PageMessages(
            session=lambda: self.session,
            limits=limits,
            max_message_bytes=max_message_bytes,
            photon=self.photon,
            joined=self._photon_joined,
            keyframe=self.request_keyframe,
            acked=self._acked,
        )

    # --- state ----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while a page is attached, and before the first one came; false ``grace_s``
        after the last left, and outside open..close."""
        if not self.opened:
            return False
        with self._lock:
            if self._pages or not self._ever_attached:
                return True
            return self.clock() - self._left_at < self.grace_s

    @property
    def pages(self) -> int:
        """Pages attached now."""
        with self._lock:
            return len(self._pages)

    def pages_now(self) -> tuple[Page, ...]:
        """The pages attached now."""
        with self._lock:
            return tuple(self._pages)

    @property
    def drops(self) -> dict[str, int]:
        """Frames not sent to a page, by reason (``link``, ``queue``), all pages so far."""
        with self._lock:
            totals = dict(self._left_drops)
            for page in self._pages:
                for reason, n in page.drops.items():
                    totals[reason] += n
        return totals

    # --- the wire's hooks (_link.Wire) ----------------------------------------------------

    def attach(self, link: PageLink) -> Page:
        """A page connected on ``link``: its state; it is sent the ``session`` message."""
        page = Page(link, ClientGuard(self.limits, link.peer, RATED), LinkEstimate(self.clock))
        with self._lock:
            self._pages.add(page)
            self._ever_attached = True
            self.attached += 1
            page.number = self.attached
        page.push_text(session_message(self.session), "session")
        page.push_text(wire({"type": "resume", **resume_fields(self.grace_s)}), "session")
        for hook in self.attaching:
            hook(page)
        return page

    def receive(self, page: Page, text: str | bytes) -> bool:
        """One message from ``page``, answered on its link; True: it was refused."""
        if not isinstance(text, str):
            self.messages.error(page, None, "malformed", "messages must be JSON text")
            return True
        return self.messages.receive(page, text)

    def leave(self, page: Page) -> None:
        """``page``'s connection ended."""
        page.guard.log.flush()
        for hook in self.leaving:
            hook(page)
        with self._lock:
            if page not in self._pages:
                return
            self._pages.discard(page)
            for reason, n in page.drops.items():
                self._left_drops[reason] += n
            self._left_at = self.clock()

    def ping(self, page: Page) -> str:
        """The ``ping`` to send ``page`` now (stamped now: a wire sends it as it leaves)."""
        sent = time.monotonic() * 1e3
        page.pings.append(sent)
        return wire({"type": "ping", "t": sent})

    # --- the transport's side ------------------------------------------------------------

    def start(self, timer: Timer | None) -> None:
        """A wire runs (its ``timer``), or none does (None)."""
        self.docs.start(timer)

    def open(self, session: Session) -> None:
        """Serve ``session``: its docs' states go to the pages, its streams' frames."""
        self.session = session
        for codec in {*session.streams.values(), "jpeg"}:  # jpeg: any page's fallback
            preload(codec)
        self._seq = dict.fromkeys(session.streams, 0)
        self.opened = True
        for name, doc in session.docs.items():
            self._subscriptions.append(doc.snapshots.subscribe(self.docs.listener(name)))
        self.broadcast(session_message(session), "session")

    def close(self) -> None:
        """Stop serving the session (the pages stay attached until their wire closes)."""
        self.opened = False
        for subscription in self._subscriptions:
            subscription.dispose()
        self._subscriptions.clear()

    def close_encoders(self) -> None:
        """Close every encoder (the wires are gone)."""
        for key in list(self.encoders):
            self.encoders.pop(key).close()
        if self.rates is not None:
            self.rates.forget()

    def broadcast(self, text: str, kind: str = "other", key: str = "") -> None:
        """Send ``text`` to every page."""
        for page in self.pages_now():
            page.push_text(text, kind, None, key)

    def on_timing(self, record: TimingRecord) -> None:
        """A timing record: to every page, and joined with the pages' ``shown`` reports."""
        self.broadcast(wire({"type": "timing", "record": record.fields()}), "timing")
        for joined, client, page in self.photon.record(record):
            self._photon_joined(joined, client, page)

    def send(self, stream: str, item: PipelineItem) -> None:
        """One frame of ``stream`` to every page that can take it now."""
        seq = self._seq.get(stream, 0) + 1
        self._seq[stream] = seq
        pages = self.pages_now()
        if not pages:
            return
        codec = self.session.streams.get(stream, "raw")
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
        self.photon.sent(stream, seq, md.timeline)
        takers: list[tuple[Page, str]] = []
        held: list[tuple[Page, str]] = []
        for page in pages:  # decided before encoding: a frame that would queue is not made
            chosen = codec if codec in page.accept else "jpeg"
            with page.lock:
                size = page.sizes.get((stream, chosen), 0)
                admits = page.estimate.admits(size, page.link.unsent_bytes())
            (takers if admits else held).append((page, chosen))
        payloads: dict[str, bytes] = {}
        packed: dict[str, bytes] = {}
        h264: H264Fragments | None = None
        for chosen in dict.fromkeys(c for _, c in takers):
            made = self._encoder(stream, chosen)
            payloads[chosen] = made.encode(frame)
            packed[chosen] = pack({**header, "codec": chosen}, payloads[chosen])
            if isinstance(made, H264Fragments):
                h264 = made
        for page, chosen in held:
            page.drop("link")
            if chosen in payloads and chosen == "h264":  # a hole: it waits for a keyframe
                page.live.discard(stream)
            if md.cutover:
                page.owed_cutover.add(stream)
        for page, chosen in takers:
            data = self._frame_for(page, stream, chosen, header, payloads, packed, h264)
            if data is not None and not page.link.send_frame(stream, data):
                page.drop("queue")
                if chosen == "h264":
                    page.live.discard(stream)
                data = None
            if data is None:
                if md.cutover:
                    page.owed_cutover.add(stream)
                continue
            page.owed_cutover.discard(stream)
            with page.lock:
                page.sizes[(stream, chosen)] = len(data)
                page.estimate.sent(stream, seq, len(data))
        if self.rates is not None:
            for chosen in {c for _, c in (*takers, *held)}:
                shared = self.encoders.get((stream, chosen))
                if shared is not None:
                    playing = [p for p, c in (*takers, *held) if c == chosen]
                    self.rates.follow(stream, chosen, playing, shared)

    def _frame_for(
        self,
        page: Page,
        stream: str,
        chosen: str,
        header: dict[str, Any],
        payloads: dict[str, bytes],
        packed: dict[str, bytes],
        h264: H264Fragments | None,
    ) -> bytes | None:
        """The packed frame ``page`` gets, or None: it waits for a keyframe. A page that
        missed the cutover frame (dropped for its link or its queue, or waiting for a
        keyframe) gets this one marked the cutover: the first frame it gets of the new
        generation is its cutover (the steer's photon is timed from it)."""
        if not header["cutover"] and stream in page.owed_cutover:
            header = {**header, "cutover": True}
            packed = {chosen: pack({**header, "codec": chosen}, payloads[chosen])}
        data = packed[chosen]
        joining = False
        if h264 is not None and chosen == "h264" and stream not in page.live:
            if not h264.keyframe:  # the page joins at the next keyframe
                if page.guard.allows("keyframe"):  # its own rate, as for a request
                    self._request_keyframe(stream, h264)
                return None
            page.live.add(stream)
            joining = True
        if h264 is not None and chosen == "h264" and "h264-au" in page.accept:
            if "h264-au" not in packed:  # WebCodecs: the access unit alone
                packed["h264-au"] = pack_unit(header, h264)
            return packed["h264-au"]
        if h264 is not None and joining:
            init = h264.init_segment or b""
            body = payloads[chosen]
            return pack(
                {**header, "codec": chosen, "init": True, "mime": h264.mime_type, "fps": self.fps},
                body if body.startswith(init) else init + body,
            )
        return data

    # --- encoders -------------------------------------------------------------------------

    def request_keyframe(self, stream: str) -> None:
        """Ask ``stream``'s shared h264 encoder (if any) for an IDR, within its budget."""
        made = self.encoders.get((stream, "h264"))
        if isinstance(made, H264Fragments):
            self._request_keyframe(stream, made)

    def _request_keyframe(self, stream: str, made: H264Fragments) -> bool:
        """Ask ``stream``'s shared encoder for an IDR frame within ``requested_keyframes``."""
        with self._keyframes_lock:
            if made.keyframe_requested:
                return True
            bucket = self._keyframes.get(stream)
            if bucket is None:
                bucket = TokenBucket(self.limits.requested_keyframes, self.clock)
                self._keyframes[stream] = bucket
            if not bucket.take():
                return False
            made.request_keyframe()
            return True

    def _encoder(self, stream: str, codec: str) -> Encoder:
        made = self.encoders.get((stream, codec))
        if made is None:
            made = self.encoders[(stream, codec)] = encoder(
                codec, stream=stream, fps=self.fps, quality=self.jpeg_quality
            )
            if self.rates is not None and isinstance(made, H264Fragments):
                # opened bounded at the start rate: the first cut then takes effect on the
                # next frame; an encoder opened unbounded follows only from its next IDR
                # (up to a second), while its frames keep the link dropping
                made.set_bitrate(RATE_START_KBPS)
        return made

    # --- reports --------------------------------------------------------------------------

    def _acked(self, page: Page, stream: str, seq: int) -> None:
        with page.lock:
            page.estimate.acked(stream, seq)

    def _photon_joined(self, record: TimingRecord, timing: ClientTiming, page: int) -> None:
        fields = log_photon(record, timing, page)
        self.broadcast(wire({"type": "photon", **fields}), "photon")
