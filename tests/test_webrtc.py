"""The WebRTC wire (``rxstream/transport/_rtcwire.py``): frames over an aiortc data channel,
signalled on the page's authenticated socket; its messages checked like every other; a Python
peer (aiortc) and the page in headless Chromium on it; the page's fallback to the socket."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import aiohttp
import pytest
from test_web import Session, page

from rxstream._exceptions import ArgumentError
from rxstream.transport import WebTransport
from rxstream.transport._rtcwire import (
    SCTP_RTO_MIN_S,
    RtcLink,
    max_message_bytes,
    without_mdns,
)

pytestmark = pytest.mark.slow
aiortc = pytest.importorskip("aiortc", reason="aiortc is not installed (rxstream[webrtc])")


def test_mdns_candidates_are_left_out_and_the_message_bound_read() -> None:
    """An offer's ``.local`` candidates are dropped, others kept; max-message-size is read,
    capped at 256 KiB, 64 KiB where the offer states none."""
    sdp = (
        "v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
        "a=candidate:1 1 udp 2113937151 6b889a5c-7357.local 49593 typ host generation 0\r\n"
        "a=candidate:2 1 udp 2113937151 10.0.0.2 49594 typ host generation 0\r\n"
        "a=max-message-size:1048576\r\n"
    )
    kept = without_mdns(sdp)
    assert ".local" not in kept
    assert "10.0.0.2 49594" in kept
    assert max_message_bytes(sdp) == 262144
    assert max_message_bytes(sdp.replace("1048576", "100000")) == 100000
    assert max_message_bytes("v=0\r\n") == 65536


async def _peer(ws: Any) -> tuple[Any, Any, Any, asyncio.Queue[bytes]]:
    """A Python page's peer connection, signalled on ``ws``: (pc, video, input, frames)."""
    pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))
    video = pc.createDataChannel("video", ordered=False, maxRetransmits=2)
    inputs = pc.createDataChannel("input", ordered=False, maxRetransmits=0)
    frames: asyncio.Queue[bytes] = asyncio.Queue()
    video.on("message", lambda data: frames.put_nowait(data) if isinstance(data, bytes) else None)
    opened = [asyncio.Event(), asyncio.Event()]
    video.on("open", opened[0].set)
    inputs.on("open", opened[1].set)
    await pc.setLocalDescription(await pc.createOffer())
    await ws.send({"type": "rtc-offer", "sdp": pc.localDescription.sdp, "id": 1})
    assert (await ws.text("ack"))["id"] == 1
    answer = await ws.text("rtc-answer")
    await pc.setRemoteDescription(aiortc.RTCSessionDescription(sdp=answer["sdp"], type="answer"))
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), 10)
    return pc, video, inputs, frames


def _header(data: bytes) -> dict[str, Any]:
    (length,) = struct.unpack(">I", data[1:5])
    return json.loads(data[5 : 5 + length])  # type: ignore[no-any-return]


def test_a_peer_gets_its_frames_over_the_data_channel_and_the_newest_input_wins() -> None:
    """Signalled on the socket (rtc-config, rtc-offer, rtc-answer), the page's frames come
    over its video channel (aiortc's minimum SCTP retransmission timeout lowered); on the
    input channel an input older than one heard is dropped (counted) and the acked
    input_seq goes on increasing."""

    async def check(session: Session) -> None:
        async with page(session.web.url) as ws:
            config = await ws.text("rtc-config")
            assert config["ice_servers"] == []
            pc, _, inputs, frames = await _peer(ws)
            try:
                for ident in (10, 9, 11):  # 9 comes after 10: stale on an unordered channel
                    sample = {"type": "input", "stream": "pointer", "sample": [0.5, 0.5]}
                    inputs.send(json.dumps({**sample, "id": ident}))
                    await asyncio.sleep(0)
                seqs = [(await ws.text("ack"))["input_seq"] for _ in range(2)]
                data = await asyncio.wait_for(frames.get(), 10)
                assert data[:1] == b"F"
                assert _header(data)["stream"] == "video"
            finally:
                await pc.close()
        assert seqs == [1, 2]
        assert aiortc.rtcsctptransport.SCTP_RTO_MIN == SCTP_RTO_MIN_S  # 1 s was aiortc's
        counters = session.web.rtc.counters if session.web.rtc else None
        assert counters is not None
        assert counters.offers == 1
        assert counters.opened == 1
        assert counters.frames >= 1
        assert counters.stale == 1

    with rtc_session() as session:
        asyncio.run(check(session))


def test_when_the_peer_connection_closes_the_frames_go_back_to_the_socket() -> None:
    """A page whose peer connection closed (its channel with it) gets its next frames over
    its socket again; while open, none came there."""

    async def check(session: Session) -> None:
        async with page(session.web.url) as ws:
            pc, _, inputs, frames = await _peer(ws)
            sample = {"type": "input", "stream": "pointer", "sample": [0.2, 0.5]}
            inputs.send(json.dumps({**sample, "id": 10}))
            await asyncio.wait_for(frames.get(), 10)
            assert isinstance(session.web.pages_now()[0].link, RtcLink)
            await pc.close()
            async with asyncio.timeout(10):
                while isinstance(session.web.pages_now()[0].link, RtcLink):
                    await asyncio.sleep(0.02)
            assert ws.frames == []  # the channel's frame went over the channel alone
            await ws.send({**sample, "sample": [0.8, 0.5], "id": 11})
            header, _ = await ws.frame()
            assert header["stream"] == "video"

    with rtc_session() as session:
        asyncio.run(check(session))


OFFER = "v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"


@pytest.mark.parametrize(
    ("message", "code", "named"),
    [
        ({"type": "rtc-offer"}, "malformed", "rtc-offer.sdp must be an SDP offer"),
        ({"type": "rtc-offer", "sdp": 5}, "malformed", "(text starting with v=0), got 5"),
        ({"type": "rtc-offer", "sdp": "hello"}, "malformed", "got 'hello'"),
        ({"type": "rtc-offer", "sdp": "v=0\r\n"}, "malformed", "an m=application line"),
        ({"type": "rtc-offer", "sdp": OFFER}, "rtc", "rtc-offer.sdp must be an offer aiortc"),
    ],
)
def test_bad_signalling_gets_a_one_line_error(
    session: Session, message: dict[str, Any], code: str, named: str
) -> None:
    """A bad offer is answered with an error naming rtc-offer.sdp, its rule and its value;
    no peer connection stays."""

    async def check() -> dict[str, Any]:
        async with page(session.web.url) as ws:
            await ws.send({**message, "id": 3})
            return await ws.text("error")

    error = asyncio.run(check())
    assert error["code"] == code
    assert named in error["error"]
    assert "\n" not in error["error"]
    assert session.web.rtc is not None
    assert session.web.rtc.peers == 0


def test_offers_have_a_rate_of_their_own(session: Session) -> None:
    """Past SessionLimits.offers' burst an offer is refused, rate_limited, naming the field."""

    async def check() -> dict[str, Any]:
        async with page(session.web.url) as ws:
            for ident in range(5):
                await ws.send({"type": "rtc-offer", "sdp": "v=0\r\n", "id": ident})
            while True:
                error = await ws.text("error")
                if error["code"] == "rate_limited":
                    return error

    assert "SessionLimits.offers" in asyncio.run(check())["error"]


def test_without_aiortc_no_config_is_sent_and_an_offer_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where aiortc is not installed the page is not told of a WebRTC wire, an offer is
    refused (unavailable) saying how to get one, and webrtc=True is an ArgumentError."""
    monkeypatch.setattr("rxstream.transport._web.available", lambda: False)
    with pytest.raises(ArgumentError, match=r"webrtc=True needs aiortc"):
        WebTransport(port=0, webrtc=True)

    async def check(url: str) -> tuple[list[str], dict[str, Any]]:
        async with page(url) as ws:
            await ws.text("resume")
            await ws.send({"type": "rtc-offer", "sdp": OFFER, "id": 1})
            error = await ws.text("error")
            return [m["type"] for m in ws.texts], error

    with Session() as session:
        assert session.web.rtc is None
        kinds, error = asyncio.run(check(session.web.url))
    assert "rtc-config" not in kinds
    assert error["code"] == "unavailable"
    assert "rxstream[webrtc]" in error["error"]


@pytest.mark.parametrize("refused", ["no token", "another origin"])
def test_a_socket_from_another_origin_or_without_the_token_gets_nothing(
    session: Session, refused: str
) -> None:
    """The signalling is the authenticated socket: a page without the token or from another
    origin is refused it (403), so it can offer nothing and no peer connection is made."""
    url = session.web.ws_url
    headers = {}
    if refused == "no token":
        url = url.split("?", 1)[0]
    else:
        headers["Origin"] = "http://elsewhere.example"

    async def check() -> int:
        async with aiohttp.ClientSession() as http:
            try:
                async with http.ws_connect(url, headers=headers):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    assert asyncio.run(check()) == 403
    rtc = session.web.rtc
    assert rtc is not None
    assert rtc.counters.offers == 0
    assert rtc.peers == 0


def rtc_session() -> Session:
    """test_web's session, its messages allowed up to 8 KiB (an offer is about 1-2 KiB)."""
    made = Session()
    made.web.protocol.messages.max_message_bytes = 8192
    return made


@pytest.fixture
def session() -> Any:
    with rtc_session() as running:
        yield running
