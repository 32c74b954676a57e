"""Mouse-to-photon on the live page: WebCodecs, JPEG and MSE side by side, in one run.

The demo app (examples/demo.py) is served by a ``WebTransport`` and opened in headless Debian
chromium (Playwright) on one session, per video path: ``?video=webcodecs``, ``jpeg``, ``mse``
(today's page on the buffered path: it reports through ``requestVideoFrameCallback``) and
``mse-legacy`` (``?video=mse&legacy``: the MSE page as users had it before WebCodecs, fed from
``pointermove`` and without ``requestVideoFrameCallback``, which changes how the ``<video>``
presents; what issue 14 measured). ``--rounds`` times each path gets a page of its own, in an
order rotated each round, and jumps its share of ``--moves`` after ``--settle-s`` seconds (a
page load stalls the shared cores, and the path that came first would pay it alone). On each
page the pointer jumps between the four corners of a square over the picture, each jump waiting
for the last to show, then 60 ms and a part of a frame period (the parts spread evenly over the
period, the same on every path, so that jumps land at every phase of the demo's 24 fps tick).
The page measures each jump on its own side: from the pointer event (``event.timeStamp``) to
the first rendering update (``requestAnimationFrame``) whose displayed pixels show the light at
the new spot (read back from the canvas, or from the ``<video>`` element drawn into a canvas).
Beside it: the server's ``total_ms`` of the same inputs and the ``photon_ms`` the session
logged for them (the page's report joined to the record, ``[photon:video]``), on screen minus
``total_ms`` move by move (the page's part, whatever the server's time did meanwhile), the p50s
of the page's steps (``rxstream.trace``), on MSE how far the ``<video>`` played behind its
newest frame, and what each path's pages did with their frames (drawn, superseded, skipped,
keyframes asked for).

Targets (issue 14): WebCodecs on-screen p50 <= server ``total_ms`` p50 + 15 ms, and <= 0.5x
the MSE path's on-screen p50 (``mse-legacy``'s; today's ``mse`` beside it).

Run ``python bench/photon.py`` (about two minutes; needs chromium and playwright).

``--net SPEC`` (repeatable; root) measures a remote visitor instead: the demo over HTTPS in the
network emulator's server namespace, the default page in the client's, one row per link beside
loopback and a clean link (bench/_photon_net.py; SPEC: bench/_net/_spec.py), e.g.
``sudo python bench/photon.py --net rtt=40ms --net rtt=40ms,loss=3%`` (about a minute a link).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import math
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))

import rxstream  # noqa: E402
from rxstream.timing import TimingRecord, configure_logging, load  # noqa: E402
from rxstream.transport import WebTransport  # noqa: E402

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PATHS = ("webcodecs", "jpeg", "mse", "mse-legacy")
QUERIES = {path: f"video={path}" for path in PATHS} | {"mse-legacy": "video=mse&legacy"}
"""The page's query per path: ``mse-legacy`` is the MSE page as users had it before WebCodecs
(``pointermove``, no ``requestVideoFrameCallback``): what issue 14 measured, the target's
comparison."""
PERIOD_MS = 1000 / 24
"""The demo's frame period: its clock ticks and its pace both run at 24 fps."""
CORNERS = ((0.2, 0.3), (0.8, 0.7), (0.8, 0.3), (0.2, 0.7))

PROBE_JS = """
(() => {
  if (window.__probe) return;
  const probe = window.__probe = { pending: null, results: [], reads: 0 };
  const canvas = document.getElementById("canvas");
  const video = document.getElementById("video");
  const copy = document.createElement("canvas");
  const copy2d = copy.getContext("2d", { willReadFrequently: true });
  function pixel(x, y) {  // the displayed picture's pixel at (x, y) in 0..1, as [r, g, b]
    if (video.style.display === "block") {
      if (!video.videoWidth) return null;
      copy.width = video.videoWidth; copy.height = video.videoHeight;
      copy2d.drawImage(video, 0, 0);
      const [cx, cy] = [Math.floor(x * copy.width), Math.floor(y * copy.height)];
      return copy2d.getImageData(cx, cy, 1, 1).data;
    }
    const c = canvas.getContext("2d");
    return c.getImageData(Math.floor(x * canvas.width), Math.floor(y * canvas.height), 1, 1).data;
  }
  const kind = "onpointerrawupdate" in window ? "pointerrawupdate" : "pointermove";
  document.addEventListener(kind, (e) => {
    const shown = video.style.display === "block" ? video : canvas;
    const box = shown.getBoundingClientRect();
    probe.pending = {
      event: e.timeStamp,
      x: (e.clientX - box.left) / box.width,
      y: (e.clientY - box.top) / box.height,
    };
  }, true);
  function tick(frame) {
    const p = probe.pending;
    if (p) {
      probe.reads += 1;
      const px = pixel(p.x, p.y);
      if (px && Math.min(px[0], px[1], px[2]) > 180) {  // the light (white) is there now
        const seen = performance.now();
        const result = { event: p.event, seen, ms: seen - p.event, frame };
        const ranges = video.buffered;  // MSE: how far the <video> plays behind its newest frame
        if (video.style.display === "block" && ranges.length) {
          result.lag = 1000 * (ranges.end(ranges.length - 1) - video.currentTime);
        }
        probe.results.push(result);
        probe.pending = null;
      }
    }
    requestAnimationFrame(tick);
  }
  requestAnimationFrame(tick);
})();
"""


COUNTS_JS = """({
  received: window.rxstream.frames, drawn: window.rxstream.drawn,
  superseded: window.rxstream.superseded || 0, skipped: window.rxstream.skipped,
  keyframe_requests: window.rxstream.keyframeRequests,
  errors: window.rxstream.errors.length,
})"""
"""What a page did with the frames it received, over its whole visit (load and settle too)."""


CADENCE_JS = """
(() => {
  const net = window.__net = { bytes: 0, on: false, shown: [] };
  const Native = window.WebSocket;  // count what the page's socket receives
  const count = (e) => {
    const d = e.data;
    net.bytes += typeof d === "string" ? d.length : (d.byteLength ?? d.size ?? 0);
  };
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", count);
    }
  };
  const Peer = window.RTCPeerConnection;  // and its data channels (the WebRTC wire)
  if (Peer) {
    const open = Peer.prototype.createDataChannel;
    Peer.prototype.createDataChannel = function (...args) {
      const channel = open.apply(this, args);
      channel.addEventListener("message", count);
      return channel;
    };
  }
  let last = null;
  function tick() {  // a rendering update that shows a newly drawn frame
    const rx = window.rxstream;
    if (rx && net.on && rx.drawn !== last) {
      if (last !== null) net.shown.push(performance.now());
      last = rx.drawn;
    }
    requestAnimationFrame(tick);
  }
  requestAnimationFrame(tick);
})();
"""
"""Added before the page's own script (``--client``): the bytes its socket (and its data
channels) receive and the
rendering updates that show a new frame, once ``__net.on`` (the displayed frames' cadence)."""


def chromium() -> str | None:
    """Debian's chromium, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def load_demo() -> Any:
    """examples/demo.py as a module."""
    spec = importlib.util.spec_from_file_location("rxstream_demo_bench", ROOT / "examples/demo.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def wait_for(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class DemoServer:
    """The demo's ``main`` on a WebTransport in a thread (``run()`` until the page leaves)."""

    def __init__(self, grace_s: float = 5.0) -> None:
        self.web = WebTransport(port=0, grace_s=grace_s)
        self.ctx = rxstream.Context(transport=self.web)
        self.demo = load_demo()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self.demo.main(self.ctx))
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> DemoServer:
        self.thread.start()
        wait_for(lambda: self.web.bound_port, "the server to listen")
        return self

    def __exit__(self, *exc: object) -> None:
        self.web.protocol.opened = False
        self.thread.join(10)


def measure_moves(
    page: Any, moves: int, timeout_ms: int = 5_000, seed: int = 0
) -> list[dict[str, Any]]:
    """Jump the pointer ``moves`` times; per jump the page's on-screen ms and its input_seq.

    After a jump shows, the next waits 60 ms and a part of a frame period: the ``moves`` parts
    spread evenly over the period (one at random in each ``1/moves`` of it, in a shuffled
    order; ``seed`` picks them), so the jumps land at every phase of the demo's 24 fps tick,
    and every path given the same seed gets the same phases.
    """
    page.evaluate(PROBE_JS)
    shown = "#video" if page.evaluate("window.rxstream.video") == "mse" else "#canvas"
    box = page.locator(shown).bounding_box()
    assert box is not None
    out: list[dict[str, Any]] = []
    phases = random.Random(seed)
    spread = [(k + phases.random()) * PERIOD_MS / moves for k in range(moves)]
    phases.shuffle(spread)
    for index in range(moves):
        x, y = CORNERS[index % len(CORNERS)]
        before = page.evaluate("window.__probe.results.length")
        acked = page.evaluate("window.rxstream.lastInputSeq")
        page.mouse.move(box["x"] + box["width"] * x, box["y"] + box["height"] * y)
        page.wait_for_function(f"window.__probe.results.length > {before}", timeout=timeout_ms)
        seq = page.wait_for_function(
            f"window.rxstream.lastInputSeq > {acked} && window.rxstream.lastInputSeq",
            timeout=timeout_ms,
        ).json_value()
        result = page.evaluate("window.__probe.results[window.__probe.results.length - 1]")
        move = {"input_seq": int(seq), "page_ms": float(result["ms"])}
        move["seen_frame"] = result["frame"]  # the rendering update that showed it (its time)
        if result.get("lag") is not None:
            move["lag"] = float(result["lag"])
        out.append(move)
        # let the frame after settle, then this jump's part of a frame period (a fixed wait
        # after the last jump showed put each path's jumps at one phase of the tick, its own)
        page.wait_for_timeout(60 + spread[index])
    return out


def visit(
    url: str, pin: str | None, moves: int, settle_s: float, min_s: float = 0.0, max_s: float = 90.0
) -> dict[str, Any]:
    """One page at ``url`` (``--client``: run where the visitor is, e.g. in the emulator's
    client namespace): its path, ``moves`` pointer jumps (``measure_moves``, four at a time:
    more until ``min_s`` seconds have passed, fewer once ``max_s`` have, at least four), and
    over the jumps the displayed frames' cadence (longest stall, fps) and the bytes its
    socket got."""
    from playwright.sync_api import Error, sync_playwright

    executable = chromium()
    if executable is None:
        raise SystemExit("bench/photon.py needs chromium on PATH (apt-get install chromium)")
    args = [*CHROMIUM_ARGS] + ([f"--ignore-certificate-errors-spki-list={pin}"] if pin else [])
    out: dict[str, Any] = {"moves": [], "error": None}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=args)
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.add_init_script(CADENCE_JS)
        page.goto(url)
        page.wait_for_function("window.rxstream.frames > 30", timeout=60_000)
        page.wait_for_timeout(settle_s * 1000)
        out["path"] = page.evaluate("window.rxstream.showing")
        out["secure"] = page.evaluate("window.isSecureContext")
        out["wire"] = page.evaluate("window.rxstream.wire")
        start = page.evaluate("[(__net.on = true) && performance.now(), __net.bytes]")
        began, done = time.monotonic(), out["moves"]
        try:
            while True:
                elapsed = time.monotonic() - began
                if (len(done) >= moves and elapsed >= min_s) or (done and elapsed >= max_s):
                    break
                done.extend(measure_moves(page, 4, timeout_ms=30_000, seed=len(done)))
            last = f"window.rxstream.photon['video#{done[-1]['input_seq']}']"
            page.wait_for_function(f"{last} !== undefined", timeout=10_000)
        except Error as exc:
            out["error"] = str(exc).splitlines()[0]
        end = page.evaluate("[performance.now(), __net.bytes, __net.shown]")
        out["frames"] = page.evaluate(COUNTS_JS)
        page.close()
        browser.close()
    shown = [start[0], *end[2], end[0]]
    out["seconds"] = (end[0] - start[0]) / 1000
    out["stall_ms"] = max(b - a for a, b in itertools.pairwise(shown))
    out["fps"] = len(end[2]) / out["seconds"]
    out["bytes_per_s"] = (end[1] - start[1]) / out["seconds"]
    return out


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation, numpy's default."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


STEPS = ("parse", "queue", "decoder", "draw", "raf")
"""The page's steps between a frame's arrival and its presentation (``rxstream.trace``):
``parse`` arrived -> parsed (the header read), ``queue`` parsed -> submitted (handed to the
decoder), ``decoder`` submitted -> decoded (its output; on MSE the media buffer too),
``draw`` decoded -> drawn (on the canvas), ``raf`` drawn -> presented (the next rendering
update's callback)."""
_EDGES = {
    "parse": ("arrived", "parsed"),
    "queue": ("parsed", "submitted"),
    "decoder": ("submitted", "decoded"),
    "draw": ("decoded", "drawn"),
    "raf": ("drawn", "presented"),
}


def traced(page: Any, moves: list[dict[str, Any]]) -> None:
    """Add to each move the page's steps of the frame that showed it (``rxstream.trace``)."""
    entries = page.evaluate("window.rxstream.trace.filter((e) => e.presented !== undefined)")
    first: dict[int, dict[str, Any]] = {}
    for entry in entries:  # the first presented frame of each input is the one reported
        first.setdefault(int(entry["input_seq"]), entry)
    for move in moves:
        entry = first.get(move["input_seq"])
        if entry is None:
            continue
        move["reported_frame"] = entry.get("frame")  # the report's rendering update (its time)
        move["steps"] = {
            step: entry[b] - entry[a]
            for step, (a, b) in _EDGES.items()
            if entry.get(a) is not None and entry.get(b) is not None
        }


def run(moves: int, log: Path, rounds: int = 3, settle_s: float = 3.0) -> dict[str, Any]:
    """Measure every path in one session; the per-path rows and the raw moves.

    ``rounds`` visits of every path, the order rotated each round (so no path always meets
    the server just after the start, or just after another path's page loaded); each visit
    lets the session settle ``settle_s`` after the page's first frames, then jumps its share
    of ``moves``.
    """
    from playwright.sync_api import sync_playwright

    executable = chromium()
    if executable is None:
        raise SystemExit("bench/photon.py needs chromium on PATH (apt-get install chromium)")
    configure_logging(log)
    measured: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
    used: dict[str, str] = {}
    frames: dict[str, dict[str, int]] = {path: {} for path in PATHS}
    with sync_playwright() as playwright, DemoServer() as server:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        for round_ in range(rounds):
            for path in PATHS[round_ % len(PATHS) :] + PATHS[: round_ % len(PATHS)]:
                share = moves // rounds + (1 if round_ < moves % rounds else 0)
                if share == 0:
                    continue
                url = server.web.url  # it may carry a query (a session token) already
                page.goto(f"{url}{'&' if '?' in url else '?'}{QUERIES[path]}")
                page.wait_for_function("window.rxstream.frames > 30", timeout=20_000)
                page.wait_for_timeout(settle_s * 1000)  # the page load's stall drains
                used[path] = page.evaluate("window.rxstream.showing")
                batch = measure_moves(page, share, seed=round_)  # each path the same phases
                if path != "mse-legacy":  # the old page sends no reports
                    last = f"window.rxstream.photon['video#{batch[-1]['input_seq']}']"
                    page.wait_for_function(f"{last} !== undefined", timeout=5_000)
                traced(page, batch)
                measured[path].extend(batch)
                counts = page.evaluate(COUNTS_JS)
                for key, value in counts.items():
                    frames[path][key] = frames[path].get(key, 0) + value
        page.wait_for_timeout(500)  # the last reports come back
        page.close()
        browser.close()
    configure_logging()
    records = {r.input_seq: r for r in load(log, stream="video").records}
    rows = _rows(measured, records)
    return {"moves": measured, "paths": used, "rows": rows, "frames": frames}


CLIENT_HOPS = ("up", "net", "decode", "present")
"""The client hops of a record's page part (``ClientTiming``), as the table prints them."""


HELD_BY = ("window", "pace")
"""The demo's stages that hold an item: ``window`` until the clock's next 1/24 s tick closes
it, ``pace`` until its output slot."""


def half_bound(wc: dict[str, float], legacy: dict[str, float]) -> str:
    """What WebCodecs on screen <= 0.5x the old MSE page's asks of the server, from the run.

    Both paths share the server (the same demo); each adds its page's part: w (WebCodecs) and
    m (the old MSE page), each the median of a path's on screen minus the same move's
    ``total_ms``. With one server time T for both, T + w <= (T + m) / 2 holds only while
    T <= m - 2w: an estimate (a median of sums is not the sum of medians). A jump made at a
    random moment waits for the demo's 24 fps tick, half a period (20.8 ms) at p50 on a steady
    grid, before any work is done.
    """
    need = legacy["beyond_p50"] - 2 * wc["beyond_p50"]
    tick, total = wc["window_hold_p50"], wc["total_p50"]
    if math.isnan(need) or math.isnan(tick) or math.isnan(total):
        return "half the old MSE page: unknown in this run (a path's records or holds missing)"
    verdicts = (
        f"WebCodecs' total_ms p50 {'is within it' if total <= need else 'is past it'}; "
        f"the tick wait alone {'is within it' if tick <= need else 'is past it'}"
    )
    return (
        f"half the old MSE page asks total_ms p50 <= m - 2w = {legacy['beyond_p50']:.1f} - 2 x "
        f"{wc['beyond_p50']:.1f} = {need:.1f} ms (an estimate from medians; the page's part, "
        f"move by move: m the old MSE page's, w WebCodecs'); WebCodecs' total_ms p50 is "
        f"{total:.1f}, of which the wait for the 24 fps tick (window hold p50) {tick:.1f} (half "
        f"a period: {PERIOD_MS / 2:.1f}) and the pace's hold p50 {wc['pace_hold_p50']:.1f}: "
        f"{verdicts}"
    )


def _rows(
    measured: dict[str, list[dict[str, Any]]], records: dict[int, TimingRecord]
) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for path, moves in measured.items():
        page = [m["page_ms"] for m in moves]
        total = [records[m["input_seq"]].total_ms for m in moves if m["input_seq"] in records]
        photon = [
            p
            for m in moves
            if m["input_seq"] in records and (p := records[m["input_seq"]].photon_ms) is not None
        ]
        apart = [
            abs(p - m["page_ms"])
            for m in moves
            if m["input_seq"] in records and (p := records[m["input_seq"]].photon_ms) is not None
        ]
        rows[path] = {
            "moves": len(moves),
            "screen_p50": percentile(page, 50),
            "screen_p95": percentile(page, 95),
            "total_p50": percentile(total, 50) if total else float("nan"),
            "total_p95": percentile(total, 95) if total else float("nan"),
            "photon_p50": percentile(photon, 50) if photon else float("nan"),
            "photon_n": len(photon),
            "apart_max": max(apart) if apart else float("nan"),
        }
        beyond = [
            m["page_ms"] - records[m["input_seq"]].total_ms
            for m in moves
            if m["input_seq"] in records
        ]
        rows[path]["beyond_p50"] = percentile(beyond, 50) if beyond else float("nan")
        for stage in HELD_BY:  # the server's held part: the tick's wait, the pace's slot
            held = [
                hop.hold_ms
                for m in moves
                if m["input_seq"] in records
                for hop in records[m["input_seq"]].hops
                if hop.name == stage
            ]
            rows[path][f"{stage}_hold_p50"] = percentile(held, 50) if held else float("nan")
        for step in STEPS:
            values = [m["steps"][step] for m in moves if step in m.get("steps", {})]
            rows[path][f"{step}_step_p50"] = percentile(values, 50) if values else float("nan")
        lags = [m["lag"] for m in moves if "lag" in m]
        rows[path]["lag_p50"] = percentile(lags, 50) if lags else float("nan")
        clients = [
            c for m in moves if m["input_seq"] in records and (c := records[m["input_seq"]].client)
        ]
        for hop in CLIENT_HOPS:
            values = [v for c in clients if (v := getattr(c, f"{hop}_ms")) is not None]
            rows[path][f"{hop}_p50"] = percentile(values, 50) if values else float("nan")
    return rows


def per_path(title: str, rows: dict[str, dict[str, float]], fields: list[tuple[str, str]]) -> str:
    """``title`` then, per path, each ``(name, key)`` of ``fields`` as ``name value``."""
    return title + "; ".join(
        f"{path} " + " ".join(f"{name} {row[key]:.1f}" for name, key in fields)
        for path, row in rows.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--moves",
        type=int,
        help="pointer jumps per path (default 30; with --net, 100 per link: a p50 steady "
        "against where the jumps land on the demo's 24 Hz tick)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="visits of every path, rotated")
    parser.add_argument(
        "--settle-s", type=float, default=3.0, help="seconds after a page loads before it jumps"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--net",
        action="append",
        metavar="SPEC",
        help="a remote visitor through the network emulator with this link (repeatable; "
        "bench/_net/_spec.py), beside loopback and a clean link: needs root",
    )
    parser.add_argument(
        "--wire",
        choices=("ws", "webrtc", "both"),
        default="ws",
        help="with --net: the page's wire (?wire=): the WebSocket, WebRTC, or both side by side "
        "(a row per link and wire)",
    )
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)  # one --net visit
    parser.add_argument("--pin", help=argparse.SUPPRESS)
    parser.add_argument("--min-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--max-s",
        type=float,
        default=90.0,
        help="with --net: stop jumping on a link after this many seconds (at least 4 jumps)",
    )
    args = parser.parse_args()
    if args.moves is None:
        args.moves = 100 if args.net or args.client else 30
    if args.client:
        print(
            json.dumps(
                visit(args.client, args.pin, args.moves, args.settle_s, args.min_s, args.max_s)
            )
        )
        return
    from _report import revision  # the bench folder is the script's, first on sys.path

    if args.net:
        import _photon_net

        wires = ("ws", "webrtc") if args.wire == "both" else (args.wire,)
        _photon_net.main(
            args.net, args.moves, args.settle_s, args.max_s, percentile, revision(), wires
        )
        return

    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.moves, Path(tmp) / "timing.jsonl", args.rounds, args.settle_s)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    rows = result["rows"]
    print(
        f"mouse-to-photon, {args.moves} pointer jumps per path in {args.rounds} rotated rounds,"
        f" {args.settle_s:g} s settle after each page load (ms)"
    )
    print(
        f"{'path':<10} {'on screen p50':>13} {'p95':>6}  {'server total_ms p50':>19} {'p95':>6}"
        f"  {'logged photon_ms p50':>20} {'(n)':>5} {'|photon - screen| max':>22}"
    )
    for path, row in rows.items():
        print(
            f"{path:<10} {row['screen_p50']:13.1f} {row['screen_p95']:6.1f}  "
            f"{row['total_p50']:19.1f} {row['total_p95']:6.1f}  {row['photon_p50']:20.1f} "
            f"{row['photon_n']:5d} {row['apart_max']:22.1f}"
        )
    print(per_path("the page's part, p50: ", rows, [(hop, hop + "_p50") for hop in CLIENT_HOPS]))
    print(
        "on screen minus the same move's total_ms, p50 (the page's part, move by move): "
        + "; ".join(f"{path} {row['beyond_p50']:.1f}" for path, row in rows.items())
    )
    print(
        per_path(
            "the page's steps, p50 (rxstream.trace; arrived->parsed->submitted->decoded->drawn->"
            "presented): ",
            rows,
            [(step, step + "_step_p50") for step in STEPS],
        )
    )
    print(
        "the <video>'s media lag when the light showed, p50: "
        + "; ".join(f"{path} {rows[path]['lag_p50']:.1f}" for path in ("mse", "mse-legacy"))
    )
    wc, legacy, mse = rows["webcodecs"], rows["mse-legacy"], rows["mse"]
    first = wc["screen_p50"] <= wc["total_p50"] + 15
    move_ok = wc["beyond_p50"] <= 15
    print(
        f"WebCodecs on screen p50 {wc['screen_p50']:.1f} <= total_ms p50 + 15 = "
        f"{wc['total_p50'] + 15:.1f}: {'yes' if first else 'NO'}"
        f" (move by move: {wc['beyond_p50']:.1f} <= 15: {'yes' if move_ok else 'NO'})"
    )
    for name, row in (("the old MSE page's (mse-legacy)", legacy), ("today's MSE page's", mse)):
        ok = wc["screen_p50"] <= 0.5 * row["screen_p50"]
        print(
            f"WebCodecs on screen p50 {wc['screen_p50']:.1f} <= 0.5 x {name} "
            f"{row['screen_p50']:.1f} = {0.5 * row['screen_p50']:.1f}: {'yes' if ok else 'NO'}"
            f" ({wc['screen_p50'] / row['screen_p50']:.2f}x)"
        )
    print(half_bound(wc, legacy))
    print(
        per_path(
            "the server's held part, p50 (window: the wait for the clock's tick; pace: for its "
            "slot): ",
            rows,
            [(stage, stage + "_hold_p50") for stage in HELD_BY],
        )
    )
    print(f"paths the page used: {result['paths']}")
    print(
        "the pages' frames, all visits (received, drawn, superseded by a newer one, skipped "
        "for a missing reference, keyframe requests, errors): "
        + "; ".join(
            f"{path} " + " ".join(str(count) for count in counts.values())
            for path, counts in result["frames"].items()
        )
    )
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {revision()}")


if __name__ == "__main__":
    main()
