"""The web session is its user's alone, and nothing a client sends ends it.

Handshakes (the page and ``/ws``) from another origin, without the token, with a wrong one or
under another Host are refused with a one-line 403; the page works with its token. Every
message over a limit (depth, digits, string length, size, non-finite numbers, lone
surrogates, rates) is answered with an error and the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import math
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import structlog
from _serving import Served, texts_until

import rxstream
from rxstream import cli
from rxstream.transport import Rate, SessionLimits, WebTransport
from rxstream.transport._guard import (
    ClientGuard,
    Gate,
    Refused,
    SampledLog,
    TokenBucket,
    is_loopback,
    parse_message,
    wire,
)
from rxstream.transport._webclient import Outbox

pytestmark = pytest.mark.slow

TOKEN = "T" * 20


def frame_of(sample: tuple[float, float]) -> np.ndarray:
    """A small frame whose brightness is the sample's x."""
    return np.full((8, 8, 3), int(sample[0] * 255), dtype=np.uint8)


class Live(Served):
    """A pointer-driven pipeline with a doc behind a WebTransport on a free port."""

    def __init__(self, **options: Any) -> None:
        web = WebTransport(port=0, grace_s=0.1, **options)
        ctx = rxstream.Context(transport=web)
        self.doc = ctx.doc("control", defaults={"gain": 0.5, "prompt": "sea"})
        super().__init__(
            web, ctx.input("pointer") | ctx.pipe(frame_of, name="render") | ctx.stream("video")
        )

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.web.bound_port}"

    def __enter__(self) -> Live:
        super().__enter__()
        assert self.error is None
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        assert self.error is None


@pytest.fixture
def live() -> Iterator[Live]:
    with Live(token=TOKEN) as running:
        yield running


def run(coro: Any) -> Any:
    """Run one coroutine to its end."""
    return asyncio.run(coro)


@asynccontextmanager
async def attached(live: Live, **options: Any) -> AsyncIterator[Any]:
    """A websocket to the session with its token, past the session message."""
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(live.web.ws_url, **options) as ws,
    ):
        await texts_until(ws, "session")
        yield ws


# --- the handshake --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "null",
        "file://",
        "http://127.0.0.1.evil.example",
        "http://127.0.0.1:1",
        "https://127.0.0.1:{port}",
    ],
)
def test_a_cross_origin_handshake_is_refused(live: Live, origin: str) -> None:
    """Another site's page, with the right token even, gets 403 naming its Origin."""
    origin = origin.format(port=live.web.bound_port)

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(live.web.ws_url, origin=origin)
            assert refused.value.status == 403
            url = live.web.ws_url.replace("ws://", "http://")
            async with http.get(url, headers={"Origin": origin}) as response:
                assert response.status == 403
                reason = await response.text()
        assert reason.startswith(f"403 Forbidden: Origin {origin!r} is not this page's origin")
        assert reason.count("\n") == 1
        assert "Traceback" not in reason

    run(check())
    assert live.web.attached == 0


@pytest.mark.parametrize(
    ("query", "named"), [("", "missing"), ("?token=" + "U" * 20, "wrong"), ("?token=é", "wrong")]
)
def test_a_handshake_without_the_token_is_refused(live: Live, query: str, named: str) -> None:
    """No token or a wrong one: 403 for the socket and for the page, saying which."""
    port = live.web.bound_port

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"ws://127.0.0.1:{port}/ws{query}", origin=live.origin)
            assert refused.value.status == 403
            for path in ("/ws", "/"):
                async with http.get(f"http://127.0.0.1:{port}{path}{query}") as response:
                    assert response.status == 403
                    assert f"the session token is {named}" in await response.text()

    run(check())
    assert live.web.attached == 0


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", "[::1"]
)
def test_a_handshake_under_another_host_is_refused(live: Live, host: str) -> None:
    """A rebound DNS name reaches the port under its own Host: 403, even with the token."""
    host = host.format(port=live.web.bound_port)

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            for url in (live.web.ws_url.replace("ws://", "http://"), live.web.url):
                async with http.get(url, headers={"Host": host}) as response:
                    assert response.status == 403
                    assert "is not this server's address" in await response.text()

    run(check())


def test_the_page_works_with_its_token(live: Live) -> None:
    """The page with its token, then a socket from its own origin: session, ack, frame."""
    port = live.web.bound_port

    async def check(host: str) -> None:
        async with aiohttp.ClientSession() as http:
            page_url = live.web.url.replace("127.0.0.1", host)
            async with http.get(page_url) as response:
                assert response.status == 200
                assert "<html" in await response.text()
                assert response.headers["Referrer-Policy"] == "no-referrer"
            ws_url = live.web.ws_url.replace("127.0.0.1", host)
            async with http.ws_connect(ws_url, origin=f"http://{host}:{port}") as ws:
                await texts_until(ws, "session")
                await ws.send_json({"type": "input", "stream": "pointer", "sample": [1, 0]})
                while (await ws.receive()).type != aiohttp.WSMsgType.BINARY:
                    pass

    run(check("127.0.0.1"))
    run(check("localhost"))
    assert live.web.url == f"http://127.0.0.1:{port}/?token={TOKEN}"
    assert live.web.attached == 2


def test_without_a_token_origin_and_host_still_hold() -> None:
    """token=False serves without one, but another site's page is still refused."""
    with Live(token=False) as running:
        assert running.web.url == f"http://127.0.0.1:{running.web.bound_port}/"

        async def check() -> None:
            async with aiohttp.ClientSession() as http:
                with pytest.raises(aiohttp.WSServerHandshakeError):
                    await http.ws_connect(running.web.ws_url, origin="http://evil.example")
                async with http.ws_connect(running.web.ws_url, origin=running.origin) as ws:
                    await texts_until(ws, "session")

        run(check())


def test_the_connection_cap_refuses_the_next_with_503() -> None:
    """Past max_connections a handshake gets 503 naming the cap; one leaving frees a place."""
    with Live(token=TOKEN, limits=SessionLimits(max_connections=2)) as running:

        async def check() -> None:
            url = running.web.ws_url.replace("ws://", "http://")
            async with (
                attached(running),
                attached(running),
                aiohttp.ClientSession() as http,
                http.get(url) as response,
            ):
                assert response.status == 503
                assert "SessionLimits.max_connections" in await response.text()
            async with attached(running):
                pass

        run(check())
        assert running.web.attached == 3


def test_token_and_limit_arguments_are_checked() -> None:
    """A short or non-URL-safe token and a bad limit are refused, naming the rule."""
    with pytest.raises(ValueError, match=r"^token must be 16\.\.256 URL-safe characters"):
        WebTransport(token="short")
    with pytest.raises(ValueError, match=r"got 'with space in it…'"):
        WebTransport(token="with space in it…")
    with pytest.raises(ValueError, match=r"^max_depth must be an int >= 1, got 0$"):
        SessionLimits(max_depth=0)
    with pytest.raises(ValueError, match=r"^per_s must be a finite number > 0, got nan$"):
        Rate(math.nan, 1)
    with pytest.raises(ValueError, match=r"^steers must be a Rate\(per_s, burst\), got 5$"):
        SessionLimits(steers=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^limits must be a SessionLimits, got 3$"):
        WebTransport(limits=3)  # type: ignore[arg-type]
    assert WebTransport().token != WebTransport().token


@pytest.mark.parametrize(
    ("origin", "host", "refused"),
    [
        (None, "127.0.0.1:8765", None),
        ("http://127.0.0.1:8765", "127.0.0.1:8765", None),
        ("http://localhost:8765", "localhost:8765", None),
        ("HTTP://LOCALHOST:8765", "LocalHost:8765", None),
        ("http://[::1]:8765", "[::1]:8765", None),
        ("http://localhost:8765", "127.0.0.1:8765", "Origin"),
        (None, "127.0.0.2:8765", None),
        (None, "10.0.0.1:8765", "Host"),
        (None, "localhost.evil.example", "Host"),
        (None, "127.0.0.1:notaport", "Host"),
        (None, "", "Host"),
    ],
)
def test_gate_rules(origin: str | None, host: str, refused: str | None) -> None:
    """Host: loopback literal or localhost; Origin: absent or the page's own."""
    gate = Gate(host="127.0.0.1", token=TOKEN)
    reason = gate.refuse(host=host, origin=origin, token=TOKEN)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None
        assert refused in reason


def test_gate_with_remote_hosts() -> None:
    """allow_remote admits any IP literal and the allowed names, never another name."""
    gate = Gate(host="0.0.0.0", token=None, allow_remote=True, allowed_hosts=("box.lan",))
    assert gate.refuse(host="10.0.0.1:8765", origin="http://10.0.0.1:8765", token=None) is None
    assert gate.refuse(host="BOX.lan:8765", origin=None, token=None) is None
    assert "Host" in (gate.refuse(host="evil.example:8765", origin=None, token=None) or "")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("localhost", True),
        ("10.0.0.1", False),
        ("::", False),
        ("localhost.evil.example", False),
        ("example.com", False),
    ],
)
def test_one_loopback_rule_for_the_bound_host_and_the_host_header(
    host: str, loopback: bool
) -> None:
    """is_loopback decides both what WebTransport binds without allow_remote and what Host the
    gate admits without it."""
    assert is_loopback(host) is loopback
    header = f"[{host}]:8765" if ":" in host else f"{host}:8765"
    admitted = Gate(host="127.0.0.1", token=None).refuse(host=header, origin=None, token=None)
    assert (admitted is None) is loopback
    if loopback:
        assert WebTransport(host=host, port=0).host == host
    else:
        with pytest.raises(ValueError, match=r"^host must be a loopback address"):
            WebTransport(host=host, port=0)


# --- one message ---------------------------------------------------------------------------

DEEP = '{"type": "input", "stream": "pointer", "sample": ' + "[" * 40 + "]" * 40 + ', "id": 1}'
DEEPER = '{"type": "set", "changes": ' + "[" * 5000 + "]" * 5000 + ', "id": 2}'
DIGITS = '{"type": "input", "stream": "pointer", "sample": [1], "at_ms": ' + "9" * 5000 + "}"


@pytest.mark.parametrize(
    ("text", "code", "named", "ident"),
    [
        (DEEP, "oversized", "nesting must be at most 32 deep, got deeper at $.sample", 1),
        (DEEPER, "oversized", "nesting must be at most 32 deep", None),
        (DIGITS, "oversized", "a number must be at most 40 characters, got one of 5000", None),
        ('{"type": "input", "stream": "pointer", "sample": [1], "at_ms": Infinity, "id": 3}',
         "malformed", "numbers must be finite, got Infinity", None),
        ('{"type": "input", "stream": "pointer", "sample": [1], "at_ms": NaN, "id": 4}',
         "malformed", "numbers must be finite, got NaN", None),
        ('{"type": "input", "stream": "pointer", "sample": [1e999], "id": 5}',
         "malformed", "numbers must be finite, got '1e999'", None),
        ('{"type": "set", "changes": {"prompt": "x\\ud800y"}, "id": 6}',
         "malformed", "lone surrogate '\\ud800' at $.changes.prompt", 6),
        ('{"type": "set", "changes": {"x\\udfff": 1}, "id": 7}', "malformed", "lone surrogate", 7),
        (json.dumps({"type": "set", "changes": {"prompt": "p" * 9000}, "id": 8}),
         "oversized", "a string must be at most 8192 characters, got 9000 at $.changes.prompt", 8),
        (json.dumps({"type": "set", "changes": {"prompt": "p" * 70_000}, "id": 9}),
         "oversized", "a message must be at most 65536 bytes", None),
        (json.dumps({"type": "steer", "changes": {"prompt": 3}, "id": 10}), "schema", "prompt", 10),
        (json.dumps({"type": ["set"], "id": 11}), "unknown_type", "got ['set']", 11),
        (json.dumps({"type": "hello", "accept": "h264", "id": 12}), "malformed", "accept", 12),
    ],
)  # fmt: skip
def test_a_message_over_a_limit_is_answered_and_the_connection_goes_on(
    live: Live, text: str, code: str, named: str, ident: int | None
) -> None:
    """Each is answered with an error (with its id when it could be read); the next is acked."""

    async def check() -> None:
        async with attached(live) as ws:
            await ws.send_str(text)
            error = await texts_until(ws, "error")
            assert (error["code"], error["id"]) == (code, ident)
            assert named in error["error"]
            await ws.send_json({"type": "input", "stream": "pointer", "sample": [1, 0], "id": 99})
            assert (await texts_until(ws, "ack"))["id"] == 99

    run(check())
    assert live.pipeline.running
    assert live.doc.snapshot()["prompt"] == "sea"


def test_a_handler_that_raises_is_answered_and_the_session_goes_on() -> None:
    """A bug in a handler becomes an internal error reply (one line, with the id); no more."""
    with Live(token=TOKEN) as running:

        def boom(client: Any, message: dict[str, Any]) -> dict[str, Any]:
            raise KeyError("a bug\non two lines")

        running.web.protocol.messages.handlers["hello"] = boom

        async def check() -> None:
            async with attached(running) as ws:
                await ws.send_json({"type": "hello", "accept": [], "id": 4})
                error = await texts_until(ws, "error")
                assert error == {
                    "type": "error",
                    "id": 4,
                    "code": "internal",
                    "error": "'hello' failed: KeyError: 'a bug\\non two lines'",
                }
                await ws.send_json({"type": "input", "stream": "pointer", "sample": [1], "id": 5})
                assert (await texts_until(ws, "ack"))["id"] == 5

        run(check())
        assert running.pipeline.running


def test_the_message_types_are_the_handlers() -> None:
    """MESSAGE_TYPES lists exactly the types the transport has a handler for."""
    from rxstream.transport._web import MESSAGE_TYPES

    assert tuple(WebTransport().protocol.messages.handlers) == MESSAGE_TYPES


def test_binary_frames_are_answered() -> None:
    """A binary frame (not JSON text) is answered with malformed; the socket stays open."""
    with Live(token=TOKEN) as running:

        async def check() -> None:
            async with attached(running) as ws:
                await ws.send_bytes(b"\xff\xfe\x00garbage")
                assert (await texts_until(ws, "error"))["code"] == "malformed"
                await ws.send_json({"type": "hello", "accept": ["jpeg"], "id": 1})
                assert (await texts_until(ws, "ack"))["id"] == 1

        run(check())


def test_what_the_protocol_refuses_closes_only_that_socket() -> None:
    """Over the hard size cap (1009) or invalid UTF-8 (1007): that socket ends, the run not."""
    with Live(token=TOKEN) as running:

        async def closing(ws: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
            """The first message that is not text (the server's clock pings go on meanwhile)."""
            while (message := await ws.receive(timeout=10)).type == aiohttp.WSMsgType.TEXT:
                pass
            return message

        async def check() -> None:
            async with attached(running) as ws:
                await ws.send_str("x" * (running.web.hard_message_bytes + 1))
                ended = await closing(ws)
                assert ended.type == aiohttp.WSMsgType.CLOSE
                assert ended.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
            async with attached(running) as ws:
                await ws.send_frame(b"\xff\xfe", aiohttp.WSMsgType.TEXT)
                ended = await closing(ws)
                assert ended.type == aiohttp.WSMsgType.CLOSE
                assert ended.data == aiohttp.WSCloseCode.INVALID_TEXT
            async with attached(running) as ws:
                await ws.send_json({"type": "input", "stream": "pointer", "sample": [1], "id": 1})
                assert (await texts_until(ws, "ack"))["input_seq"] == 1

        run(check())
        assert running.pipeline.running


def test_parse_message_limits() -> None:
    """parse_message takes what is within the limits and names the rule for what is not."""
    limits = SessionLimits(max_depth=3, max_number_digits=5, max_string_chars=4)
    assert parse_message('{"a": [[1, -1234, 1.5]]}', limits) == {"a": [[1, -1234, 1.5]]}
    for text, rule in [
        ('{"a": [[[1]]]}', "nesting must be at most 3 deep, got deeper at $.a[0][0]"),
        ("123456", "a number must be at most 5 characters, got one of 6"),
        ('"abcde"', "a string must be at most 4 characters, got 5 at $"),
        ('{"abcde": 1}', "a string must be at most 4 characters, got 5 at $ (a key)"),
        ("-Infinity", "numbers must be finite, got -Infinity"),
        ("{", "a message must be JSON: Expecting property name"),
    ]:
        with pytest.raises(Refused, match="^" + re.escape(rule)):
            parse_message(text, limits)


# --- rates ----------------------------------------------------------------------------------


def test_steers_over_their_rate_are_refused_and_answered() -> None:
    """Past its burst a steer is refused (rate_limited, naming the limit); sets still go."""
    limits = SessionLimits(steers=Rate(0.001, 2))
    with Live(token=TOKEN, limits=limits) as running:

        async def check() -> None:
            async with attached(running) as ws:
                for i in range(4):
                    await ws.send_json({"type": "steer", "changes": {"prompt": f"p{i}"}, "id": i})
                answers = [await texts_until_any(ws, ("ack", "error")) for _ in range(4)]
                assert [a["type"] for a in answers] == ["ack", "ack", "error", "error"]
                assert [a["id"] for a in answers] == [0, 1, 2, 3]
                assert answers[2]["code"] == "rate_limited"
                assert answers[2]["error"] == (
                    "steer messages are limited to 0.001 a second (burst 2) per connection "
                    "(SessionLimits.steers)"
                )
                await ws.send_json({"type": "set", "changes": {"gain": 1.0}, "id": 9})
                assert (await texts_until(ws, "ack"))["id"] == 9

        run(check())
        assert running.doc.snapshot()["prompt"] == "p1"


async def texts_until_any(ws: Any, kinds: tuple[str, ...]) -> dict[str, Any]:
    """The next text message whose type is one of ``kinds``."""
    while True:
        message = await asyncio.wait_for(ws.receive(), 10)
        if message.type == aiohttp.WSMsgType.TEXT:
            data = json.loads(message.data)
            if data["type"] in kinds:
                return data  # type: ignore[no-any-return]
        elif message.type != aiohttp.WSMsgType.BINARY:
            raise AssertionError(f"socket ended: {message}")


def test_a_flood_of_refusals_is_answered_and_logged_sampled() -> None:
    """Every refused message is answered; the log has a line a second, counting the rest."""
    limits = SessionLimits(refusals=Rate(200.0, 5), log_every_s=3600.0)
    flood = 60
    with Live(token=TOKEN, limits=limits) as running, structlog.testing.capture_logs() as logs:

        async def check() -> None:
            async with attached(running) as ws:
                for i in range(flood):
                    await ws.send_str(json.dumps({"type": "shout", "id": i}))
                ids = [(await texts_until(ws, "error"))["id"] for _ in range(flood)]
                assert ids == list(range(flood))

        run(check())
        deadline = time.monotonic() + 10
        while running.web.pages and time.monotonic() < deadline:
            time.sleep(0.01)  # the server flushes the connection's log as it leaves
        assert running.web.pages == 0
        lines = [e for e in logs if e["event"] == "web_message_refused"]
        assert len(lines) == 2  # the first, and the count of the rest when it left
        first, final = lines
        assert (first["code"], first["suppressed"], final["suppressed"]) == (
            "unknown_type",
            0,
            flood - 1,
        )
        assert final["final"] is True


def test_token_bucket_and_pacing_on_a_virtual_clock() -> None:
    """A bucket refills at its rate up to its burst; pacing waits out the debt it made."""
    now = [0.0]
    bucket = TokenBucket(Rate(2.0, 3), clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] = 0.5
    assert bucket.take()
    assert not bucket.take()
    now[0] = 100.0
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]

    guard = ClientGuard(
        SessionLimits(messages=Rate(10.0, 2), refusals=Rate(1.0, 1)),
        "peer",
        {"steer": "steers"},
        clock=lambda: now[0],
    )
    assert guard.paced(refused=False) == 0.0
    assert guard.paced(refused=True) == 0.0
    assert guard.paced(refused=False) == pytest.approx(0.1)
    assert guard.paced(refused=True) == pytest.approx(1.0)
    assert guard.refused == 2


def test_sampled_log_counts_what_it_hides() -> None:
    """One line per interval per event; the next line and the flush carry the hidden count."""
    now = [0.0]
    with structlog.testing.capture_logs() as logs:
        log = SampledLog(1.0, clock=lambda: now[0], client="c")
        assert [log.warning("refused", n=i) for i in range(5)] == [True] + [False] * 4
        now[0] = 1.0
        assert log.warning("refused", n=5)
        assert log.warning("other")
        log.warning("refused", n=6)
        log.flush()
    assert [(e["event"], e.get("n"), e["suppressed"]) for e in logs] == [
        ("refused", 0, 0),
        ("refused", 5, 4),
        ("other", None, 0),
        ("refused", None, 1),
    ]
    assert logs[-1]["final"] is True
    assert logs[0]["client"] == "c"


# --- what the server says -------------------------------------------------------------------


def test_outbox_reports_what_it_dropped() -> None:
    """A full outbox drops and counts; once half empty the page is told, then the doc resent."""
    box = Outbox(4)
    assert box.push("doc-1", "doc", key="control")
    for i in range(3):
        assert box.push(f"ack-{i}", "ack", ident=i)
    assert not box.push("ack-3", "ack", ident=3)
    assert not box.push("doc-2", "doc", key="control")
    assert not box.push("timing", "timing")
    assert box.dropped == 3
    assert [box.pop(), box.pop()] == ["doc-1", "ack-0"]
    report = json.loads(box.pop() or "")
    assert report == {"type": "dropped", "counts": {"ack": 1, "doc": 1, "timing": 1}, "ids": [3]}
    assert [box.pop(), box.pop(), box.pop(), box.pop()] == ["ack-1", "ack-2", "doc-2", None]


def test_a_dropped_doc_state_replaced_by_a_newer_one_is_not_resent() -> None:
    """A doc state that a later queued one superseded is not sent again after the report."""
    box = Outbox(2)
    box.push("a", "ack", ident=1)
    box.push("b", "ack", ident=2)
    box.push("doc-1", "doc", key="control")
    assert box.pop() == "a"
    box.push("doc-2", "doc", key="control")
    assert box.pop() == "b"
    assert json.loads(box.pop() or "")["counts"] == {"doc": 1}
    assert [box.pop(), box.pop()] == ["doc-2", None]


def big_frame(sample: tuple[float, float]) -> np.ndarray:
    """A 640x480 raw frame (900 KB): a few fill the socket of a page that does not read."""
    return np.full((480, 640, 3), int(sample[0] * 255), dtype=np.uint8)


def test_a_page_that_stops_reading_is_told_which_acks_it_lost() -> None:
    """Texts past queued_texts are dropped while a page does not read, then reported by id."""
    web = WebTransport(port=0, token=TOKEN, limits=SessionLimits(queued_texts=8))
    ctx = rxstream.Context(transport=web)
    ctx.doc("control", defaults={"gain": 0.5})
    pipeline = ctx.input("pointer") | ctx.pipe(big_frame) | ctx.stream("video", codec="raw")
    ids = list(range(100, 140))

    async def check() -> None:
        task = asyncio.ensure_future(pipeline.run(poll_interval=0.02))
        while web.bound_port is None:
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as http, http.ws_connect(web.ws_url) as ws:
            await ws.send_json({"type": "hello", "accept": ["raw"]})
            while web.dropped == 0:  # the writer is stuck on a frame: the page reads nothing
                await ws.send_json({"type": "input", "stream": "pointer", "sample": [1, 0]})
                await asyncio.sleep(0.01)
            for i in ids:
                await ws.send_json({"type": "set", "changes": {"gain": i / 1000}, "id": i})
            answered: set[int] = set()
            lost: set[int] = set()
            while answered | lost != set(ids):
                message = await ws.receive(timeout=10)
                if message.type == aiohttp.WSMsgType.TEXT:
                    data = json.loads(message.data)
                    if data["type"] == "ack":
                        answered.add(data["id"])
                    elif data["type"] == "dropped":
                        lost.update(data["ids"])
                        assert data["counts"]["ack"] >= 1
            assert lost
            assert not answered & lost
        web.protocol.opened = False
        await task

    asyncio.run(check())


def test_wire_never_sends_a_bare_nan() -> None:
    """Non-finite floats go out as null, their places listed; the JSON is strict."""

    def strict(text: str) -> Any:
        def refuse(literal: str) -> None:
            raise AssertionError(f"bare {literal} on the wire")

        return json.loads(text, parse_constant=refuse)

    sent = strict(
        wire({"type": "doc", "desired": {"gain": math.nan, "v": [1.0, math.inf]}, "ok": 2})
    )
    assert sent == {
        "type": "doc",
        "desired": {"gain": None, "v": [1.0, None]},
        "ok": 2,
        "unsendable": ["desired.gain", "desired.v[1]"],
    }
    assert strict(wire({"type": "ack", "v": 1.5})) == {"type": "ack", "v": 1.5}


# --- the command line -----------------------------------------------------------------------

FRAMES_APP = str(Path(__file__).resolve().parent / "apps" / "frames_app.py")


def test_no_token_needs_insecure_and_warns(capsys: pytest.CaptureFixture[str]) -> None:
    """--no-token alone is a usage error; with --insecure it serves without one and warns."""
    assert cli.main(["run", FRAMES_APP, "--serve", "--no-token"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rxstream run: --no-token and --insecure go together: without the token")
    assert cli.main(["run", FRAMES_APP, "--no-token", "--insecure"]) == 2
    assert "--no-token goes with --serve" in capsys.readouterr().err
    argv = ["run", FRAMES_APP, "--serve", "--port", "0", "--no-token", "--insecure"]
    assert cli.main([*argv, "--timeout", "0.5", "--set", "fps=20"]) == 0
    err = capsys.readouterr().err
    assert "warning: serving without a token (--no-token --insecure)" in err
    serving = err.split("serving the page at ", 1)[1].split("\n", 1)[0]
    assert serving.startswith("http://127.0.0.1:")
    assert "token" not in serving


# --- a real browser -------------------------------------------------------------------------

EVIL_PAGE = """<!doctype html><script>
const ws = new WebSocket("%s");
ws.onopen = () => { window.result = "open"; };
ws.onclose = (e) => { window.result = window.result || `closed ${e.code}`; };
</script>"""


@contextlib.contextmanager
def serving(html: str) -> Iterator[str]:
    """Another site on loopback (another port: another origin) serving ``html``; its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
            thread.join(10)


@pytest.mark.browser
def test_in_chromium_another_sites_page_is_refused_and_the_page_works() -> None:
    """Chromium: a page of another origin with the right token cannot attach; the page can."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with (
        Live(token=TOKEN) as running,
        serving(EVIL_PAGE % running.web.ws_url) as evil_url,
        sync_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(evil_url)
            result = page.wait_for_function("window.result || false", timeout=20_000)
            assert result.json_value() == "closed 1006"
            assert running.web.attached == 0

            page = browser.new_page()
            page.goto(running.web.url)
            page.wait_for_function("window.rxstream.session !== null", timeout=20_000)
            page.evaluate('rxstream.send({type: "input", stream: "pointer", sample: [1, 0]})')
            page.wait_for_function("window.rxstream.frames > 0", timeout=20_000)
            assert running.web.attached == 1
        finally:
            browser.close()


def test_an_id_that_is_not_fit_to_echo_is_refused() -> None:
    """A long, nested or boolean ``id`` is refused (never echoed or kept); a short one is acked."""
    with Live(token=TOKEN) as running:

        async def check() -> None:
            async with attached(running) as ws:
                for ident in ("x" * 65, ["a"] * 3, {"k": 1}, True):
                    await ws.send_json({"type": "hello", "accept": ["jpeg"], "id": ident})
                    error = await texts_until(ws, "error")
                    assert (error["code"], error["id"]) == ("malformed", None)
                    assert error["error"].startswith("id must be an int within ±2^53")
                await ws.send_json({"type": "hello", "accept": ["jpeg"], "id": "x" * 64})
                assert (await texts_until(ws, "ack"))["id"] == "x" * 64

        run(check())


def test_keyframe_requests_have_a_rate_of_their_own() -> None:
    """A page asking for keyframes in a loop is refused past its burst (every page pays for one)."""
    with Live(token=TOKEN) as running:

        async def check() -> None:
            async with attached(running) as ws:
                codes = []
                for i in range(6):
                    await ws.send_json({"type": "keyframe", "stream": "video", "id": i})
                    reply = await texts_until(ws, "ack" if i < 3 else "error")
                    codes.append(reply.get("code"))
                assert codes[:3] == [None, None, None]
                assert "rate_limited" in codes[3:]

        run(check())
