"""Outages on the server's side: a page that goes silent (a half-open link: no FIN ever comes)
has its connection cut after the bound, so the session's grace starts and the run stops; each
page is told the grace and the bound on attach; ``rxstream run --serve --grace``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from _proxy import LinkProxy
from _serving import Served, texts_until

import rxstream
from rxstream import cli
from rxstream.cli._run import SERVE_GRACE_S
from rxstream.transport import WebTransport
from rxstream.transport._guard import ClientGuard, SessionLimits
from rxstream.transport._webwatch import SILENT_MIN_S, Silence, resume_fields, silent_bound

FRAMES_APP = str(Path(__file__).resolve().parent / "apps" / "frames_app.py")


def test_the_silent_bound_is_the_grace_at_least_two_pings() -> None:
    """A page may be silent for the grace, never less than two ping intervals and a second."""
    assert SILENT_MIN_S == 5.0
    assert silent_bound(0.3) == SILENT_MIN_S
    assert silent_bound(12.0) == 12.0
    assert resume_fields(2.0) == {"grace_s": 2.0, "silent_s": SILENT_MIN_S}


class _Transport:
    def __init__(self) -> None:
        self.aborted = 0

    def abort(self) -> None:
        self.aborted += 1


def test_silence_cuts_the_connection_once_past_the_bound() -> None:
    """Nothing heard past the bound: the connection is aborted (not closed: a half-open peer
    never takes a close frame), once, and the watch ends."""
    now = [100.0]
    silence = Silence(5.0, clock=lambda: now[0])
    transport = _Transport()
    guard = ClientGuard(SessionLimits(), "peer:1", {})

    async def watch() -> None:
        task = asyncio.ensure_future(silence.watch(transport, guard))  # type: ignore[arg-type]
        await asyncio.sleep(0.02)
        now[0] += 4.0
        silence.hear()  # heard at 104: silent 0 s
        now[0] += 4.9
        await asyncio.sleep(0.1)
        assert not task.done()
        assert transport.aborted == 0
        now[0] += 0.2  # 5.1 s since heard
        await asyncio.wait_for(task, 5)

    asyncio.run(watch())
    assert transport.aborted == 1
    assert silence.cut


def _pipeline(web: WebTransport) -> Any:
    ctx = rxstream.Context(transport=web)
    return (
        ctx.input("pointer")
        | ctx.pipe(lambda s: np.full((8, 8, 3), int(s[0] * 255), dtype=np.uint8), name="render")
        | ctx.stream("video", codec="jpeg")
    )


@pytest.mark.slow
def test_a_half_open_link_is_cut_and_the_run_stops() -> None:
    """A page's link stops forwarding without closing: the server cuts that connection after
    its bound (no pong, no message), the grace runs out and run() returns."""
    web = WebTransport(port=0, grace_s=0.2)
    with Served(web, _pipeline(web)) as served, LinkProxy(web.bound_port or 0) as proxy:
        url = web.ws_url.replace(web.server.address, proxy.url_host)

        async def attach() -> dict[str, Any]:
            quick = aiohttp.ClientWSTimeout(ws_close=0.5)  # the close frame is never answered
            async with aiohttp.ClientSession() as http, http.ws_connect(url, timeout=quick) as ws:
                await ws.send_str(json.dumps({"type": "hello", "accept": ["jpeg"]}))
                resume = await texts_until(ws, "resume")
                stalled = proxy.stall()
                closed = await asyncio.to_thread(stalled.server_closed.wait, 30)
                assert closed, "the server kept the silent connection"
                return resume

        resume = asyncio.run(attach())
        assert resume == {"type": "resume", "grace_s": 0.2, "silent_s": SILENT_MIN_S}
        served.thread.join(15)
        assert not served.thread.is_alive(), "run() waited on a half-open connection"
        assert served.error is None
        assert web.pages == 0


def test_grace_goes_with_serve_and_defaults_past_a_typical_outage(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--grace without --serve is a usage error; --serve gives WebTransport SERVE_GRACE_S
    (5 s) or the --grace given."""
    assert cli.main(["run", FRAMES_APP, "--grace", "3"]) == 2
    assert "--grace goes with --serve" in capsys.readouterr().err
    graces: list[float] = []

    def recorded(**options: Any) -> None:
        graces.append(options["grace_s"])
        raise ValueError("recorded")

    monkeypatch.setattr("rxstream.transport.WebTransport", recorded)
    assert cli.main(["run", FRAMES_APP, "--serve", "--port", "0"]) == 2
    assert cli.main(["run", FRAMES_APP, "--serve", "--port", "0", "--grace", "7.5"]) == 2
    assert graces == [SERVE_GRACE_S, 7.5]
    assert SERVE_GRACE_S == 5.0
