"""``rxstream serve`` of the demo in headless Chromium (Playwright): two visitors at once each
steer their own session, a third waits on the queue page and is served when one leaves; a
session whose stage raises says so on its page while the other keeps playing.

Runs where Debian's chromium is installed and skips, saying so, elsewhere.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _serve import SERVE_APP, Server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "examples" / "demo.py")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]

if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def _visit(browser: Any, url: str) -> Any:
    """A visitor of their own (a fresh browser context: no shared cookies or cache)."""
    page = browser.new_context(viewport={"width": 900, "height": 700}).new_page()
    page.goto(url)
    return page


def _prompt(page: Any) -> str:
    return str(page.evaluate("window.rxstream.docs.control.desired.prompt"))


def test_two_visitors_steer_their_own_sessions_and_a_third_waits(
    browser: Any, tmp_path: Path
) -> None:
    """Two pages of the demo each get a session; a prompt typed in one never shows in the
    other; a third page shows place 1 in the queue and plays once one of them closed. Every
    timing and photon line of the log names its session."""
    log = tmp_path / "timing.jsonl"
    with Server(DEMO, "--workers", "2", "--grace", "0.3", "--log", str(log)) as server:
        a, b = _visit(browser, server.url), _visit(browser, server.url)
        for page in (a, b):
            assert "/s/" in page.url
            page.wait_for_function("window.rxstream.frames > 5", timeout=30_000)
        assert a.url != b.url
        a.locator("#prompt").fill("a red desert")
        a.locator("#prompt").press("Enter")
        b.locator("#prompt").fill("a blue sea")
        b.locator("#prompt").press("Enter")
        a.wait_for_function(
            "window.rxstream.docs.control.desired.prompt === 'a red desert'", timeout=20_000
        )
        b.wait_for_function(
            "window.rxstream.docs.control.desired.prompt === 'a blue sea'", timeout=20_000
        )
        for page in (a, b):  # each steer's first frame, on its own page
            page.wait_for_function("window.rxstream.cutovers >= 1", timeout=20_000)
        assert _prompt(a) == "a red desert"  # b's steer never reached a
        c = _visit(browser, server.url)
        assert "/q/" in c.url
        c.wait_for_function("document.getElementById('place').textContent === '1'")
        a_id = a.url.split("/s/")[1].split("/")[0]
        a.close()
        c.wait_for_url("**/s/**", timeout=30_000)
        c.wait_for_function("window.rxstream.frames > 5", timeout=30_000)
        assert _prompt(c) != "a red desert"  # a fresh doc on a's worker
        assert b.evaluate("window.rxstream.errors") == []
        frames = b.evaluate("window.rxstream.frames")
        b.wait_for_function(f"window.rxstream.frames > {frames + 10}", timeout=20_000)
        box = b.locator("#view").bounding_box()
        for step in range(10):  # pointer moves: their frames' photon lines
            b.mouse.move(box["x"] + 20 + 15 * step, box["y"] + 40)
        b.wait_for_function("Object.keys(window.rxstream.photon).length > 0", timeout=20_000)
        ids = {page.url.split("/s/")[1].split("/")[0] for page in (b, c)} | {a_id}
        server.stop()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    photon = [x for x in lines if x["event"].startswith("[photon:")]
    timing = [x for x in lines if x["event"].startswith("[timing:")]
    assert photon
    assert {x["session"] for x in photon + timing} <= ids


def test_a_failing_session_says_so_on_its_page_and_the_other_plays_on(browser: Any) -> None:
    """Ticking ``fail`` on one page ends its session with the stage's error shown there; the
    other page's frames keep coming."""
    with Server(SERVE_APP, "--workers", "2", "--grace", "0.3") as server:
        a, b = _visit(browser, server.url), _visit(browser, server.url)
        for page in (a, b):
            page.wait_for_function("window.rxstream.frames > 5", timeout=30_000)
        a.locator('input[data-path="fail"]').check()
        a.wait_for_function(
            "document.getElementById('errors').textContent.includes('session ended')",
            timeout=20_000,
        )
        shown = a.locator("#errors").text_content() or ""
        assert "session_ended: session ended: the app failed: " in shown
        assert "RuntimeError: asked to fail" in shown
        frames = b.evaluate("window.rxstream.frames")
        b.wait_for_function(f"window.rxstream.frames > {frames + 15}", timeout=20_000)
        assert b.evaluate("window.rxstream.errors") == []
