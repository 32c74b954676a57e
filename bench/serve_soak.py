"""A soak of ``rxstream serve``: N short sessions come and go on 2 workers.

Two scripted visitors at a time (aiohttp, real sockets) each take a session, read
``--frames`` frames, write the doc, and leave; the next one comes at once. Measured: the
front's and each worker's RSS and the count of /dev/shm segments after the warm-up
(``--warmup`` sessions) and at the end; every session's books as the front says them when it
ends (produced == delivered + dropped: frames relayed to the page, frames no page took);
and, once the server stopped, that no process of it is left.

    python bench/serve_soak.py [--app tests/apps/serve_app.py] [--sessions 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _serve import SERVE_APP, Server, Visitor, alive  # noqa: E402

ENDED = re.compile(
    r"session (\w+) ended on worker \d+: (.*) \((\d+) frames produced: (\d+) delivered, "
    r"(\d+) dropped(?:, (\d+) in flight as the page left)?\)$"
)


def shm_of(pid: int) -> set[str]:
    """The /dev/shm segments the process ``pid`` has mapped or open (its own, whatever other
    programs on the machine hold)."""
    held: set[str] = set()
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if "/dev/shm/" in line:
                held.add(line.split("/dev/shm/", 1)[1].split()[0])
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    held.add(target.removeprefix("/dev/shm/"))
    except OSError:
        pass
    return held


def rss_mb(pid: int) -> float:
    """The process's resident set (MB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def soak(
    server: Server, sessions: int, frames: int, warmup: int, every: int
) -> dict[str, object]:
    assert server.process is not None
    done = 0
    marks: dict[str, object] = {}
    series: list[tuple[int, dict[str, object]]] = []
    marks["series"] = series

    async def sample(http: aiohttp.ClientSession) -> dict[str, object]:
        async with http.get(f"{server.base}/sessions?token={server.token}") as got:
            workers = [w["pid"] for w in (await got.json())["workers"]]
        front = server.process.pid  # type: ignore[union-attr]
        return {
            "front_mb": rss_mb(front),
            "workers_mb": [round(rss_mb(pid), 1) for pid in workers],
            "shm": len(set().union(*(shm_of(pid) for pid in (front, *workers)))),
            "pids": workers,
        }

    async def visitor(http: aiohttp.ClientSession, index: int) -> None:
        nonlocal done
        while done < sessions:
            done += 1
            mine = done
            seen = Visitor(http, server)
            await seen.open(busy_s=60)  # the worker this visitor left may still be resetting
            await seen.frames_until(frames // 2)
            await seen.set(shade=mine % 250)
            await seen.frames_until(frames - frames // 2)
            await seen.close()
            if mine == warmup:
                marks["warm"] = await sample(http)
            if mine % every == 0:
                series.append((mine, await sample(http)))

    async with aiohttp.ClientSession() as http:
        started = time.monotonic()
        await asyncio.gather(visitor(http, 0), visitor(http, 1))
        took = time.monotonic() - started
        async with asyncio.timeout(30):
            while True:
                listing = f"{server.base}/sessions?token={server.token}"
                async with http.get(f"{server.base}/readyz") as ready, http.get(listing) as got:
                    if ready.status == 200 and not (await got.json())["sessions"]:
                        break
                await asyncio.sleep(0.05)
        marks["end"] = await sample(http)
        marks["seconds"] = took
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", default=SERVE_APP)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--frames", type=int, default=20, help="frames each visitor reads")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--every", type=int, default=25, help="sample every this many sessions")
    args = parser.parse_args()
    with Server(args.app, "--workers", "2", "--grace", "0.2") as server:
        marks = asyncio.run(soak(server, args.sessions, args.frames, args.warmup, args.every))
        status = server.stop(signal.SIGINT)
    warm, end = marks["warm"], marks["end"]
    assert isinstance(warm, dict)
    assert isinstance(end, dict)
    books = [m.groups() for m in map(ENDED.search, server.lines) if m]
    balanced = [b for b in books if int(b[2]) == int(b[3]) + int(b[4])]
    left = [pid for pid in (*warm["pids"], *end["pids"]) if alive(pid)]
    print(
        f"soak: {args.sessions} sessions of {Path(args.app).name} on 2 workers in "
        f"{marks['seconds']:.1f} s; server exit status {status}"
    )
    print(f"{'':<24} {'after warm-up':>14} {'at the end':>14}")
    print(f"{'front RSS (MB)':<24} {warm['front_mb']:>14.1f} {end['front_mb']:>14.1f}")
    print(f"{'worker RSS (MB)':<24} {warm['workers_mb']!s:>14} {end['workers_mb']!s:>14}")
    print(f"{'/dev/shm segments held':<24} {warm['shm']:>14} {end['shm']:>14}")
    series = marks["series"]
    assert isinstance(series, list)
    for count, taken in series:
        print(
            f"  after {count:>4} sessions: front {taken['front_mb']:.1f} MB, workers "
            f"{taken['workers_mb']} MB, /dev/shm held {taken['shm']}"
        )
    in_flight = [int(b[5]) for b in books if b[5]]
    print(f"sessions ended with books: {len(books)}; balanced: {len(balanced)}")
    if in_flight:
        print(f"  the others had {sum(in_flight)} frame(s) in flight as their page left")
    for sid, _, produced, delivered, dropped, _ in [b for b in books if b not in balanced][:5]:
        print(f"  unbalanced {sid}: {produced} produced, {delivered} delivered, {dropped} dropped")
    print(f"processes left after the stop: {len(left)}")


if __name__ == "__main__":
    main()
