"""What a hostile or broken client may not do to a served session (the attacks of issue e6c76f2).

A page that never reads cannot hold the run's end; error replies cannot hold a connection's
memory; one page's lost frames cannot force keyframes on the others; doc writes cannot starve
the other pages' frames; a forged ``shown`` report cannot reach the timing log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, cast

import aiohttp
import numpy as np
import pytest
import structlog
from _pagelink import MemoryLink, memory_page
from _serving import Served, texts_until

import rxstream
from rxstream.item import PipelineItem, PipelineMetadata
from rxstream.timing import ClientTiming, HopTiming, TimingRecord, configure_logging
from rxstream.timing._client import ClockOffset
from rxstream.transport import Rate, SessionLimits, WebTransport
from rxstream.transport import _webmessages as webmessages
from rxstream.transport._base import Session
from rxstream.transport._codecs import H264Fragments
from rxstream.transport._guard import ClientGuard, Refused, TokenBucket, parse_message
from rxstream.transport._page import Page
from rxstream.transport._pageprotocol import PageProtocol
from rxstream.transport._photon import PhotonJoin, Shown
from rxstream.transport._webclient import Outbox
from rxstream.transport._webmessages import CLOCK_JUMPS, MAX_ERROR_CHARS, RATED

pytestmark = pytest.mark.slow

TOKEN = "A" * 20


def big_frame(sample: tuple[float, float]) -> np.ndarray:
    """A 640x480 raw frame (900 KB): one fills the socket of a page that does not read."""
    return np.full((480, 640, 3), int(sample[0] * 255), dtype=np.uint8)


def masked(payload: bytes) -> bytes:
    """One client-to-server WebSocket text frame (masked, as RFC 6455 requires)."""
    mask = os.urandom(4)
    size = len(payload)
    head = b"\x81"
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", size)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class Deaf:
    """A raw WebSocket client with a 4 KB receive buffer that reads nothing past the handshake."""

    def __init__(self, web: WebTransport) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", web.bound_port or 0))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET /ws?token={web.token} HTTP/1.1\r\nHost: 127.0.0.1:{web.bound_port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        assert self.sock.recv(12) == b"HTTP/1.1 101"

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(masked(json.dumps(message).encode()))

    def cut(self, timeout: float = 10.0) -> bool:
        """Read what waits until the server ends the connection; True if it did in time."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(1 << 20):
                pass
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return True


def wait_for(condition: Any, timeout: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passed; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_page_that_never_reads_is_cut_and_the_run_ends_clean(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A page stuck on a full socket is cut at the end; the loop closes with nothing pending."""
    web = WebTransport(port=0, token=TOKEN, grace_s=0.1)
    ctx = rxstream.Context(transport=web)
    pipeline = ctx.input("pointer") | ctx.pipe(big_frame) | ctx.stream("video", codec="raw")
    caplog.set_level(logging.WARNING)
    with structlog.testing.capture_logs() as logs:
        with Served(web, pipeline) as served:
            deaf = Deaf(web)
            deaf.send({"type": "hello", "accept": ["raw"]})
            while web.dropped == 0:  # the writer is stuck on a frame the page never takes
                deaf.send({"type": "input", "stream": "pointer", "sample": [1, 0]})
                time.sleep(0.01)
        assert served.error is None
        assert web.server.loop is None  # close() ran to its end: the loop stopped
        assert not web.protocol.encoders  # and the encoders closed
        assert deaf.cut()
        deaf.sock.close()
    assert any(e["event"] == "web_page_cut" for e in logs)
    noise = [r.getMessage() for r in caplog.records if r.name.startswith(("asyncio", "aiohttp"))]
    assert not noise


def frame_of(sample: tuple[float, float]) -> np.ndarray:
    """A small frame whose brightness is the sample's x."""
    return np.full((8, 8, 3), int(sample[0] * 255), dtype=np.uint8)


def small_session(**options: Any) -> Served:
    """A pointer-driven pipeline with a ``control`` doc behind a WebTransport on a free port."""
    web = WebTransport(port=0, token=TOKEN, grace_s=0.1, **options)
    ctx = rxstream.Context(transport=web)
    ctx.doc("control", defaults={"gain": 0.5, "prompt": "sea"})
    return Served(web, ctx.input("pointer") | ctx.pipe(frame_of) | ctx.stream("video"))


@pytest.mark.parametrize(
    "message",
    [
        {"type": "set", "changes": ["\u00e9" * 7900] * 4},
        {"type": "set", "doc": "x" * 8000, "changes": {}},
        {"type": "input", "stream": ["y" * 8000], "sample": 1},
        {"type": "input", "stream": "pointer", "sample": 1, "at_ms": ["z" * 8000]},
        {"type": "hello", "accept": ["w" * 8000, 1]},
    ],
)
def test_an_error_reply_quotes_the_value_cut_short(message: dict[str, Any]) -> None:
    """An error names the refused value by its start and end, never the whole of it."""
    with small_session() as served:

        async def check() -> dict[str, Any]:
            async with aiohttp.ClientSession() as http, http.ws_connect(served.web.ws_url) as ws:
                await ws.send_str(json.dumps({**message, "id": 7}, ensure_ascii=False))
                return await texts_until(ws, "error")

        error = asyncio.run(check())
    assert error["id"] == 7
    assert len(error["error"]) <= 200
    assert "…" in error["error"]


def test_an_error_from_below_is_cut_to_its_bound() -> None:
    """A refusal's own long text (a doc's, a stream's) is cut to MAX_ERROR_CHARS in the reply."""
    web = WebTransport(port=0, token=TOKEN)
    client = memory_page(web.limits)
    web.protocol.messages.error(client, 3, "schema", "gain must be a float, got " + "9" * 100_000)
    (reply,) = cast(MemoryLink, client.link).texts
    error = json.loads(reply)["error"]
    assert len(error) <= MAX_ERROR_CHARS
    assert error.endswith("… (100026 characters)")


def test_the_outbox_is_bounded_in_bytes_too() -> None:
    """Texts past max_bytes are dropped and reported like those past the count."""
    box = Outbox(100, max_bytes=1000)
    assert box.push("a" * 600, "error", ident=1)
    assert not box.push("b" * 600, "error", ident=2)  # 1200 bytes: over the bound
    assert box.push("c" * 300, "ack", ident=3)
    assert box.bytes == 900
    assert box.pop() == "a" * 600
    assert json.loads(box.pop() or "") == {"type": "dropped", "counts": {"error": 1}, "ids": [2]}
    assert box.pop() == "c" * 300
    assert box.bytes == 0
    assert box.push("d" * 5000)  # alone in the queue: kept whatever its size


def test_a_page_that_keeps_losing_frames_cannot_force_keyframes_on_the_others() -> None:
    """Resyncs are bounded: the page's own keyframes rate and requested_keyframes for all."""
    limits = SessionLimits()
    protocol = PageProtocol(  # a frozen clock: no bucket refills while the frames go out
        limits=limits,
        grace_s=1.0,
        max_message_bytes=1 << 16,
        fps=24.0,
        jpeg_quality=80,
        clock=lambda: 0.0,
    )
    protocol.session = Session(streams={"video": "h264"})
    deaf = protocol.attach(MemoryLink("deaf:1"))
    deaf.guard = ClientGuard(limits, "deaf", RATED, clock=lambda: 0.0)
    deaf.accept = frozenset(("h264", "h264-au", "jpeg"))
    keyframes = 0
    frames = 96  # the encoder's own keyframes: one a second, frames 0, 24, 48 and 72
    try:
        for i in range(frames):
            protocol.send(
                "video", PipelineItem(np.zeros((24, 32, 3), np.uint8), PipelineMetadata())
            )
            made = protocol.encoders[("video", "h264")]
            assert isinstance(made, H264Fragments)
            keyframes += made.keyframe
            deaf.live.discard("video")  # it lost a frame again: no longer live
            assert i or made.keyframe
    finally:
        protocol.close_encoders()
    assert keyframes <= 4 + limits.requested_keyframes.burst


async def answers(ws: Any, count: int) -> list[dict[str, Any]]:
    """The next ``count`` acks and errors, in order (frames and other texts skipped)."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(10):  # pings keep coming: bound the whole wait
        while len(got) < count:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                data = json.loads(message.data)
                if data["type"] in ("ack", "error"):
                    got.append(data)
            elif message.type != aiohttp.WSMsgType.BINARY:
                raise AssertionError(f"socket ended: {message}")
    return got


def test_a_burst_of_doc_writes_reaches_a_page_as_its_newest_states() -> None:
    """Doc changes are coalesced: fewer doc messages than writes, the last one the newest."""
    writes = 60
    with small_session() as served:

        async def check() -> list[dict[str, Any]]:
            async with (
                aiohttp.ClientSession() as http,
                http.ws_connect(served.web.ws_url) as ws,
                http.ws_connect(served.web.ws_url) as watcher,
            ):
                await texts_until(watcher, "session")
                for i in range(writes):
                    await ws.send_json({"type": "set", "changes": {"gain": i / 100}, "id": i})
                acks = await answers(ws, writes)
                assert [a["type"] for a in acks] == ["ack"] * writes
                last = acks[-1]["version"]
                docs: list[dict[str, Any]] = []
                while not docs or docs[-1]["version"] < last:
                    docs.append(await texts_until(watcher, "doc"))
                return docs

        docs = asyncio.run(check())
    assert len(docs) < writes
    assert docs[-1]["desired"]["gain"] == (writes - 1) / 100


def test_doc_writes_have_a_budget_for_all_connections_together() -> None:
    """Sets within each connection's rate are refused past SessionLimits.doc_writes."""
    limits = SessionLimits(doc_writes=Rate(0.001, 5))
    with small_session(limits=limits) as served:

        async def check() -> list[dict[str, Any]]:
            async with (
                aiohttp.ClientSession() as http,
                http.ws_connect(served.web.ws_url) as one,
                http.ws_connect(served.web.ws_url) as two,
            ):
                got = []
                for ws in (one, two):
                    for i in range(4):
                        await ws.send_json({"type": "set", "changes": {"gain": 0.1}, "id": i})
                    got += await answers(ws, 4)
                return got

        got = asyncio.run(check())
    assert [a["type"] for a in got] == ["ack"] * 5 + ["error"] * 3
    assert all(a["code"] == "rate_limited" for a in got[5:])
    assert "SessionLimits.doc_writes" in got[-1]["error"]


def test_the_json_log_never_holds_nan_or_infinity(tmp_path: Path) -> None:
    """A non-finite float in a log line is written null and its key listed in nonfinite."""
    log = tmp_path / "t.jsonl"
    saved = structlog.get_config()
    configure_logging(log)
    try:
        structlog.get_logger("rxstream.timing").info(
            "[photon:video]", decode_ms=math.inf, present_ms=math.nan, hops=[1.0, -math.inf]
        )
    finally:
        configure_logging()
        structlog.reset_defaults()
        structlog.configure(**saved)

    def refuse(constant: str) -> None:
        raise AssertionError(f"the log holds {constant}")

    (line,) = log.read_text().splitlines()
    fields = json.loads(line, parse_constant=refuse)
    assert (fields["decode_ms"], fields["present_ms"], fields["hops"]) == (None, None, [1.0, None])
    assert fields["nonfinite"] == ["decode_ms", "present_ms", "hops[1]"]


async def synced_page(http: Any, web: WebTransport) -> tuple[Any, float]:
    """A socket whose clock reads 1000 ms more than the server's; the page's clock now."""
    ws = await http.ws_connect(web.ws_url)
    ping = await texts_until(ws, "ping")
    await ws.send_json({"type": "pong", "t": ping["t"], "c": ping["t"] + 1000.0, "id": "pong"})
    assert (await answers(ws, 1))[0]["type"] == "ack"
    return ws, asyncio.get_running_loop().time() * 1e3 + 1000.0


def shown_of(header: dict[str, Any], arrived: float, decoded: float, presented: float) -> Any:
    """A ``shown`` report of the frame ``header`` with these page-clock times."""
    return {
        "type": "shown",
        "stream": "video",
        "seq": header["seq"],
        "input_seq": header["input_seq"],
        "arrived": arrived,
        "decoded": decoded,
        "presented": presented,
        "video": "jpeg",
        "id": 9,
    }


async def a_frame(ws: Any) -> dict[str, Any]:
    """Feed one input and return the header of the frame that comes back."""
    await ws.send_json({"type": "input", "stream": "pointer", "sample": [1.0, 0.0]})
    async with asyncio.timeout(10):
        while True:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.BINARY:
                (size,) = struct.unpack(">I", message.data[1:5])
                return json.loads(message.data[5 : 5 + size])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("times", "named"),
    [
        ((-1e308, 1e308, 1e308), "shown.presented must not be after now on the server's clock"),
        ((0.0, 1.0, 1e9), "shown.presented must not be after now on the server's clock"),
        ((3e6, 3e6, 3e6), "shown.presented must not be after now on the server's clock"),
        ((-5e4, -5e4, -5e4), "shown.arrived must be after frame"),
    ],
)
def test_a_forged_shown_report_is_refused_and_never_logged(
    times: tuple[float, float, float], named: str
) -> None:
    """Times outside the frame's life (on the server's clock): refused, long hops or not."""
    with small_session() as served:

        async def check() -> dict[str, Any]:
            async with aiohttp.ClientSession() as http:
                ws, now = await synced_page(http, served.web)
                header = await a_frame(ws)
                # times relative to the page's now: the frame was made just before it
                await ws.send_json(shown_of(header, *(now + t for t in times)))
                (reply,) = await answers(ws, 1)
                await ws.close()
                return reply

        reply = asyncio.run(check())
        assert served.web.protocol.photon._waiting == {}
    assert (reply["type"], reply["code"], reply["id"]) == ("error", "implausible", 9)
    assert named in reply["error"]


def test_an_honest_shown_report_is_taken() -> None:
    """A report whose times lie within the frame's life is acked (the bounds refuse no page)."""
    with small_session() as served:

        async def check() -> dict[str, Any]:
            async with aiohttp.ClientSession() as http:
                ws, _ = await synced_page(http, served.web)
                header = await a_frame(ws)
                now = asyncio.get_running_loop().time() * 1e3 + 1000.0
                await ws.send_json(shown_of(header, now, now, now))
                (reply,) = await answers(ws, 1)
                await ws.close()
                return reply

        assert asyncio.run(check())["type"] == "ack"


def test_a_pong_that_is_not_a_page_clock_is_refused() -> None:
    """A pong whose c is outside 0..2^53 ms cannot be a page clock: refused as implausible."""
    with small_session() as served:

        async def check() -> dict[str, Any]:
            async with aiohttp.ClientSession() as http:
                ws, _ = await synced_page(http, served.web)
                ping = await texts_until(ws, "ping")
                await ws.send_json({"type": "pong", "t": ping["t"], "c": -1.0})
                (reply,) = await answers(ws, 1)
                await ws.close()
                return reply

        reply = asyncio.run(check())
    assert (reply["type"], reply["code"]) == ("error", "implausible")
    assert "pong.c must be a page clock (performance.now()) in 0..2^53 ms" in reply["error"]


class Pongs:
    """A page's pongs fed to the ``pong`` handler on a fake server clock (ms)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1_000.0
        fake = type("FakeTime", (), {"monotonic": lambda: self.now / 1e3})
        monkeypatch.setattr(webmessages, "time", fake)
        self.web = WebTransport(port=0, token=TOKEN)
        self.client = memory_page(self.web.limits)

    def pong(self, after: float, rtt: float, page: float) -> dict[str, Any]:
        """A ping ``after`` ms on, answered ``rtt`` ms later with the page's clock ``page``."""
        self.now += after
        sent = self.now
        self.client.pings.append(sent)
        self.now += rtt
        pong = self.web.protocol.messages.handlers["pong"]
        return pong(self.client, {"type": "pong", "t": sent, "c": page})


def test_a_pong_that_contradicts_the_clock_is_acked_not_used_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page clock off the estimate by more than the round trips allow is not an error."""
    pongs = Pongs(monkeypatch)
    assert pongs.pong(50.0, 0.5, 60_000.0) == {}
    offset = pongs.client.clock.offset_ms
    ack = pongs.pong(2_000.0, 0.5, 60_000.0 + 2_000.5 + 5e5)
    assert ack["clock"].startswith("pong.c contradicts the round trip")
    assert ack["clock"].endswith("not used")
    assert (pongs.client.clock.offset_ms, pongs.client.pongs_unused) == (offset, 1)


def test_a_pong_over_max_rtt_is_acked_not_used_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round trip over MAX_RTT_MS sets no clock and is counted, not answered with an error."""
    pongs = Pongs(monkeypatch)
    ack = pongs.pong(50.0, 10_001.0, 60_000.0)
    assert ack["clock"].startswith("pong.t: a round trip must be at most 10000 ms")
    assert (pongs.client.clock.offset_ms, pongs.client.pongs_unused) == (None, 1)


@pytest.mark.parametrize("step", [1000 / 60, 100.0])
def test_a_coarse_page_clock_keeps_its_estimate(
    monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    """A clock on a 16.67 or 100 ms grid (jittered to either edge) never resets its estimate."""
    pongs = Pongs(monkeypatch)
    rng = np.random.default_rng(1)
    page_minus_server = 12_345.678
    resets = unused = 0
    for i in range(300):
        before = pongs.client.clock
        rtt = float(rng.uniform(0.2, 0.6))
        at = pongs.now + (50.0 if i < 8 else 2_000.0) + float(rng.uniform(0, rtt))
        grid = (at + page_minus_server) // step + float(rng.integers(0, 2))
        unused += "clock" in pongs.pong(50.0 if i < 8 else 2_000.0, rtt, grid * step)
        resets += pongs.client.clock is not before
    assert resets == 0
    assert unused <= 3
    assert pongs.client.clock_step == pytest.approx(step)


def test_a_page_clock_that_jumped_starts_its_estimate_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CLOCK_JUMPS contradicting pongs that agree with each other reset the estimate."""
    pongs = Pongs(monkeypatch)
    for _ in range(4):
        pongs.pong(50.0, 0.5, pongs.now + 50.25 + 1_000.0)
    assert pongs.client.clock.offset_ms == pytest.approx(1_000.0)
    acks = [pongs.pong(2_000.0, 0.5, pongs.now + 2_000.25 + 9_000.0) for _ in range(CLOCK_JUMPS)]
    assert ["clock" in ack for ack in acks] == [True] * (CLOCK_JUMPS - 1) + [False]
    assert pongs.client.clock.offset_ms == pytest.approx(9_000.0)


@pytest.mark.parametrize("at_ms", [0, 2**52, -(2**52)])
def test_an_input_at_ms_far_from_now_keeps_the_sample_not_the_time(at_ms: int) -> None:
    """An at_ms outside AT_MS_WINDOW_MS of the server's clock is left out, the sample fed."""
    with small_session() as served:

        async def check() -> list[dict[str, Any]]:
            async with aiohttp.ClientSession() as http, http.ws_connect(served.web.ws_url) as ws:
                message = {"type": "input", "stream": "pointer", "sample": [0, 0], "at_ms": at_ms}
                await ws.send_json({**message, "id": 1})
                await ws.send_json({**message, "at_ms": time.time() * 1e3, "id": 2})
                return await answers(ws, 2)

        kept, taken = asyncio.run(check())
    assert (kept["type"], kept["input_seq"], taken["input_seq"]) == ("ack", 1, 2)
    assert "at_ms" not in taken
    assert kept["at_ms"].startswith(
        "input.at_ms must be the page's wall clock (Date.now()) within ±600000 ms"
    )
    assert kept["at_ms"].endswith("the receive time is used")


def video_record(input_seq: int, *, cutover: bool) -> TimingRecord:
    """A folded record of stream ``video``: 40 ms from ``input.recv`` to egress, one hop."""
    return TimingRecord(
        stream="video",
        input_seq=input_seq,
        input_at_ms=1,
        cutover=cutover,
        prompt_generation=0,
        pts=3,
        origin="input.recv",
        total_ms=40.0,
        from_client_ms=None,
        hops=(HopTiming("video", 0.0, 40.0),),
    )


def test_a_join_outside_the_frames_life_is_dropped() -> None:
    """A report arriving well before its frame's egress (the record came later) joins nothing."""
    join = PhotonJoin()
    join.sent("video", 1, (("input.recv", 10.0),))
    clock = ClockOffset()
    clock.add(0.0, 0.25, 0.5)
    assert join.shown(Shown("video", 1, 7, 9_000.0, 9_001.0, 9_002.0), clock) is None
    record = video_record(7, cutover=False)
    assert join.record(record) == []
    assert join.implausible == 1


def test_a_partial_request_then_silence_is_closed() -> None:
    """A connection that never finishes its request is closed after idle_connection_s."""
    with small_session(limits=SessionLimits(idle_connection_s=0.2)) as served:
        port = served.web.bound_port or 0
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: never ends
            sock.settimeout(20)
            assert sock.recv(100) == b""  # closed by the server, not by the timeout


def test_idle_connection_s_is_checked() -> None:
    """idle_connection_s must be a finite number > 0, named in the error."""
    for bad in (0, -1.0, math.inf, "10", True):
        with pytest.raises(ValueError, match=r"^idle_connection_s must be a finite number > 0"):
            SessionLimits(idle_connection_s=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "ident"),
    [
        ('{"id": 41, "type": "set", "changes": ' + "[" * 5000 + "]" * 5000 + "}", 41),
        ('{"id": "abc", "type": "input", "sample": ' + "9" * 5000 + "}", "abc"),
        ('{"id": 7, "type": "set", "changes": {', 7),
        ('{"type": "set", "id": 7, "changes": {', None),
    ],
)
def test_an_unparsed_message_is_answered_with_its_leading_id(text: str, ident: Any) -> None:
    """Too deep, too many digits, not JSON: the error still carries an id that came first."""
    with pytest.raises(Refused) as refused:
        parse_message(text, SessionLimits())
    assert refused.value.ident == ident


@pytest.mark.parametrize("ident", [2**53 + 1, -(2**53) - 1, 10**39])
def test_an_id_javascript_cannot_hold_is_refused(ident: int) -> None:
    """An int id outside ±2^53 is refused naming the rule, never echoed."""
    with pytest.raises(Refused, match=r"^id must be an int within ±2\^53") as refused:
        parse_message(json.dumps({"type": "hello", "id": ident}), SessionLimits())
    assert refused.value.ident is None
    assert parse_message(json.dumps({"id": 2**53}), SessionLimits()) == {"id": 2**53}


def test_a_doc_write_just_before_stop_leaves_the_next_run_its_doc_states() -> None:
    """A state owed when close() stopped the loop does not block the states of the next open()."""
    web = WebTransport(port=0, token=TOKEN, grace_s=60)
    ctx = rxstream.Context(transport=web)
    ctx.doc("control", defaults={"gain": 0.5})
    pipeline = ctx.input("pointer") | ctx.pipe(frame_of) | ctx.stream("video")
    pipeline.start()
    pipeline.update(gain=0.7)  # a steer, then stop at once (one notebook cell)
    pipeline.stop()
    pipeline.start()
    try:

        async def check() -> dict[str, Any]:
            async with aiohttp.ClientSession() as http, http.ws_connect(web.ws_url) as ws:
                await texts_until(ws, "session")
                pipeline.update(gain=0.9)
                return await texts_until(ws, "doc")

        state = asyncio.run(check())
    finally:
        pipeline.stop()
    assert (state["name"], state["desired"]["gain"]) == ("control", 0.9)


def page_report(
    **times: float,
) -> tuple[webmessages.PageMessages, Page, list[ClientTiming], dict[str, Any]]:
    """Handlers that sent frame 9 (input 3, made 50 ms before ``arrived``) and folded its
    record, a page whose clock is the server's, the joins they log and a report of ``times``."""
    session = Session(streams={"video": "jpeg"}, inputs=("pointer",), docs={})
    joins: list[ClientTiming] = []
    messages = webmessages.PageMessages(
        session=lambda: session,
        limits=SessionLimits(),
        max_message_bytes=1 << 16,
        photon=PhotonJoin(),
        joined=lambda _record, timing, _page: joins.append(timing),
        keyframe=lambda _stream: None,
        acked=lambda _page, _stream, _seq: None,
    )
    client = memory_page()
    now = time.monotonic() * 1e3
    client.clock.add(now, now, now)
    messages.photon.sent("video", 9, (("input.recv", (times["arrived"] - 50.0) / 1e3),))
    messages.photon.record(video_record(3, cutover=True))
    message = {"type": "shown", "stream": "video", "seq": 9, "input_seq": 3, "video": "jpeg"}
    return messages, client, joins, {**message, **times}


def test_an_input_event_long_before_arrival_is_dropped_and_the_join_starts_at_the_origin() -> None:
    """An event > MAX_HOP_MS before arrival (a pointer that sat still) is dropped, not refused."""
    now = time.monotonic() * 1e3
    arrived = now - 100_000.0
    web, client, joins, report = page_report(
        arrived=arrived, decoded=arrived + 2.0, presented=arrived + 10.0, event=arrived - 70_000.0
    )
    ack = web.handlers["shown"](client, report)
    assert ack["event"].startswith("shown.event is 70000 ms before the frame arrived")
    ((timing),) = joins
    assert timing.up_ms is None
    assert timing.photon_ms == pytest.approx(60.0)


def test_a_background_tabs_long_hop_is_acked_and_counted_not_joined() -> None:
    """A report presented > MAX_HOP_MS after decode joins nothing and counts as implausible."""
    now = time.monotonic() * 1e3
    arrived = now - 100_000.0
    web, client, joins, report = page_report(
        arrived=arrived, decoded=arrived + 1.0, presented=now - 1_000.0
    )
    ack = web.handlers["shown"](client, report)
    assert ack["shown"].startswith("shown.presented is 98999.0 ms after the time before it")
    assert (joins, web.photon.implausible, web.photon._waiting) == ([], 1, {})


def test_an_input_event_after_arrival_is_still_refused() -> None:
    """An event after its frame arrived cannot be true: refused as implausible."""
    now = time.monotonic() * 1e3
    web, client, joins, report = page_report(
        arrived=now - 100.0, decoded=now - 99.0, presented=now - 98.0, event=now - 50.0
    )
    with pytest.raises(Refused, match=r"shown\.event must not be after the frame arrived"):
        web.handlers["shown"](client, report)
    assert joins == []


def test_a_token_bucket_spends_its_last_token_once_across_threads() -> None:
    """Two threads taking a bucket's one token at once: one gets it (the sink's and loop's)."""
    arrived = threading.Event()
    results: list[bool] = []

    def take() -> None:
        results.append(bucket.take())
        arrived.set()

    other = threading.Thread(target=take)

    class Burst(int):
        """The burst: checking the main thread's token lets the other thread take at once."""

        def __ge__(self, other_value: object) -> bool:
            if threading.current_thread() is threading.main_thread() and other.ident is None:
                other.start()
                assert arrived.wait(10)  # the other thread took, or waits for the lock
            return int(self) >= cast(int, other_value)

    class Watched:
        """The bucket's lock, telling when the other thread waits on it."""

        def __init__(self) -> None:
            self.inner = threading.Lock()

        def __enter__(self) -> None:
            if threading.current_thread() is not threading.main_thread():
                arrived.set()
            self.inner.acquire()

        def __exit__(self, *exc: object) -> None:
            self.inner.release()

    bucket = TokenBucket(Rate(0.001, Burst(1)), lambda: 0.0)
    bucket._lock = Watched()  # type: ignore[assignment]
    results.append(bucket.take())
    other.join(10)
    assert sorted(results) == [False, True]
