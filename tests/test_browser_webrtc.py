"""The page on the WebRTC wire in headless Chromium (Playwright): on loopback it plays the
demo over the data channel and steers it; ``?wire=ws`` keeps it on the socket; through the
network emulator (bench/_net) it uses WebRTC across the link, and with UDP dropped it falls
back to the socket at its 2 s bound, saying so."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _serving import photon_bench
from test_browser import CHROMIUM_ARGS, DemoSession

pytest.importorskip("aiortc", reason="aiortc is not installed (rxstream[webrtc])")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(1, str(BENCH))  # bench/'s modules import each other by their own names

from _net import Link, missing, open_link  # noqa: E402
from _photon_net import serve_demo  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"),
]
EMULATOR = pytest.mark.skipif(missing() is not None, reason=missing() or "")

STATE = (
    "({wire: window.rxstream.wire, note: window.rxstream.wireNote, frames: window.rxstream.frames,"
    " rtcFrames: window.rxstream.rtcFrames, label: document.getElementById('wire').textContent})"
)


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def test_a_page_on_webrtc_plays_and_steers_the_demo_over_the_data_channel(browser: Any) -> None:
    """The page's frames come over its data channel (the server counts them sent there), it
    says "wire: WebRTC", its pointer is fed and a steer cuts over."""
    with DemoSession() as session:
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(session.web.url)
        page.wait_for_function("window.rxstream.rtcFrames > 20", timeout=20_000)
        shown = page.evaluate(STATE)
        assert shown["wire"] == "WebRTC"
        assert shown["label"] == "wire: WebRTC"
        rtc = session.web.rtc
        assert rtc is not None
        assert rtc.counters.opened == 1
        assert rtc.counters.frames >= 20
        assert rtc.counters.messages >= 20  # the page's got acks came over its input channel

        view = page.locator("#view")
        box = view.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.4)
        seq = page.wait_for_function(
            "window.rxstream.lastInputSeq || false", timeout=20_000
        ).json_value()
        page.wait_for_function(
            f"window.rxstream.timing.some((r) => r.input_seq === {seq})", timeout=20_000
        )

        cutovers = page.evaluate("window.rxstream.cutovers")
        page.locator("#prompt").fill("a storm over the mountains")
        page.locator("#prompt").press("Enter")
        page.wait_for_function(f"window.rxstream.cutovers > {cutovers}", timeout=20_000)
        assert session.ctx.control.desired.prompt.value == "a storm over the mountains"
        before = page.evaluate("window.rxstream.rtcFrames")
        page.wait_for_function(f"window.rxstream.rtcFrames > {before} + 10", timeout=20_000)
        assert page.evaluate("window.rxstream.errors") == []
        assert errors == []
        page.close()


def test_wire_ws_keeps_the_page_on_the_socket(browser: Any) -> None:
    """?wire=ws: no offer is made; frames come over the socket; the label says why."""
    with DemoSession() as session:
        page = browser.new_page()
        page.goto(f"{session.web.url}&wire=ws")
        page.wait_for_function("window.rxstream.frames > 20", timeout=20_000)
        shown = page.evaluate(STATE)
        assert shown["label"] == "wire: WebSocket (?wire=ws)"
        assert shown["rtcFrames"] == 0
        rtc = session.web.rtc
        assert rtc is not None
        assert rtc.counters.offers == 0
        page.close()


@pytest.fixture
def link() -> Iterator[Link]:
    """A link of 40 ms round trip."""
    with open_link("rtt=40ms") as opened:
        yield opened


def remote_state(link: Link, tmp_path: Path, url: str, pin: str | None, until: str) -> Any:
    """Chromium in the client's namespace opens ``url``; its wire once ``until`` holds."""
    assert CHROMIUM is not None
    wrapper = link.wrapper("client", CHROMIUM, tmp_path)
    args = [*photon_bench().CHROMIUM_ARGS]
    args += [f"--ignore-certificate-errors-spki-list={pin}"] if pin else []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(wrapper), args=args)
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function(until, timeout=30_000)
            return page.evaluate(STATE)
        finally:
            browser.close()


@EMULATOR
def test_across_the_link_webrtc_and_with_udp_dropped_the_socket_at_2_s(
    link: Link, tmp_path: Path
) -> None:
    """Through the emulator a remote page uses WebRTC (its frames cross the link on UDP);
    with the link dropping UDP it stays on the socket once 2 s passed, saying so, and its
    frames keep coming."""
    server, url, pin, _ = serve_demo(link, tmp_path / "timing.jsonl")
    try:
        shown = remote_state(link, tmp_path, url, pin, "window.rxstream.rtcFrames > 10")
        assert shown["label"] == "wire: WebRTC"
        link.set("rtt=40ms,udp=drop")
        shown = remote_state(
            link, tmp_path, url, pin, "window.rxstream.wireNote.includes('did not connect')"
        )
        assert shown["label"] == "wire: WebSocket (WebRTC did not connect in 2 s)"
        assert shown["rtcFrames"] == 0
        assert shown["frames"] > 24  # the socket carried the frames while WebRTC was tried
        assert server.poll() is None
    finally:
        server.terminate()
        server.wait(20)
