"""What the network emulator itself adds: TCP echo round trips through a clean link, idle and
under an h264 page's load, beside the same echo on loopback (no emulator).

The echo server runs in the link's server namespace; the client in the client namespace
(through the link) and in the server namespace (its loopback: the same kernel path, no
forwarder). Under load a UDP stream runs from the server to the client beside the echoes:
1500 datagrams a second of 400 bytes (4.8 Mbit/s, above the demo's h264 page). Added per way
= (link p50 - loopback p50) / 2. Target: <= ~1 ms a way.

Run ``sudo python bench/net_overhead.py`` (about 20 s; needs root, /dev/net/tun, ip).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))

from _net import open_link  # noqa: E402

PEERS = str(ROOT / "bench" / "_net" / "_peers.py")


def echoes(link: object, side: str, host: str, count: int) -> list[float]:
    done = link.run(  # type: ignore[attr-defined]
        side,
        [sys.executable, PEERS, "rtt", host, "7000", str(count)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(v) for v in done.stdout.split()]


def row(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    p50 = statistics.median(values)
    return f"{name:<34} p50 {p50:6.3f}  p95 {p95:6.3f}  max {max(values):6.3f} ms"


def main() -> None:
    from _report import revision

    count = 300
    with open_link("clean") as link:
        server = link.popen(
            "server",
            [sys.executable, PEERS, "serve", "0.0.0.0", "7000"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        assert server.stdout.readline() == "ready\n"
        results = {}
        for load in (False, True):
            if load:
                link.popen(
                    "server",
                    [sys.executable, PEERS, "stream", link.client_addr, "7001", "1500", "400"],
                )
                time.sleep(1)
            tag = " under 4.8 Mbit/s" if load else ", idle"
            results[f"loopback{tag}"] = echoes(link, "server", "127.0.0.1", count)
            results[f"through the link{tag}"] = echoes(link, "client", link.server_addr, count)
        stats = link.stats()
    print(f"TCP echo round trips, {count} each (ms)")
    for name, values in results.items():
        print(row(name, values))
    for tag in (", idle", " under 4.8 Mbit/s"):
        added = (
            statistics.median(results[f"through the link{tag}"])
            - statistics.median(results[f"loopback{tag}"])
        ) / 2
        print(f"added per way{tag}: {added:.3f} ms (p50)")
    print(f"forwarded down: {stats['down']['sent']} packets, drops {stats['down']['drops']}")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {revision()}")


if __name__ == "__main__":
    main()
