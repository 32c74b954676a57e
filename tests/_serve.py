"""``rxstream serve`` in a subprocess and scripted visitors over real sockets, for the tests
and benches of serving (tests/test_serve.py, bench/serve_*.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
SERVE_APP = str(ROOT / "tests" / "apps" / "serve_app.py")
_URL = re.compile(r"serving at (\S+)$")


class Server:
    """``rxstream serve APP --port 0 ARGS`` while in ``with``: :attr:`url`, :attr:`base`,
    :attr:`token`; every line it wrote to stderr in :attr:`lines`."""

    def __init__(self, app: str = SERVE_APP, *args: str, start_s: float = 120.0) -> None:
        self.argv = [sys.executable, "-m", "rxstream", "serve", app, "--port", "0", *args]
        self.start_s = start_s
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.url = self.base = self.token = ""
        self.process: subprocess.Popen[str] | None = None
        self.status: int | None = None

    def __enter__(self) -> Self:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            self.argv,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        line = self.wait_line(_URL.pattern, self.start_s)
        found = _URL.search(line)
        assert found is not None
        self.url = found.group(1)
        self.base = self.url.split("?", 1)[0].rstrip("/")
        self.token = self.url.split("token=", 1)[1] if "token=" in self.url else ""
        return self

    def _read(self) -> None:
        assert self.process is not None
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.lines.append("<eof>")
            self.changed.notify_all()

    def wait_line(self, pattern: str, timeout: float = 30.0) -> str:
        """The first line of stderr matching ``pattern`` (waits for it)."""
        wanted = re.compile(pattern)
        with self.changed:
            found = self.changed.wait_for(
                lambda: (
                    next((x for x in self.lines if wanted.search(x)), None)
                    or ("<eof>" in self.lines and "<eof>")
                ),
                timeout,
            )
        assert found, f"no line {pattern!r} in {self.lines}"
        assert found != "<eof>", f"no line {pattern!r} in {self.lines}"
        return str(found)

    def stop(self, signum: int = signal.SIGINT, timeout: float = 30.0) -> int:
        """Signal the server and wait for it: its exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signum)
        self.status = self.process.wait(timeout)
        self._reader.join(timeout)
        assert self.process.stderr is not None
        self.process.stderr.close()
        return self.status

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.status is None:
            self.stop()


def alive(pid: int) -> bool:
    """Whether the process ``pid`` still runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def shm_segments() -> set[str]:
    """The names in /dev/shm now."""
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def unpack(data: bytes) -> tuple[dict[str, Any], bytes]:
    """A frame message: its JSON header and its payload."""
    assert data[:1] == b"F"
    length = int.from_bytes(data[1:5], "big")
    return json.loads(data[5 : 5 + length]), data[5 + length :]


class Visitor:
    """One scripted visitor: a session asked for over HTTP, its page's socket."""

    def __init__(self, http: aiohttp.ClientSession, server: Server) -> None:
        self.http = http
        self.server = server
        self.info: dict[str, Any] = {}
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.frames = 0
        self.shades: list[int] = []
        self.texts: list[dict[str, Any]] = []
        self.opened_at = 0.0
        self.first_frame_at = 0.0

    @property
    def id(self) -> str:
        return str(self.info["id"])

    async def open(self, *, busy_s: float = 0.0) -> Self:
        """Ask for a session (as an API client) and attach its socket; while every worker is
        busy (503) ask again, for ``busy_s`` seconds at most."""
        url = f"{self.server.base}/?token={self.server.token}"
        async with asyncio.timeout(busy_s + 30):
            while True:
                self.opened_at = time.monotonic()
                async with self.http.get(url, headers={"Accept": "application/json"}) as got:
                    if got.status == 503 and busy_s > 0:
                        await asyncio.sleep(0.02)
                        continue
                    assert got.status == 200, (got.status, await got.text())
                    self.info = await got.json()
                    break
        await self.attach()
        return self

    async def attach(self) -> None:
        async with self.http.get(self.server.base + self.info["url"]) as page:
            assert page.status == 200, (page.status, await page.text())
        self.ws = await self.http.ws_connect(self.server.base + self.info["ws"])
        await self.ws.send_str(json.dumps({"type": "hello", "accept": ["raw", "jpeg"]}))

    async def frames_until(self, count: int, timeout: float = 20.0) -> None:
        """Read until ``count`` more frames came (texts kept in :attr:`texts`)."""
        wanted = self.frames + count
        async with asyncio.timeout(timeout):
            while self.frames < wanted:
                await self.read_one()

    async def read_one(self) -> aiohttp.WSMessage:
        assert self.ws is not None
        message = await self.ws.receive()
        if message.type == aiohttp.WSMsgType.BINARY:
            header, payload = unpack(message.data)
            self.frames += 1
            if not self.first_frame_at:
                self.first_frame_at = time.monotonic()
            if header.get("codec") == "raw":
                self.shades.append(payload[-1])
        elif message.type == aiohttp.WSMsgType.TEXT:
            self.texts.append(json.loads(message.data))
        else:
            raise ConnectionError(f"socket closed: {message.type} {message.extra}")
        return message

    async def until_closed(self, timeout: float = 20.0) -> None:
        """Read until the socket closes."""
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(timeout):
                while True:
                    await self.read_one()

    async def set(self, **changes: Any) -> None:
        assert self.ws is not None
        await self.ws.send_str(json.dumps({"type": "set", "changes": changes}))

    async def steer(self, **changes: Any) -> None:
        assert self.ws is not None
        await self.ws.send_str(json.dumps({"type": "steer", "changes": changes}))

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()

    def errors(self) -> Sequence[dict[str, Any]]:
        return [t for t in self.texts if t.get("type") == "error"]


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, Any, Any]:
    """``GET url`` as an API client: its status, JSON body (or text) and headers."""
    async with http.get(url, headers={"Accept": "application/json"}) as got:
        text = await got.text()
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = text
        return got.status, body, got.headers
