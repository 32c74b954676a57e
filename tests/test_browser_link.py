"""The live page over an impaired link (a loopback TCP proxy of the test's own between the page
and the server, tests/_proxy.py): a burst after a hold is decoded whole, an outage within the
grace resumes the same session without a reload, a longer one ends with a clear message.

Runs where Debian's chromium is installed and skips, saying so, elsewhere.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _proxy import LinkProxy
from _serving import photon_bench

import rxstream
from rxstream.testing import capture_timing
from rxstream.transport import WebTransport

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

BENCH = photon_bench()
wait_for: Callable[..., Any] = BENCH.wait_for

KEYFRAME_INTERVAL_MS = 1000
"""The demo's h264 keyframe interval (a second: keyint = fps)."""


class Demo:
    """The demo app's ``main`` on a WebTransport (in a thread), reached through a LinkProxy."""

    def __init__(self, grace_s: float) -> None:
        self.web = WebTransport(port=0, grace_s=grace_s)
        self.ctx = rxstream.Context(transport=self.web)
        self.demo = BENCH.load_demo()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.proxy: LinkProxy | None = None

    def _main(self) -> None:
        try:
            asyncio.run(self.demo.main(self.ctx))
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Demo:
        self.thread.start()
        port = wait_for(lambda: self.web.bound_port, "the server to listen")
        self.proxy = LinkProxy(port).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.web.protocol.opened = False
        self.thread.join(10)
        if self.proxy is not None:
            self.proxy.__exit__()

    @property
    def url(self) -> str:
        """The page's URL through the proxy."""
        assert self.proxy is not None
        return self.web.url.replace(self.web.server.address, self.proxy.url_host)


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=BENCH.CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def _open(browser: Any, url: str, video: str = "webcodecs") -> Any:
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.goto(url if video == "webcodecs" else f"{url}&video={video}")
    page.wait_for_function("window.rxstream.drawn > 30", timeout=30_000)
    assert page.evaluate("window.rxstream.video") == video
    return page


COUNTERS = "[rx.skipped, rx.keyframeRequests, rx.superseded, rx.drawn]".replace(
    "rx.", "window.rxstream."
)

DRAWN_GAP = """(after) => {
  const drawn = window.rxstream.trace.filter((e) => e.drawn > after).map((e) => e.drawn);
  let gap = 0;
  for (let i = 1; i < drawn.length; i++) gap = Math.max(gap, drawn[i] - drawn[i - 1]);
  return gap;
}"""
"""The longest time between two frames drawn after ``after`` (the page's clock, ms)."""

DECODED_SINCE = """(after) => window.rxstream.trace.filter((e) => e.arrived > after)
  .map((e) => [e.seq, e.decoded !== undefined])"""
"""Each frame that arrived after ``after``: its seq and whether it was decoded."""


REPORTS_SINCE = """(after) => window.rxstream.shown.filter((r) => r.arrived > after)
  .map((r) => [r.seq, window.rxstream.trace.some(
    (e) => e.drawn !== undefined && e.decoded === r.decoded && e.seq >= r.seq)])"""
"""Each ``shown`` report sent for a frame that arrived after ``after``: its seq and whether it
carries the decode time of a frame drawn (that frame, or a newer one drawn in its place)."""


@pytest.mark.parametrize("video", ["webcodecs", "jpeg"])
def test_a_burst_after_a_hold_is_decoded_whole_and_only_the_newest_drawn(
    browser: Any, video: str
) -> None:
    """The proxy holds the server's bytes ~300 ms after a pointer move, then releases them at
    once (three times): every frame of each burst is decoded, none skipped, no keyframe asked
    for (a frame the server did not send while its link held is counted there and leaves no
    hole in the decoder's references), the older ones closed undrawn, the move's report is the
    drawn frame's, and the longest gap between drawn frames is about the hold, far below the
    keyframe interval a skip would wait for (h264 over WebCodecs, and JPEG alike)."""
    hold_s = 0.3
    with Demo(grace_s=0.3) as session:
        assert session.proxy is not None
        page = _open(browser, session.url, video)
        skipped, asked, superseded, _ = page.evaluate(COUNTERS)
        start = page.evaluate("performance.now()")
        view = page.locator("#view").bounding_box()
        assert view is not None
        for x in (0.3, 0.7, 0.4):
            drawn = page.evaluate("window.rxstream.drawn")
            page.mouse.move(view["x"] + view["width"] * x, view["y"] + view["height"] * 0.5)
            session.proxy.hold(hold_s)  # the frames that show the move come in the burst
            page.wait_for_function(f"window.rxstream.drawn > {drawn} + 10", timeout=20_000)
        after = page.evaluate(COUNTERS)
        decoded = page.evaluate(DECODED_SINCE, start)
        gap = page.evaluate(DRAWN_GAP, start)
        assert after[0] == skipped, "frames of a burst were skipped"
        assert after[1] == asked, "a keyframe was asked for"
        assert after[2] > superseded, "no frame of a burst was decoded and left undrawn"
        settled = decoded[:-3]  # the newest may still be in the decoder
        assert len(settled) > 3 * 5, decoded
        assert all(done for _, done in settled), decoded
        seqs = [seq for seq, _ in decoded]
        assert seqs == sorted(seqs), "frames arrived out of order"
        missing = set(range(seqs[0], seqs[-1] + 1)) - set(seqs)  # latency first: not sent
        assert len(missing) <= session.web.dropped, ("frames went missing unsaid", missing)
        reports = page.evaluate(REPORTS_SINCE, start)
        assert reports, "no move was reported"
        assert all(reported for _, reported in reports), reports  # of a drawn frame, its times
        page.wait_for_function(  # and the server joined each to its input's record
            f"window.rxstream.shown.filter((r) => r.arrived > {start})"
            ".every((r) => window.rxstream.photon[`video#${r.input_seq}`])",
            timeout=20_000,
        )
        assert hold_s * 1000 * 0.5 < gap < hold_s * 1000 + KEYFRAME_INTERVAL_MS / 2, gap
        assert page.evaluate("window.rxstream.errors") == []
        page.close()
        session.thread.join(15)
        assert session.error is None


def test_an_outage_within_the_grace_resumes_the_same_session(browser: Any) -> None:
    """The link is cut (both sides closed, new connections refused for 3 s): the page shows
    "reconnecting…", then frames again on the same page object, the same run (frame seq goes
    on), the doc as it was; an input after the outage steers the pipeline."""
    with capture_timing() as captured, Demo(grace_s=5.0) as session:
        assert session.proxy is not None
        page = _open(browser, session.url)
        page.evaluate("window.__marker = 'before the outage'")
        page.locator('input[data-path="spot"]').fill("0.5")
        wait_for(lambda: session.ctx.control.desired.spot.value == 0.5, "spot to be set")
        seq = page.evaluate("window.rxstream.lastHeader.seq")
        inputs = page.evaluate("window.rxstream.lastInputSeq")

        session.proxy.cut(refuse_s=3.0)
        page.wait_for_function(
            "document.getElementById('state').textContent === 'reconnecting…'", timeout=10_000
        )
        assert page.evaluate("window.rxstream.link") == "reconnecting"
        page.wait_for_function(
            "window.rxstream.reconnects === 1 && window.rxstream.link === 'attached'",
            timeout=20_000,
        )
        drawn = page.evaluate("window.rxstream.drawn")
        page.wait_for_function(f"window.rxstream.drawn > {drawn} + 10", timeout=20_000)

        assert page.evaluate("window.__marker") == "before the outage"  # no reload
        assert page.locator("#state").text_content() == "attached"
        assert session.thread.is_alive()  # the same run
        assert session.web.attached == 2
        assert page.evaluate("window.rxstream.lastHeader.seq") > seq + 10
        assert page.locator('input[data-path="spot"]').input_value() == "0.5"
        assert session.ctx.control.desired.spot.value == 0.5

        view = page.locator("#view").bounding_box()
        assert view is not None
        page.mouse.move(view["x"] + view["width"] * 0.7, view["y"] + view["height"] * 0.6)
        after = page.wait_for_function(
            f"window.rxstream.lastInputSeq > {inputs} && window.rxstream.lastInputSeq"
        ).json_value()
        wait_for(lambda: [r for r in captured if r.input_seq == after], "the input's record")
        page.wait_for_function(
            f"window.rxstream.timing.some((r) => r.input_seq === {after})", timeout=20_000
        )
        assert page.evaluate("window.rxstream.errors") == []
        page.close()
        session.thread.join(20)
        assert not session.thread.is_alive()
        assert session.error is None


def test_an_outage_past_the_grace_ends_with_a_clear_message(browser: Any) -> None:
    """A cut longer than the grace: the run stops, and the page says the session ended, how
    long the link may be down, and to reload."""
    with Demo(grace_s=1.0) as session:
        assert session.proxy is not None
        page = _open(browser, session.url)
        session.proxy.cut(refuse_s=30.0)
        page.wait_for_function("window.rxstream.link === 'reconnecting'", timeout=10_000)
        session.thread.join(20)
        assert not session.thread.is_alive(), "the run went on past the grace"
        assert session.error is None
        page.wait_for_function("window.rxstream.link === 'ended'", timeout=30_000)
        assert page.locator("#state").text_content() == (
            "the session ended: the link was down longer than 1 s; reload to start again"
        )
        assert page.evaluate("window.rxstream.closed") is True
        page.close()


def test_a_half_open_link_is_dropped_by_the_server_and_the_page_moves_on(browser: Any) -> None:
    """The proxy stops forwarding without closing: the page, hearing nothing, shows
    "reconnecting…" and resumes on a new socket; the server drops the silent one after its
    bound (no pong: the connection is cut), so it never waits on it for ever."""
    with Demo(grace_s=0.3) as session:
        assert session.proxy is not None
        page = _open(browser, session.url)
        stalled = session.proxy.stall()
        page.wait_for_function("window.rxstream.link === 'reconnecting'", timeout=10_000)
        page.wait_for_function(
            "window.rxstream.reconnects === 1 && window.rxstream.link === 'attached'",
            timeout=20_000,
        )
        assert stalled.server_closed.wait(20), "the server kept the silent connection"
        wait_for(lambda: session.web.pages == 1, "the server to hold just the new socket")
        drawn = page.evaluate("window.rxstream.drawn")
        page.wait_for_function(f"window.rxstream.drawn > {drawn} + 10", timeout=20_000)
        page.close()
        session.thread.join(15)
        assert session.error is None
