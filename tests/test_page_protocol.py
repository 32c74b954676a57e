"""The page protocol apart from the wire, and latency-first delivery.

A second, in-memory wire drives a whole session through :class:`PageProtocol` (no socket);
on a fake clock, the link estimate from the page's ``got`` acks decides per frame whether to
send; on a real socket, a page that stops reading has its frames dropped at the server."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
from _pagelink import MemoryLink

import rxstream
from rxstream.item import PipelineItem, PipelineMetadata
from rxstream.timing import TimingRecord
from rxstream.transport import SessionLimits, WebTransport
from rxstream.transport._base import Session, Transport
from rxstream.transport._codecs import H264Fragments
from rxstream.transport._linkestimate import UNSENT_SLACK_BYTES
from rxstream.transport._page import Page
from rxstream.transport._pageprotocol import PageProtocol
from rxstream.transport._wsserver import (
    NOTSENT_LOWAT_BYTES,
    RTO_MIN_S,
    WRITE_BUFFER_BYTES,
    SocketLink,
)

NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)


def wait_for(condition: Callable[[], Any], timeout: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passed; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def protocol_of(
    clock: Callable[[], float] = time.monotonic, *, rate_control: bool = True
) -> PageProtocol:
    return PageProtocol(
        limits=SessionLimits(),
        grace_s=0.1,
        max_message_bytes=4096,
        fps=24.0,
        jpeg_quality=80,
        rate_control=rate_control,
        clock=clock,
    )


def later(delay: float, fn: Callable[[], None]) -> None:
    """A wire's timer: ``fn`` on a thread of its own, ``delay`` from now."""
    timer = threading.Timer(delay, fn)
    timer.daemon = True
    timer.start()


class MemoryWire(Transport):
    """A second wire: the page protocol over in-memory links, no socket, no event loop."""

    def __init__(self) -> None:
        self.protocol = protocol_of()

    @property
    def connected(self) -> bool:
        return self.protocol.connected

    def open(self, session: Session) -> None:
        self.protocol.start(later)
        self.protocol.open(session)

    def send(self, stream: str, item: PipelineItem) -> None:
        self.protocol.send(stream, item)

    def on_timing(self, record: TimingRecord) -> None:
        self.protocol.on_timing(record)

    def close(self) -> None:
        self.protocol.close()
        self.protocol.start(None)
        self.protocol.close_encoders()


def say(protocol: PageProtocol, page: Page, message: dict[str, Any]) -> bool:
    """The page sends ``message``; whether it was refused."""
    return protocol.receive(page, json.dumps(message))


def frame_of(sample: tuple[float, float]) -> np.ndarray:
    return np.full((24, 32, 3), int(sample[0] * 255), dtype=np.uint8)


def test_a_whole_session_runs_over_an_in_memory_wire() -> None:
    """hello, input, set, frames, got, pong and shown: a session needs the protocol, no socket."""
    wire = MemoryWire()
    ctx = rxstream.Context(transport=wire)
    doc = ctx.doc("control", defaults={"gain": 0.5})
    pipeline = (
        ctx.input("pointer") | ctx.pipe(frame_of, name="render") | ctx.stream("video", codec="jpeg")
    )
    pipeline.start()
    try:
        protocol = wire.protocol
        link = MemoryLink()
        page = protocol.attach(link)
        (session,) = link.messages("session")
        assert (session["streams"], session["inputs"]) == ({"video": "jpeg"}, ["pointer"])
        assert protocol.connected
        assert protocol.pages == 1
        assert not say(protocol, page, {"type": "hello", "accept": ["jpeg"], "id": 1})
        assert not say(
            protocol, page, {"type": "input", "stream": "pointer", "sample": [0.8, 0.2], "id": 2}
        )
        assert wait_for(lambda: any(h["input_seq"] == 1 for h in link.headers()))
        header = next(h for h in link.headers() if h["input_seq"] == 1)
        assert (header["codec"], header["width"], header["height"]) == ("jpeg", 32, 24)
        now = time.monotonic() * 1e3
        assert not say(
            protocol, page, {"type": "got", "stream": "video", "seq": header["seq"], "t": now}
        )
        assert page.estimate.acks == 1
        assert page.estimate.inflight_bytes == 0
        assert not say(protocol, page, {"type": "set", "changes": {"gain": 0.75}, "id": 3})
        assert wait_for(lambda: link.messages("doc"))
        assert link.messages("doc")[-1]["desired"]["gain"] == 0.75 == doc.snapshot()["gain"]
        ping = json.loads(protocol.ping(page))
        assert not say(
            protocol, page, {"type": "pong", "t": ping["t"], "c": time.monotonic() * 1e3}
        )
        now = time.monotonic() * 1e3
        shown = {"type": "shown", "stream": "video", "seq": header["seq"], "input_seq": 1}
        times = {"arrived": now - 3.0, "decoded": now - 2.0, "presented": now - 1.0}
        assert not say(protocol, page, {**shown, **times, "video": "jpeg", "id": 4})
        assert wait_for(lambda: link.messages("photon"))
        (photon,) = link.messages("photon")
        assert photon["input_seq"] == 1
        acks = {m["id"]: m for m in link.messages("ack")}
        assert sorted(acks) == [1, 2, 3, 4]
        assert acks[2]["input_seq"] == 1
        assert link.messages("error") == []
        protocol.leave(page)
        assert protocol.pages == 0
    finally:
        pipeline.stop()


class Clock:
    """A fake monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def frame() -> PipelineItem:
    return PipelineItem(np.zeros((24, 32, 3), np.uint8), PipelineMetadata())


def test_a_page_that_stops_acking_gets_no_more_than_the_link_carries_then_the_newest() -> None:
    """Frames past delivery rate x min RTT + a frame in flight are dropped (``link``); acks
    again: the very next frame goes, the newest, no backlog."""
    clock = Clock()
    protocol = protocol_of(clock, rate_control=False)  # the test reads the link's drops itself
    protocol.open(Session(streams={"video": "jpeg"}))
    link = MemoryLink()
    page = protocol.attach(link)
    say(protocol, page, {"type": "hello", "accept": ["jpeg"]})

    def ack_all() -> None:
        for header in link.headers()[acked:]:
            say(protocol, page, {"type": "got", "stream": "video", "seq": header["seq"], "t": 1.0})

    acked = 0
    for _ in range(24):  # 24 fps, each frame acked 20 ms after it was sent
        protocol.send("video", frame())
        clock.now += 0.02
        ack_all()
        acked = len(link.frames)
        clock.now += 1 / 24 - 0.02
    assert len(link.frames) == 24
    assert protocol.drops == {"link": 0, "queue": 0}
    state = page.link_state()
    assert state.min_rtt_ms is not None
    assert state.min_rtt_ms == pytest.approx(20.0)
    assert state.rtt_ms == pytest.approx(20.0)
    assert state.delivery_bps is not None
    assert state.inflight_bytes == 0
    size = len(link.frames[-1])
    carried = state.delivery_bps / 8 * state.min_rtt_ms / 1e3
    for _ in range(12):  # the page reads nothing more: no ack comes
        protocol.send("video", frame())
        assert page.estimate.inflight_bytes <= carried + 2 * size
        clock.now += 1 / 24
    sent = len(link.frames) - acked
    assert sent <= 3
    assert protocol.drops["link"] == 12 - sent
    assert page.link_state().dropped == 12 - sent  # counted for the rate controller too
    ack_all()
    acked = len(link.frames)
    protocol.send("video", frame())
    assert len(link.frames) == acked + 1
    assert link.headers()[-1]["seq"] == 24 + 12 + 1  # the newest frame, at once
    protocol.close_encoders()


def test_a_page_with_unsent_bytes_waiting_is_skipped_and_h264_is_not_encoded_for_nobody() -> None:
    """A frame that would wait behind unsent bytes is not sent; with no h264 page able to take
    it, the shared encoder does not encode it (its chain stays whole)."""
    protocol = protocol_of(Clock())
    protocol.open(Session(streams={"video": "h264"}))
    link = MemoryLink()
    page = protocol.attach(link)
    say(protocol, page, {"type": "hello", "accept": ["h264", "h264-au"]})
    protocol.send("video", frame())  # the first frame: a keyframe, the page joins
    made = protocol.encoders[("video", "h264")]
    assert isinstance(made, H264Fragments)
    assert "video" in page.live
    encoded = made.frames
    link.unsent = UNSENT_SLACK_BYTES + 1
    for _ in range(5):
        protocol.send("video", frame())
    assert made.frames == encoded  # not one encoded: no page could take it
    assert protocol.drops["link"] == 5
    assert "video" in page.live
    link.unsent = 0
    protocol.send("video", frame())
    assert made.frames == encoded + 1
    assert len(link.frames) == 2
    protocol.close_encoders()


def test_a_webcodecs_page_sees_no_gap_in_its_chain_for_frames_never_encoded() -> None:
    """Frames not encoded for the link leave a gap in ``seq`` but none in ``chain`` (the
    encoder's numbering): the page decodes on, no keyframe needed."""
    protocol = protocol_of(Clock())
    protocol.open(Session(streams={"video": "h264"}))
    link = MemoryLink()
    page = protocol.attach(link)
    say(protocol, page, {"type": "hello", "accept": ["h264", "h264-au"]})
    protocol.send("video", frame())
    link.unsent = UNSENT_SLACK_BYTES + 1
    for _ in range(3):
        protocol.send("video", frame())
    link.unsent = 0
    protocol.send("video", frame())
    protocol.send("video", frame())
    headers = link.headers()
    assert [h["seq"] for h in headers] == [1, 5, 6]
    assert [h["chain"] for h in headers] == [1, 2, 3]
    assert [h["key"] for h in headers] == [True, False, False]
    protocol.close_encoders()


def test_with_rate_control_the_h264_encoder_opens_bounded_at_the_start_rate() -> None:
    """The shared h264 encoder is opened bounded at RATE_START_KBPS (a cut then takes effect
    from the next frame, not from the next IDR); without rate control it is unbounded."""
    from rxstream.transport._pagerate import RATE_START_KBPS

    for control, expected in ((True, RATE_START_KBPS), (False, None)):
        protocol = protocol_of(Clock(), rate_control=control)
        protocol.open(Session(streams={"video": "h264"}))
        page = protocol.attach(MemoryLink())
        say(protocol, page, {"type": "hello", "accept": ["h264", "h264-au"]})
        protocol.send("video", frame())
        made = protocol.encoders[("video", "h264")]
        assert isinstance(made, H264Fragments)
        assert made.bitrate_kbps == expected
        assert made.new_config  # opened with its first frame, at that rate
        protocol.close_encoders()


@pytest.mark.parametrize(
    ("shape", "ceiling"),
    [((144, 256, 3), 256 * 144 * 24 / 1e3), ((720, 1280, 3), 4000.0), ((24, 32, 3), 150.0)],
)
def test_the_h264_ceiling_follows_the_frame_size(
    shape: tuple[int, int, int], ceiling: float
) -> None:
    """A bit a pixel a frame, within the floor and RATE_MAX_KBPS: once the page acks, an
    encoder opened at RATE_START_KBPS above that ceiling is set down to it, and the page is
    told; a 720p stream keeps its start rate (under its ceiling of 4000)."""
    from rxstream.transport._pagerate import RATE_START_KBPS

    clock = Clock()
    protocol = protocol_of(clock)
    protocol.open(Session(streams={"video": "h264"}))
    link = MemoryLink()
    page = protocol.attach(link)
    say(protocol, page, {"type": "hello", "accept": ["h264", "h264-au"]})
    image = PipelineItem(np.zeros(shape, np.uint8), PipelineMetadata())
    for _ in range(3):
        protocol.send("video", image)
        clock.now += 0.02
        for header in link.headers()[-1:]:
            say(protocol, page, {"type": "got", "stream": "video", "seq": header["seq"], "t": 1.0})
        clock.now += 1 / 24 - 0.02
    made = protocol.encoders[("video", "h264")]
    assert isinstance(made, H264Fragments)
    assert page.rates["video"].current.bitrate_kbps == pytest.approx(min(ceiling, RATE_START_KBPS))
    assert made.bitrate_kbps == pytest.approx(min(ceiling, RATE_START_KBPS))
    told = link.messages("rate")
    assert bool(told) == (ceiling < RATE_START_KBPS)
    protocol.close_encoders()


def two_h264_pages() -> tuple[PageProtocol, tuple[Page, MemoryLink], tuple[Page, MemoryLink]]:
    """An h264 session on a fake clock with two WebCodecs pages, slow and fast, and their
    links."""
    protocol = protocol_of(Clock())
    protocol.open(Session(streams={"video": "h264"}))
    slow_link, fast_link = MemoryLink("slow:1"), MemoryLink("fast:1")
    slow, fast = protocol.attach(slow_link), protocol.attach(fast_link)
    for page in (slow, fast):
        say(protocol, page, {"type": "hello", "accept": ["h264", "h264-au"]})
    return protocol, (slow, slow_link), (fast, fast_link)


def test_an_h264_page_that_misses_an_encoded_frame_waits_for_a_keyframe() -> None:
    """Another page took the frame, so it was encoded: the one that could not has a hole and
    gets no delta frame until the keyframe it asked for."""
    protocol, (slow, slow_link), (_, fast_link) = two_h264_pages()
    protocol.send("video", frame())
    slow_link.unsent = UNSENT_SLACK_BYTES + 1
    protocol.send("video", frame())
    made = protocol.encoders[("video", "h264")]
    assert isinstance(made, H264Fragments)
    assert "video" not in slow.live
    assert slow.drops["link"] == 1
    slow_link.unsent = 0
    protocol.send("video", frame())  # a delta frame: the slow page waits, and asks for an IDR
    assert (len(slow_link.frames), len(fast_link.frames)) == (1, 3)
    assert made.keyframe_requested
    protocol.send("video", frame())
    assert made.keyframe
    assert "video" in slow.live
    assert len(slow_link.frames) == 2
    assert slow_link.headers()[-1]["key"] is True
    protocol.close_encoders()


def test_a_page_that_missed_the_cutover_frame_gets_its_next_frame_marked_the_cutover() -> None:
    """A steer's first frame dropped for one page's link: that page's next frame carries
    ``cutover`` (after it waited for its keyframe), the other page's does not: each page
    counts the steer once, timed from the first frame it showed of it."""
    protocol, (slow, slow_link), (_, fast_link) = two_h264_pages()
    protocol.send("video", frame())
    slow_link.unsent = UNSENT_SLACK_BYTES + 1
    protocol.send("video", PipelineItem(np.zeros((24, 32, 3), np.uint8), cutover()))
    slow_link.unsent = 0
    for _ in range(3):  # a delta frame (the slow page waits, asking for an IDR), the IDR, one
        protocol.send("video", frame())
    cut = [[h["cutover"] for h in link.headers()] for link in (slow_link, fast_link)]
    assert cut == [[False, True, False], [False, True, False, False, False]]
    assert slow_link.headers()[1]["key"] is True
    assert not slow.owed_cutover
    protocol.close_encoders()


def cutover() -> PipelineMetadata:
    """The metadata of a new generation's first item."""
    return PipelineMetadata(prompt_generation=1, cutover=True)


TOKEN = "t" * 24


class SlowPage:
    """A raw WebSocket page with a small receive buffer that reads only once told to."""

    def __init__(self, web: WebTransport) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        self.sock.connect(("127.0.0.1", web.bound_port or 0))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET /ws?token={web.token} HTTP/1.1\r\nHost: 127.0.0.1:{web.bound_port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(4096)
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101")
        self.seqs: list[int] = []
        """The seq of each frame read, in order."""
        self.stop = threading.Event()

    def send(self, message: dict[str, Any]) -> None:
        payload = json.dumps(message).encode()
        mask = os.urandom(4)
        assert len(payload) < 126
        head = b"\x81" + bytes([0x80 | len(payload)])
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the server closed the socket")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def read(self) -> None:
        """Read messages until ``stop``, keeping each frame's seq."""
        self.sock.settimeout(0.05)
        while not self.stop.is_set():
            try:
                opcode, length = self._take(2)
                size = length & 0x7F
                if size == 126:
                    (size,) = struct.unpack(">H", self._take(2))
                elif size == 127:
                    (size,) = struct.unpack(">Q", self._take(8))
                payload = self._take(size)
            except TimeoutError:
                continue
            if opcode & 0x0F == 2:  # binary: a frame
                (head,) = struct.unpack(">I", payload[1:5])
                self.seqs.append(json.loads(payload[5 : 5 + head])["seq"])


@pytest.mark.slow
def test_a_page_that_stops_reading_has_frames_dropped_at_the_server_not_queued() -> None:
    """A page that reads nothing holds about a frame at the server, the rest dropped (``link``);
    reading again, it gets the few frames sent before it stopped, then the next at once."""
    web = WebTransport(port=0, token=TOKEN)
    web.open(Session(streams={"video": "jpeg"}))
    noise = np.random.default_rng(7).integers(0, 256, (192, 192, 3), dtype=np.uint8)
    try:
        page = SlowPage(web)
        page.send({"type": "hello", "accept": ["jpeg"]})
        assert wait_for(lambda: web.pages == 1)
        (state,) = web.pages_now()
        link = cast(SocketLink, state.link)
        assert link.transport is not None
        sock = link.transport.get_extra_info("socket")  # the kernel holds little unsent
        assert sock.getsockopt(socket.IPPROTO_TCP, NOTSENT_LOWAT) == NOTSENT_LOWAT_BYTES
        assert link.transport.get_write_buffer_limits()[1] == WRITE_BUFFER_BYTES
        offered, most_unsent = 200, 0
        for _ in range(offered):
            web.send("video", PipelineItem(noise, PipelineMetadata()))
            most_unsent = max(most_unsent, state.link.unsent_bytes())
        size = max(state.sizes.values())
        dropped = web.drops["link"]
        assert web.dropped == dropped + web.drops["queue"]
        assert dropped >= offered - 16  # not queued for it: dropped at the server, counted
        assert most_unsent <= 3 * size + UNSENT_SLACK_BYTES
        reader = threading.Thread(target=page.read, daemon=True)
        reader.start()
        assert wait_for(lambda: state.link.unsent_bytes() == 0)
        assert wait_for(lambda: len(page.seqs) == offered - web.dropped)  # none lost unsaid
        backlog = len(page.seqs)
        web.send("video", PipelineItem(noise, PipelineMetadata()))
        assert wait_for(lambda: page.seqs[-1:] == [offered + 1])  # the newest, at once
        assert web.dropped == offered - backlog
        print(f"frame {size} B, most unsent {most_unsent} B, backlog {backlog}, dropped {dropped}")
        page.stop.set()
        reader.join(5)
        page.sock.close()
    finally:
        web.close()


def _rto_min_settable() -> bool:
    with socket.socket() as probe:
        try:
            probe.setsockopt(socket.IPPROTO_TCP, 45, 50_000)  # TCP_RTO_MIN_US, Linux 6.15 on
        except OSError:
            return False
    return True


def _this_hosts_address() -> str | None:
    """An address of this host that is not loopback (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # a UDP connect sends nothing: the route's source
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


class _Transport:
    """What ``_bound`` reads of an asyncio transport: its socket and its buffer limits."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None


@pytest.mark.skipif(not _rto_min_settable(), reason="no TCP_RTO_MIN_US (Linux 6.15 on)")
@pytest.mark.parametrize("where", ["remote", "loopback"])
def test_a_remote_pages_socket_retransmits_after_rto_min_s_not_200_ms(where: str) -> None:
    """A page's socket from another host has its minimum retransmission timeout lowered to
    RTO_MIN_S (the kernel rounds it to its tick); a loopback one keeps the kernel's 200 ms."""
    from rxstream.transport._wsserver import _bound

    host = _this_hosts_address() if where == "remote" else "127.0.0.1"
    if host is None:
        pytest.skip("this host has no address but loopback")
    with socket.socket() as server, socket.socket() as client:
        server.bind((host, 0))
        server.listen()
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        with accepted:
            assert _bound(cast(Any, _Transport(accepted))) is accepted
            set_us = accepted.getsockopt(socket.IPPROTO_TCP, 45)
    if where == "remote":
        assert RTO_MIN_S * 1e6 <= set_us < RTO_MIN_S * 1e6 + 10_000, set_us
    else:
        assert set_us == 200_000


def test_a_shared_encoder_follows_the_narrowest_pages_rate_and_its_pages_are_told() -> None:
    """Rate control: the page whose link drops frames lowers the shared encoder's rate (JPEG
    quality here); every page of that encoder gets the ``rate`` message."""
    clock = Clock()
    protocol = protocol_of(clock)
    protocol.open(Session(streams={"video": "jpeg"}))
    links = {name: MemoryLink(f"{name}:1") for name in ("fast", "slow")}
    pages = {name: protocol.attach(link) for name, link in links.items()}
    for page in pages.values():
        say(protocol, page, {"type": "hello", "accept": ["jpeg"]})
    acked = dict.fromkeys(links, 0)

    def ack(name: str) -> None:
        link = links[name]
        for header in link.headers()[acked[name] :]:
            got = {"type": "got", "stream": "video", "seq": header["seq"], "t": 1.0}
            say(protocol, pages[name], got)
        acked[name] = len(link.frames)

    for i in range(96):  # 4 s at 24 fps; the slow page stops acking after the first second
        protocol.send("video", frame())
        clock.now += 0.02
        ack("fast")
        if i < 24:
            ack("slow")
        clock.now += 1 / 24 - 0.02
    applied = protocol.rates.applied("video", "jpeg") if protocol.rates else None
    assert applied is not None
    assert applied == pages["slow"].rates["video"].current
    assert applied.bitrate_kbps <= pages["fast"].rates["video"].current.bitrate_kbps
    assert pages["slow"].rates["video"].changes.down >= 1
    encoder = protocol.encoders[("video", "jpeg")]
    assert getattr(encoder, "quality", None) == applied.jpeg_quality
    for link in links.values():
        told = link.messages("rate")
        assert told
        assert told[-1]["kbps"] == round(applied.bitrate_kbps, 1)
    assert "drops" in {m["reason"] for m in links["fast"].messages("rate")}
    protocol.close_encoders()
