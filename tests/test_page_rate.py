"""The page shows the bitrate the server's rate control chose (the ``rate`` message).

The page runs in Chromium against a mocked socket (Playwright's WebSocket routing), so the
test pins the page's side of the message alone. Skips, saying so, without chromium.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _serving import photon_bench

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

PAGE = Path(__file__).resolve().parent.parent / "rxstream" / "transport" / "static" / "index.html"
ORIGIN = "http://rxstream.test"


@pytest.fixture
def page() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=photon_bench().CHROMIUM_ARGS
        )
        try:
            yield browser.new_page()
        finally:
            browser.close()


def test_the_page_shows_each_rate_message(page: Any) -> None:
    """A ``rate`` message sets the header's rate element: kbit/s, the size below 100 %, the
    reason; the newest per stream is kept in ``rxstream.rate``."""
    message = {"type": "rate", "stream": "video", "kbps": 412.6, "scale": 1.0, "reason": "drops"}
    sockets: list[Any] = []

    def connected(socket: Any) -> None:  # the mocked server: one rate message on attach
        sockets.append(socket)
        socket.send(json.dumps(message))

    page.route(f"{ORIGIN}/", lambda route: route.fulfill(body=PAGE.read_text(), status=200))
    page.route_web_socket("ws://rxstream.test/ws*", connected)
    page.goto(f"{ORIGIN}/")
    page.wait_for_function("() => !document.getElementById('rate').hidden")
    assert page.locator("#rate").text_content() == "rate: 413 kbit/s (drops)"
    sockets[0].send(json.dumps({**message, "kbps": 100, "scale": 0.5, "reason": "floor"}))
    page.wait_for_function("() => window.rxstream.rate.video.reason === 'floor'")
    assert page.locator("#rate").text_content() == "rate: 100 kbit/s, 50 % size (floor)"
