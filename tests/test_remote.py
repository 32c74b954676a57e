"""A remote visitor's page, through the network emulator (bench/_net): the demo served in the
server's namespace on its address (``--allow-remote``), headless Chromium in the client's
namespace (Playwright drives it over its pipe from here). Over HTTPS (``--tls-self-signed``,
pinned) the page is a secure context on WebCodecs; over plain http it is on JPEG and says why."""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _serving import photon_bench

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(1, str(BENCH))  # bench/'s modules import each other by their own names

from _net import Link, missing, open_link  # noqa: E402
from _photon_net import serve_demo, stop  # noqa: E402

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


@contextmanager
def opened(
    link: Link, tmp_path: Path, url: str, pin: str | None, script: str | None = None
) -> Iterator[Any]:
    """``url`` open in Chromium run in the client's namespace, showing frames: its page
    (``script`` added before the page's own)."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None
    wrapper = link.wrapper("client", CHROMIUM, tmp_path)
    args = [*photon_bench().CHROMIUM_ARGS]
    args += [f"--ignore-certificate-errors-spki-list={pin}"] if pin else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(wrapper), args=args)
        try:
            page = browser.new_page()
            if script:
                page.add_init_script(script)
            page.goto(url)
            page.wait_for_function("window.rxstream.frames > 10", timeout=30_000)
            yield page
        finally:
            browser.close()


def remote_page(link: Link, tmp_path: Path, url: str, pin: str | None) -> dict[str, Any]:
    """Open ``url`` in Chromium run in the client's namespace; what its page shows."""
    with opened(link, tmp_path, url, pin) as page:
        return {
            **page.evaluate(
                "({showing: window.rxstream.showing, secure: window.isSecureContext,"
                " origin: location.origin})"
            ),
            "label": page.locator("#video-path").inner_text(),
        }


def rate_changes(log: Path) -> list[dict[str, Any]]:
    """The server's ``rate_changed`` events (each change counted and logged), in order."""
    events = (json.loads(line) for line in log.read_text().splitlines() if line.strip())
    return [e for e in events if e.get("event") == "rate_changed"]


def drawn_since(page: Any, mark: dict[str, float]) -> float:
    """Frames drawn a second since ``mark`` (``{"drawn", "at"}``, taken on the page)."""
    now = page.evaluate("({drawn: window.rxstream.drawn, at: performance.now()})")
    return float(1000 * (now["drawn"] - mark["drawn"]) / max(now["at"] - mark["at"], 1.0))


MARK = "({drawn: window.rxstream.drawn, at: performance.now()})"


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


def test_a_3_s_outage_resumes_the_same_session_without_a_reload(link: Link, tmp_path: Path) -> None:
    """blackout=3s on the link: the page says reconnecting, then shows frames again on the
    same page (no reload: a mark left on it stays) from the same run (the server never
    stopped), the session not ended."""
    server, url, pin, _ = serve_demo(link, tmp_path / "timing.jsonl")
    try:
        with opened(link, tmp_path, url, pin) as page:
            page.evaluate("window.__before_outage = true")
            link.set("rtt=40ms,blackout=3s")
            page.wait_for_function("window.rxstream.link === 'reconnecting'", timeout=10_000)
            assert "reconnecting" in page.locator("#state").inner_text()
            frames = page.evaluate("window.rxstream.frames")
            page.wait_for_function(
                f"window.rxstream.link === 'attached' && window.rxstream.frames > {frames + 24}",
                timeout=30_000,
            )
            after = page.evaluate(
                "({mark: window.__before_outage === true, ended: window.rxstream.ended,"
                " reconnects: window.rxstream.reconnects})"
            )
            assert after["mark"] is True
            assert after["ended"] is None
            assert server.poll() is None
            assert link.stats()["down"]["drops"]["blackout"] > 0
    finally:
        stop(server)


def test_rate_control_lowers_the_bitrate_under_a_cap_and_raises_it_once_lifted(
    link: Link, tmp_path: Path
) -> None:
    """rate=250kbit under the stream's rate: the page's ``rate`` falls to at most 250 kbit/s
    while frames keep showing (none over 3 s after the one before while a full second's
    queue of the old rate drains, then >= 5 fps once it is down); the cap lifted, it rises
    past 500 (>= 5 fps); the server logged (counted) a step down, then a step up after the
    lift."""
    log = tmp_path / "timing.jsonl"
    server, url, pin, _ = serve_demo(link, log)
    try:
        with opened(link, tmp_path, url, pin, photon_bench().CADENCE_JS) as page:
            settled = page.evaluate("window.rxstream.drawn") + 24  # a second in, decoder warm
            page.wait_for_function(f"window.rxstream.drawn > {settled}", timeout=30_000)
            capped_at = page.evaluate("(__net.on = true) && performance.now()")
            link.set("rtt=40ms,rate=250kbit,queue=1s")
            page.wait_for_function(
                "(window.rxstream.rate?.video?.kbps ?? 1e9) <= 250", timeout=60_000
            )
            mark = page.evaluate(MARK)
            capped = page.evaluate("window.rxstream.drawn")
            page.wait_for_function(f"window.rxstream.drawn > {capped + 24}", timeout=30_000)
            capped_fps = drawn_since(page, mark)
            now, shown = page.evaluate("[performance.now(), __net.shown]")
            lifted = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # as the log stamps
            link.set("rtt=40ms")
            mark = page.evaluate(MARK)
            page.wait_for_function("window.rxstream.rate.video.kbps > 500", timeout=90_000)
            rising_fps = drawn_since(page, mark)
    finally:
        stop(server)
    changes = rate_changes(log)
    downs = [c for c in changes if c["to_kbps"] < c["from_kbps"]]
    ups = [c for c in changes if c["to_kbps"] > c["from_kbps"] and c["timestamp"] > lifted]
    assert downs, changes
    assert ups, changes
    assert min(c["to_kbps"] for c in downs) <= 250
    stall_ms = max(b - a for a, b in itertools.pairwise([capped_at, *shown, now]))
    assert stall_ms <= 3000, (stall_ms, changes)
    assert min(capped_fps, rising_fps) >= 5, (capped_fps, rising_fps)
