"""What the front's relay adds per frame: latency and CPU.

One session of the app on ``rxstream serve``; two scripted pages attach to it at once, one
through the front (``/ws?token=…``) and one straight to the worker's own port (read from
``/sessions``), both accepting jpeg. Each frame (by ``seq``) reaches both: the relay's added
latency is its arrival through the front minus its arrival direct. The front's CPU per frame
is its process's CPU time (``/proc/PID/stat``) over the window divided by the frames relayed.

    python bench/serve_relay.py [--app examples/demo.py] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _serve import Server, Visitor, unpack  # noqa: E402


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(server: Server, seconds: float) -> tuple[list[float], float, int]:
    assert server.process is not None
    async with aiohttp.ClientSession() as http:
        relayed = await Visitor(http, server).open()
        await relayed.frames_until(3)
        async with http.get(f"{server.base}/sessions?token={server.token}") as got:
            (session,) = (await got.json())["sessions"]
        token = relayed.info["ws"].split("=", 1)[1]
        direct = await http.ws_connect(f"ws://127.0.0.1:{session['port']}/ws?token={token}")
        await direct.send_json({"type": "hello", "accept": ["jpeg"]})
        assert relayed.ws is not None
        arrivals: dict[str, dict[int, float]] = {"front": {}, "direct": {}}

        async def read(name: str, ws: aiohttp.ClientWebSocketResponse, until: float) -> None:
            while time.monotonic() < until:
                message = await ws.receive()
                if message.type == aiohttp.WSMsgType.BINARY:
                    arrivals[name][unpack(message.data)[0]["seq"]] = time.perf_counter()
                elif message.type != aiohttp.WSMsgType.TEXT:
                    return

        await asyncio.sleep(1.0)  # both attached, the encoder's pace settled
        until = time.monotonic() + seconds
        cpu_before = cpu_s(server.process.pid)
        await asyncio.gather(read("front", relayed.ws, until), read("direct", direct, until))
        cpu = cpu_s(server.process.pid) - cpu_before
        both = sorted(set(arrivals["front"]) & set(arrivals["direct"]))
        added = [(arrivals["front"][s] - arrivals["direct"][s]) * 1000 for s in both]
        await direct.close()
        await relayed.close()
        return added, cpu, len(arrivals["front"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", default=str(ROOT / "examples" / "demo.py"))
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with Server(args.app, "--workers", "1", "--grace", "0.2") as server:
        added, cpu, frames = asyncio.run(measure(server, args.seconds))
    cuts = statistics.quantiles(added, n=20)
    print(f"relay of {Path(args.app).name}: {frames} frames in {args.seconds:g} s")
    print(f"added latency per frame: p50 {statistics.median(added):.3f} ms, p95 {cuts[18]:.3f} ms")
    per_frame = cpu * 1000 / max(frames, 1)
    print(f"front CPU: {per_frame:.3f} ms per frame ({cpu / args.seconds:.1%} of a core)")


if __name__ == "__main__":
    main()
