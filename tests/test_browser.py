"""The demo's live page in headless Chromium (Playwright): frames, pointer, slider, prompt, close;
mouse-to-photon measured on the page against the photon_ms the session logs.

Runs where Debian's chromium is installed (``.ci/run`` installs it) and skips, saying so,
elsewhere. A screenshot of the page is kept in ``out/test-artifacts/web_session.png``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import structlog
from _serving import photon_bench

import rxstream
from rxstream.testing import capture_timing
from rxstream.timing import TimingRecord, configure_logging, load
from rxstream.transport import WebTransport

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = ROOT / "out" / "test-artifacts"

if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


BENCH = photon_bench()
CHROMIUM_ARGS: list[str] = BENCH.CHROMIUM_ARGS
load_demo: Callable[[], ModuleType] = BENCH.load_demo
"""examples/demo.py as a module (the bench's loader: one copy)."""
wait_for: Callable[..., Any] = BENCH.wait_for
"""Poll a check until it returns something truthy; fail naming what (the bench's)."""


class DemoSession:
    """The demo app's ``main`` on a WebTransport, in a thread with its own event loop."""

    def __init__(self) -> None:
        self.web = WebTransport(port=0, grace_s=0.3)
        self.ctx = rxstream.Context(transport=self.web)
        self.demo = load_demo()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self.demo.main(self.ctx))
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> DemoSession:
        self.thread.start()
        wait_for(lambda: self.web.bound_port, "the server to listen")
        return self

    def __exit__(self, *exc: object) -> None:
        self.web.protocol.opened = False
        self.thread.join(10)


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def test_live_page_pointer_slider_prompt_and_close(browser: Any) -> None:
    """The page plays the demo, feeds the pointer, edits the doc, steers, and ends the run."""
    records: list[TimingRecord] = []
    with capture_timing() as captured, DemoSession() as session:
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        errors: list[str] = []
        failed: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on(
            "response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None
        )
        page.goto(session.web.url)

        # frames arrive and change over time
        page.wait_for_function("window.rxstream.frames > 10", timeout=20_000)
        view = page.locator("#view")
        first = view.screenshot()
        page.wait_for_function("window.rxstream.frames > 20", timeout=20_000)
        assert view.screenshot() != first
        codec = page.evaluate("window.rxstream.codec")
        assert codec in ("h264", "jpeg")

        # the picture at an integer multiple of the frame's size; the timing panel's legend,
        # and its hint until the first record
        assert page.evaluate(
            "(() => { const c = document.getElementById('canvas');"
            " const w = parseFloat(c.style.width); return w >= c.width && w % c.width === 0; })()"
        )
        legend = page.locator("#legend").text_content() or ""
        assert all(word in legend for word in ("wait", "hold", "compute", "client"))
        assert page.locator("#timing-hint").is_visible()

        # each slider shows its default exactly: its step puts the value on its grid (a range
        # input snaps its value to min + k * step: spot's 0.1 in [0.02, 1] read 0.0984 before)
        assert page.evaluate(
            "['speed', 'spot'].map((p) => document.querySelector(`input[data-path=\"${p}\"]`)"
            ".value)"
        ) == ["1", "0.1"]

        # doc changes made elsewhere show on the page: a slider and its label, the prompt box
        session.ctx.control.set(speed=2.0, prompt="a quiet forest")
        page.wait_for_function(
            "document.querySelector('input[data-path=\"speed\"]').value === '2'"
            " && document.querySelector('input[data-path=\"speed\"] + output').textContent"
            " === '2' && document.getElementById('prompt').value === 'a quiet forest'",
            timeout=20_000,
        )

        # one pointer move: its input_seq comes back in a [timing:video] record
        box = view.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * 0.8, box["y"] + box["height"] * 0.3)
        seq = page.wait_for_function(
            "window.rxstream.lastInputSeq || false", timeout=20_000
        ).json_value()
        page.wait_for_function(
            f"window.rxstream.timing.some((r) => r.input_seq === {seq})", timeout=20_000
        )
        wait_for(lambda: [r for r in captured if r.input_seq == seq], "the record")
        assert page.locator("#timing-hint").is_hidden()
        assert session.ctx.control.snapshot()["autopilot"] is False

        # the spot slider (a doc.set) changes the frames: a bigger light, a brighter picture
        before = page.evaluate("window.rxstream.brightness()")
        page.locator('input[data-path="spot"]').fill("1")
        wait_for(lambda: session.ctx.control.desired.spot.value == 1.0, "spot to be set")
        page.wait_for_function(f"window.rxstream.brightness() > {before} + 20", timeout=20_000)

        # a prompt change is a steer: the next frame is a cutover
        cutovers = page.evaluate("window.rxstream.cutovers")
        page.locator("#prompt").fill("a storm over the mountains")
        page.locator("#prompt").press("Enter")
        page.wait_for_function(f"window.rxstream.cutovers > {cutovers}", timeout=20_000)
        assert session.ctx.control.desired.prompt.value == "a storm over the mountains"
        wait_for(lambda: [r for r in captured if r.cutover], "a cutover record")
        page.wait_for_function(  # the steer's row says so
            "[...document.querySelectorAll('#timing tbody tr')]"
            ".some((row) => row.children[3].textContent === 'steer')",
            timeout=20_000,
        )

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web_session.png"))
        assert page.evaluate("window.rxstream.errors") == []
        assert errors == []
        assert failed == []  # no 404 (the favicon is inline)

        # closing the page ends run()
        page.close()
        session.thread.join(15)
        assert not session.thread.is_alive(), "run() still going after the page closed"
        assert session.error is None
        records = list(captured)
    assert (ARTIFACTS / "web_session.png").stat().st_size > 10_000
    assert records


def test_thirty_moves_photon_ms_matches_the_screen(browser: Any, tmp_path: Path) -> None:
    """30 pointer jumps, WebCodecs: each logged photon_ms is within 15 ms of the page's own,
    and the page's trace of each shown frame has every step, adding up to its report."""
    bench = BENCH
    log = tmp_path / "timing.jsonl"
    saved = structlog.get_config()
    configure_logging(log)
    try:
        with DemoSession() as session:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.goto(session.web.url)
            page.wait_for_function("window.rxstream.frames > 30", timeout=20_000)
            assert page.evaluate("window.rxstream.video") == "webcodecs"
            assert page.locator("#video-path").text_content() == "video: WebCodecs h264"
            moves = bench.measure_moves(page, 30)
            bench.traced(page, moves)
            keys = json.dumps([f"video#{move['input_seq']}" for move in moves])
            page.wait_for_function(
                f"{keys}.every((key) => window.rxstream.photon[key])", timeout=20_000
            )
            assert page.evaluate("window.rxstream.errors") == []
            page.close()
            session.thread.join(15)
            assert session.error is None
    finally:
        configure_logging()
        structlog.reset_defaults()
        structlog.configure(**saved)
    assert not [line for line in console if line.startswith("error")], console
    records = {r.input_seq: r for r in load(log, stream="video").records}
    for move in moves:
        record = records[move["input_seq"]]
        assert record.client is not None, move
        assert record.client.video == "webcodecs"
        assert record.photon_ms is not None
        assert abs(record.photon_ms - move["page_ms"]) <= 15, (move, record.client)
        # the page's trace splits the reported decode + present into its steps, in order
        steps = move["steps"]
        assert set(steps) == set(bench.STEPS), move
        assert min(steps.values()) >= 0, move
        reported = record.client.decode_ms + record.client.present_ms
        assert sum(steps.values()) == pytest.approx(reported, abs=0.01), (move, record.client)


LIT_AT = """([x, y]) => {
  const c = document.getElementById("canvas");
  const [px, py] = [Math.floor(x * c.width), Math.floor(y * c.height)];
  const d = c.getContext("2d").getImageData(px, py, 1, 1).data;
  return Math.min(d[0], d[1], d[2]) > 180;
}"""
"""Whether the canvas shows the light (white) at ``(x, y)`` in 0..1."""


def test_where_the_pointer_stops_is_sent_even_within_8_ms(browser: Any) -> None:
    """Two pointer samples 0 ms apart: the second waits its 8 ms turn and is sent, not
    dropped, so the light goes where the pointer stopped."""
    with DemoSession() as session:
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.goto(session.web.url)
        page.wait_for_function("window.rxstream.frames > 30", timeout=20_000)
        before = page.evaluate("window.rxstream.lastInputSeq")
        page.evaluate(
            """() => {
              const c = document.getElementById("canvas");
              const b = c.getBoundingClientRect();
              for (const [x, y] of [[0.2, 0.3], [0.8, 0.7]]) {
                c.dispatchEvent(new PointerEvent(POINTER_EVENT, {
                  clientX: b.left + x * b.width, clientY: b.top + y * b.height, bubbles: true,
                }));
              }
            }"""
        )
        page.wait_for_function(f"window.rxstream.lastInputSeq >= {before} + 2", timeout=20_000)
        page.wait_for_function(LIT_AT, arg=[0.8, 0.7], timeout=20_000)
        assert page.evaluate(LIT_AT, [0.2, 0.3]) is False
        page.close()
        session.thread.join(15)


def test_a_gap_in_seq_is_skipped_and_a_decoder_error_recovers(browser: Any) -> None:
    """A delta whose reference is missing (a gap in seq, as after a frame dropped at the
    server) is skipped, not decoded, and the page asks for a keyframe; a broken access unit
    fails the decoder: the page asks for a keyframe too; either way it draws on."""
    with DemoSession() as session:
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.goto(session.web.url)
        page.wait_for_function("window.rxstream.drawn > 10", timeout=20_000)

        # the page last saw a frame one before the one it did: the next one follows a gap
        skipped, asked = page.evaluate(
            "[window.rxstream.skipped, window.rxstream.keyframeRequests]"
        )
        page.evaluate("wc.lastSeq -= 1")
        page.wait_for_function(
            f"window.rxstream.skipped > {skipped} && window.rxstream.keyframeRequests > {asked}",
            timeout=20_000,
        )
        drawn = page.evaluate("window.rxstream.drawn")
        page.wait_for_function(f"window.rxstream.drawn > {drawn} + 10", timeout=20_000)

        # a decoder error
        asked = page.evaluate("window.rxstream.keyframeRequests")
        page.evaluate(  # a slice NAL that is garbage: the decoder's error callback runs
            "wc.decoder.decode(new EncodedVideoChunk({type: 'delta', timestamp: 1e9,"
            " data: new Uint8Array([0, 0, 0, 5, 0x65, 1, 2, 3, 4])}))"
        )
        page.wait_for_function(
            "window.rxstream.errors.some((e) => e.code === 'decoder')", timeout=20_000
        )
        drawn = page.evaluate("window.rxstream.drawn")
        assert page.evaluate("window.rxstream.keyframeRequests") > asked
        page.wait_for_function(f"window.rxstream.drawn > {drawn} + 10", timeout=20_000)
        assert page.evaluate("wc.decoder.state") == "configured"
        assert page.evaluate("window.rxstream.video") == "webcodecs"
        page.close()
        session.thread.join(15)


def test_jpeg_where_webcodecs_or_the_codec_is_missing_and_mse_on_request(browser: Any) -> None:
    """No VideoDecoder, or one without h264: the page shows JPEG and says so; ?video=mse plays
    the fMP4 stream and says that; with ?legacy as the page before WebCodecs did (pointermove,
    no requestVideoFrameCallback)."""
    with DemoSession() as session:
        pages = {}
        for name, script, query in (
            ("no-webcodecs", "delete window.VideoDecoder;", ""),
            (
                "no-codec",
                "VideoDecoder.isConfigSupported = async () => ({ supported: false });",
                "",
            ),
            ("mse", "", "video=mse"),
            ("mse-legacy", "", "video=mse&legacy"),
        ):
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            if script:
                page.add_init_script(script)
            url = session.web.url
            page.goto(f"{url}{'&' if '?' in url else '?'}{query}" if query else url)
            pages[name] = page
        for name, label, codec in (
            ("no-webcodecs", "video: JPEG", "jpeg"),
            ("no-codec", "video: JPEG", "jpeg"),
            ("mse", "video: MSE h264 (buffered)", "h264"),
            ("mse-legacy", "video: MSE h264 (buffered)", "h264"),
        ):
            page = pages[name]
            page.wait_for_function("window.rxstream.frames > 30", timeout=20_000)
            assert page.locator("#video-path").text_content() == label, name
            assert page.evaluate("window.rxstream.lastHeader.codec") == codec, name
            assert page.evaluate("window.rxstream.errors") == [], name
        watching = {
            name: page.evaluate("[h264.watching, POINTER_EVENT]") for name, page in pages.items()
        }
        assert watching["mse"] == [True, "pointerrawupdate"]
        assert watching["mse-legacy"] == [False, "pointermove"]
        for page in pages.values():
            page.close()
        session.thread.join(15)


def test_the_page_acknowledges_each_frame_and_the_server_knows_its_link(browser: Any) -> None:
    """The real page sends a ``got`` for every frame it receives: the server's link estimate
    of it has a round trip and a delivery rate, and, the page warm, nothing is left in flight
    for long (no frame forgotten unacknowledged over two seconds' more acks)."""
    with DemoSession() as session:
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.goto(session.web.url)
        page.wait_for_function("window.rxstream.frames > 30", timeout=20_000)
        wait_for(lambda: session.web.pages_now(), "the page to attach")
        (state,) = session.web.pages_now()
        wait_for(lambda: state.estimate.acks >= 30, "the page's frame acks")
        link = state.link_state()
        assert link.min_rtt_ms is not None
        assert link.rtt_ms is not None
        assert link.delivery_bps is not None
        warm, forgotten = state.estimate.acks, state.estimate.forgotten
        wait_for(lambda: state.estimate.acks >= warm + 48, "two seconds' more acks")
        assert state.estimate.forgotten == forgotten
        page.close()
        session.thread.join(15)
