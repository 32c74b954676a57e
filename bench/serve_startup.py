"""A visitor's click to first frame with ``rxstream serve`` (a warm worker) beside a cold
start (``rxstream run APP --serve`` started for them), interleaved round by round; then each
session's frame rate with one session alone and with two at once on the same server.

The visitor is scripted over real sockets (aiohttp: ``GET /`` with the server's token, the
redirected page, its socket, ``hello`` accepting jpeg): the click is that ``GET /`` for the
warm start, the command's start for the cold one; the first frame is the first binary
message on the page's socket.

    python bench/serve_startup.py [--app examples/demo.py] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _serve import Server, Visitor  # noqa: E402

SERVING = re.compile(r"serving the page at (\S+)$")


async def warm_once(server: Server) -> float:
    """Seconds from a visitor's ``GET /`` to their first frame, on a warm worker."""
    async with aiohttp.ClientSession() as http:
        visitor = await Visitor(http, server).open()
        await visitor.frames_until(1)
        took = visitor.first_frame_at - visitor.opened_at
        await visitor.close()
        async with asyncio.timeout(30):  # the worker free again
            while True:
                async with http.get(f"{server.base}/readyz") as ready:
                    if ready.status == 200:
                        return took
                await asyncio.sleep(0.05)


def cold_once(app: str) -> float:
    """Seconds from ``rxstream run APP --serve`` starting to the page's first frame."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "rxstream", "run", app, "--serve", "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert process.stderr is not None
        url = ""
        for line in process.stderr:
            found = SERVING.search(line.rstrip("\n"))
            if found:
                url = found.group(1)
                break
        assert url, "the run printed no URL"

        async def first_frame() -> float:
            async with aiohttp.ClientSession() as http:
                async with http.get(url) as page:
                    assert page.status == 200
                ws_url = url.replace("http://", "ws://").replace("/?", "/ws?")
                ws = await http.ws_connect(ws_url)
                await ws.send_json({"type": "hello", "accept": ["jpeg"]})
                while (await ws.receive()).type != aiohttp.WSMsgType.BINARY:
                    pass
                took = time.monotonic() - started
                await ws.close()
                return took

        return asyncio.run(first_frame())
    finally:
        process.terminate()
        process.wait(30)
        if process.stderr is not None:
            process.stderr.close()


async def frame_rates(server: Server, visitors: int, seconds: float) -> list[float]:
    """Frames a second each of ``visitors`` sessions at once received over ``seconds``."""
    async with aiohttp.ClientSession() as http:
        opened = [await Visitor(http, server).open() for _ in range(visitors)]
        await asyncio.gather(*(v.frames_until(5) for v in opened))
        before = [v.frames for v in opened]
        start = time.monotonic()

        async def read(visitor: Visitor) -> None:
            while time.monotonic() - start < seconds:
                await visitor.read_one()

        await asyncio.gather(*(read(v) for v in opened))
        took = time.monotonic() - start
        rates = [(v.frames - b) / took for v, b in zip(opened, before, strict=True)]
        for visitor in opened:
            await visitor.close()
        await asyncio.sleep(1.0)  # (their workers reset before the next measure)
        return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", default=str(ROOT / "examples" / "demo.py"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0, help="each frame-rate window")
    args = parser.parse_args()
    warm: list[float] = []
    cold: list[float] = []
    with Server(args.app, "--workers", "2", "--grace", "0.2") as server:
        for _ in range(args.rounds):
            warm.append(asyncio.run(warm_once(server)))
            cold.append(cold_once(args.app))
        alone = asyncio.run(frame_rates(server, 1, args.seconds))
        shared = asyncio.run(frame_rates(server, 2, args.seconds))
    print(f"click to first frame, {args.rounds} rounds, {Path(args.app).name}")
    print(f"{'start':<28} {'p50 s':>7} {'min s':>7} {'max s':>7}")
    for name, values in (
        ("warm worker (rxstream serve)", warm),
        ("cold (rxstream run --serve)", cold),
    ):
        print(f"{name:<28} {statistics.median(values):7.3f} {min(values):7.3f} {max(values):7.3f}")
    print(f"\nframes a second received, {args.seconds:g} s windows")
    print(f"one session alone:   {alone[0]:.1f}")
    print(f"two sessions at once: {', '.join(f'{r:.1f}' for r in shared)}")


if __name__ == "__main__":
    main()
