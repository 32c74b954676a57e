"""A pipeline's ``run()`` served on a thread of its own behind a WebTransport, for the tests
that talk to a live session over its socket (web, security, fuzz, input schemas)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Self

import aiohttp

from rxstream import Pipeline
from rxstream.transport import WebTransport


class Served:
    """``pipeline.run()`` on a thread while in ``with``; ``web`` serves it on a free port."""

    def __init__(self, web: WebTransport, pipeline: Pipeline) -> None:
        self.web = web
        self.pipeline = pipeline
        self.error: BaseException | None = None
        """What ``run()`` raised, if anything."""
        self.started = threading.Event()
        """Set once the page's server is up (or ``run()`` ended before it was)."""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            task = asyncio.ensure_future(self.pipeline.run(poll_interval=0.02))
            while self.web.bound_port is None and not task.done():
                await asyncio.sleep(0.01)
            self.started.set()
            await task

        try:
            asyncio.run(main())
        except BaseException as exc:
            self.error = exc
        finally:
            self.started.set()

    def __enter__(self) -> Self:
        self.thread.start()
        assert self.started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.web.protocol.opened = False  # a test that never attached a page: let run() return
        self.thread.join(10)
        assert not self.thread.is_alive()


async def texts_until(ws: Any, kind: str, timeout: float = 10.0) -> dict[str, Any]:
    """The next text message of type ``kind`` (frames and other texts are skipped), within
    ``timeout`` seconds in all (pings keep coming: the whole wait is bounded)."""
    async with asyncio.timeout(timeout):
        while True:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                data = json.loads(message.data)
                if data["type"] == kind:
                    return data  # type: ignore[no-any-return]
            elif message.type != aiohttp.WSMsgType.BINARY:
                raise AssertionError(f"socket ended: {message}")


def photon_bench() -> ModuleType:
    """bench/photon.py as a module (loaded once): its on-screen probe, pointer jumps, harness
    helpers and the Chromium flags every browser test starts with (``CHROMIUM_ARGS``)."""
    name = "rxstream_photon_bench"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    path = Path(__file__).resolve().parent.parent / "bench" / "photon.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
