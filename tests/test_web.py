"""The web session transport over a real socket: frames out, validated messages in."""

from __future__ import annotations

import asyncio
import io
import json
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import numpy as np
import pytest
from _serving import Served
from PIL import Image

import rxstream
from rxstream.testing import wait_idle
from rxstream.topology import ClientStreamLimits
from rxstream.transport import WebTransport, decode_raw

pytestmark = pytest.mark.slow

WIDTH, HEIGHT = 32, 24


def frame_of(sample: tuple[float, float]) -> np.ndarray:
    """A frame whose brightness is the pointer's x (so a test can see the input arrive)."""
    return np.full((HEIGHT, WIDTH, 3), int(sample[0] * 255), dtype=np.uint8)


class Session(Served):
    """A pointer-driven pipeline behind a WebTransport on a free port, run by ``run()``."""

    def __init__(self, codec: str = "jpeg", *, grace_s: float = 0.1, max_items: int = 50):
        web = WebTransport(port=0, grace_s=grace_s, max_message_bytes=1024)
        ctx = rxstream.Context(transport=web)
        self.doc = ctx.doc("control", defaults={"gain": 0.5, "prompt": "sea"})
        super().__init__(
            web,
            ctx.input("pointer", ClientStreamLimits(max_items=max_items))
            | ctx.pipe(frame_of, name="render")
            | ctx.stream("video", codec=codec),
        )


class Page:
    """A websocket client that says hello like the page does, and keeps what it received.

    Messages are read in order and kept by kind, so waiting for one kind never loses another.
    """

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.texts: list[dict[str, Any]] = []
        self.frames: list[tuple[dict[str, Any], bytes]] = []

    async def send(self, message: dict[str, Any] | str) -> None:
        await self.ws.send_str(message if isinstance(message, str) else json.dumps(message))

    async def _receive(self, timeout: float) -> None:
        message = await asyncio.wait_for(self.ws.receive(), timeout)
        if message.type == aiohttp.WSMsgType.TEXT:
            self.texts.append(json.loads(message.data))
        elif message.type == aiohttp.WSMsgType.BINARY:
            data = message.data
            assert data[:1] == b"F"
            (length,) = struct.unpack(">I", data[1:5])
            self.frames.append((json.loads(data[5 : 5 + length]), data[5 + length :]))
        else:
            raise AssertionError(f"socket ended: {message}")

    async def text(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        """The oldest unread JSON message of type ``kind``."""
        while True:
            for i, data in enumerate(self.texts):
                if data["type"] == kind:
                    return self.texts.pop(i)
            await self._receive(timeout)

    async def frame(self, timeout: float = 10.0) -> tuple[dict[str, Any], bytes]:
        """The oldest unread frame: its header and its encoded bytes."""
        while not self.frames:
            await self._receive(timeout)
        return self.frames.pop(0)


@asynccontextmanager
async def page(url: str, accept: tuple[str, ...] = ("jpeg",)) -> AsyncIterator[Page]:
    """A connected :class:`Page`."""
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url.replace("http", "ws", 1).replace("/?", "/ws?", 1)) as ws,
    ):
        client = Page(ws)
        await client.send({"type": "hello", "accept": list(accept)})
        yield client


@pytest.fixture
def session() -> Iterator[Session]:
    with Session() as running:
        yield running


def test_refuses_a_non_loopback_host_unless_asked() -> None:
    """Binding beyond loopback needs allow_remote; the error names the host and the rule."""
    with pytest.raises(ValueError, match=r"loopback.*allow_remote.*'0\.0\.0\.0'"):
        WebTransport(host="0.0.0.0")
    assert WebTransport(host="0.0.0.0", allow_remote=True).host == "0.0.0.0"
    assert WebTransport(host="::1", token="t" * 16).url == f"http://[::1]:8765/?token={'t' * 16}"
    with pytest.raises(ValueError, match="port"):
        WebTransport(port=70000)


def test_serves_the_page_and_a_session_message(session: Session) -> None:
    """GET / is the page; a socket gets the streams, inputs and the doc's controls."""

    async def check() -> None:
        async with aiohttp.ClientSession() as http, http.get(session.web.url) as response:
            assert response.status == 200
            assert "rxstream" in await response.text()
        async with page(session.web.url) as ws:
            hello = await ws.text("session")
        assert hello["streams"] == {"video": "jpeg"}
        assert hello["inputs"] == ["pointer"]
        paths = {c["path"]: c["kind"] for c in hello["docs"]["control"]["controls"]}
        assert paths == {"gain": "number", "prompt": "text"}

    asyncio.run(check())


def test_input_is_acked_framed_and_timed(session: Session) -> None:
    """A pointer sample comes back as a JPEG frame with its input_seq and a timing record."""

    async def check() -> None:
        async with page(session.web.url) as ws:
            await ws.text("session")
            await ws.send({"type": "input", "stream": "pointer", "sample": [1.0, 0.0], "id": 7})
            ack = await ws.text("ack")
            assert ack == {"type": "ack", "id": 7, "input_seq": 1}
            header, data = await ws.frame()
            assert header["input_seq"] == 1
            assert header["codec"] == "jpeg"
            assert (header["width"], header["height"]) == (WIDTH, HEIGHT)
            image = np.asarray(Image.open(io.BytesIO(data)))
            assert image.shape == (HEIGHT, WIDTH, 3)
            assert image.mean() > 240
            record = (await ws.text("timing"))["record"]
            assert record["input_seq"] == 1
            assert record["origin"] == "input.recv"

    asyncio.run(check())


def test_doc_writes_and_steers_are_acked_and_broadcast(session: Session) -> None:
    """set and steer change the doc, ack its version and broadcast the new state."""

    async def check() -> None:
        async with page(session.web.url) as ws:
            await ws.text("session")
            await ws.send(json.dumps({"type": "set", "changes": {"gain": 0.75}, "id": 1}))
            assert (await ws.text("ack"))["version"] == 1
            assert (await ws.text("doc"))["desired"]["gain"] == 0.75
            before = session.doc.generations.state().prompt
            await ws.send(json.dumps({"type": "steer", "changes": {"prompt": "storm"}}))
            assert (await ws.text("doc"))["desired"]["prompt"] == "storm"
        assert session.doc.desired.prompt.value == "storm"
        assert session.doc.generations.state().prompt == before + 1

    asyncio.run(check())


@pytest.mark.parametrize(
    ("message", "code", "named"),
    [
        ("not json", "malformed", "JSON"),
        ("[1, 2]", "malformed", "JSON object"),
        (json.dumps({"type": "shout"}), "unknown_type", "'shout'"),
        (json.dumps({"type": "input", "stream": "keys", "sample": 1}), "unknown_stream", "'keys'"),
        (json.dumps({"type": "input", "stream": "pointer"}), "malformed", "sample"),
        (json.dumps({"type": "set", "changes": {"gain": "loud"}}), "schema", "gain"),
        (json.dumps({"type": "set", "changes": {"volume": 1}}), "schema", "volume"),
        (json.dumps({"type": "set", "doc": "other", "changes": {}}), "unknown_doc", "'other'"),
        (json.dumps({"type": "set", "changes": [1]}), "malformed", "changes"),
        (
            json.dumps({"type": "input", "stream": "pointer", "sample": "x" * 2000}),
            "oversized",
            "1024",
        ),
    ],
)
def test_bad_messages_get_errors_and_the_session_goes_on(
    session: Session, message: str, code: str, named: str
) -> None:
    """Each refused message is answered on its socket; the next valid input still works."""

    async def check() -> None:
        async with page(session.web.url) as ws:
            await ws.text("session")
            await ws.send(message)
            error = await ws.text("error")
            assert error["code"] == code
            assert named in error["error"]
            await ws.send({"type": "input", "stream": "pointer", "sample": [0.5, 0.5], "id": 2})
            assert (await ws.text("ack"))["input_seq"] == 1
            header, _ = await ws.frame()
            assert header["input_seq"] == 1

    asyncio.run(check())
    assert session.pipeline.running
    assert session.doc.snapshot()["gain"] == 0.5


def test_over_limit_client_stream_is_refused_on_that_stream() -> None:
    """Past its bound a client stream gets a limit error naming it; the doc still takes writes."""

    async def check(web: WebTransport) -> None:
        async with page(web.url) as ws:
            await ws.text("session")
            for _ in range(3):
                await ws.send(
                    json.dumps({"type": "input", "stream": "pointer", "sample": [0.1, 0.1]})
                )
            error = await ws.text("error")
            assert error["code"] == "limit"
            assert "pointer" in error["error"]
            await ws.send(json.dumps({"type": "set", "changes": {"gain": 1.0}, "id": 3}))
            assert (await ws.text("ack"))["version"] == 1
            # both accepted samples are in; the page is still here, so the run goes on
            assert await asyncio.to_thread(wait_idle, running.pipeline, 30)
            stats = running.pipeline.statistics()
            assert (stats["video"].items_out, stats["render"].inbox_depth) == (2, 0)

    with Session(max_items=2) as running:
        asyncio.run(check(running.web))


def test_raw_frames_and_h264_with_an_init_segment() -> None:
    """raw frames decode to the pixels; an h264 page starts with the init segment."""

    async def check(web: WebTransport, accept: tuple[str, ...]) -> list[dict[str, Any]]:
        headers = []
        async with page(web.url, accept) as ws:
            await ws.text("session")
            for i in range(3):
                sample = {"type": "input", "stream": "pointer", "sample": [i / 4, 0]}
                await ws.send(json.dumps(sample))
                header, data = await ws.frame()
                headers.append(header)
                if header["codec"] == "raw":
                    assert int(decode_raw(data).mean()) == int(i / 4 * 255)
                elif header.get("init"):
                    assert data[4:8] == b"ftyp"
                    assert header["mime"].startswith('video/mp4; codecs="avc1.')
        return headers

    with Session("raw") as running:
        assert [h["codec"] for h in asyncio.run(check(running.web, ("raw",)))] == ["raw"] * 3
    with Session("h264") as running:
        headers = asyncio.run(check(running.web, ("h264",)))
        assert [h["codec"] for h in headers] == ["h264"] * 3
        assert [bool(h.get("init")) for h in headers] == [True, False, False]
    with Session("h264") as running:  # a page that cannot play h264 gets JPEG
        assert [h["codec"] for h in asyncio.run(check(running.web, ()))] == ["jpeg"] * 3


def test_run_stops_when_the_last_page_leaves() -> None:
    """run() lives while a page is attached and returns after it closed (plus the grace)."""
    with Session() as running:

        async def visit() -> None:
            async with page(running.web.url) as ws:
                await ws.text("session")
                assert running.web.pages == 1
                assert running.web.connected

        asyncio.run(visit())
        running.thread.join(10)
        assert not running.thread.is_alive()
        assert running.error is None
        assert not running.web.connected
        assert running.web.attached == 1
