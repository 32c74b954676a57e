"""A remote visitor's page, through the network emulator (bench/_net): the demo served in the
server's namespace on its address (``--allow-remote``), headless Chromium in the client's
namespace (Playwright drives it over its pipe from here). Over HTTPS (``--tls-self-signed``,
pinned) the page is a secure context on WebCodecs; over plain http it is on JPEG and says why."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _serving import photon_bench

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(1, str(BENCH))  # bench/'s modules import each other by their own names

from _net import Link, missing, open_link  # noqa: E402
from _photon_net import serve_demo  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing() is not None, reason=missing() or ""),
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"),
]


@pytest.fixture
def link() -> Iterator[Link]:
    """A link of 40 ms round trip."""
    with open_link("rtt=40ms") as opened:
        yield opened


def remote_page(link: Link, tmp_path: Path, url: str, pin: str | None) -> dict[str, Any]:
    """Open ``url`` in Chromium run in the client's namespace; what its page shows."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None
    wrapper = link.wrapper("client", CHROMIUM, tmp_path)
    args = [*photon_bench().CHROMIUM_ARGS]
    args += [f"--ignore-certificate-errors-spki-list={pin}"] if pin else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(wrapper), args=args)
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function("window.rxstream.frames > 10", timeout=30_000)
            return {
                **page.evaluate(
                    "({showing: window.rxstream.showing, secure: window.isSecureContext,"
                    " origin: location.origin})"
                ),
                "label": page.locator("#video-path").inner_text(),
            }
        finally:
            browser.close()


def test_a_remote_page_over_https_is_on_webcodecs(link: Link, tmp_path: Path) -> None:
    """HTTPS on the server's address, across the emulated link (its frames forwarded by it):
    a secure context on WebCodecs."""
    server, url, pin, _ = serve_demo(link, tmp_path / "timing.jsonl")
    assert url.startswith(f"https://{link.server_addr}:")
    shown = remote_page(link, tmp_path, url, pin)
    assert shown == {
        "showing": "webcodecs",
        "secure": True,
        "origin": url.split("/?", 1)[0],
        "label": "video: WebCodecs h264",
    }
    assert server.poll() is None
    assert link.stats()["down"]["sent_bytes"] > 50_000  # the page's frames crossed the link


def test_a_remote_page_over_plain_http_is_on_jpeg_and_says_why(link: Link, tmp_path: Path) -> None:
    """Plain http on the server's address: the run warns at start; the page is not a secure
    context, on JPEG, its label saying to serve over HTTPS."""
    _, url, pin, said = serve_demo(link, tmp_path / "timing.jsonl", tls=False)
    assert pin is None
    assert any(line.startswith("rxstream run: warning: serving http:// on ") for line in said)
    shown = remote_page(link, tmp_path, url, None)
    assert shown["showing"] == "jpeg"
    assert shown["secure"] is False
    assert shown["label"] == "video: JPEG (not a secure context: serve over HTTPS)"
