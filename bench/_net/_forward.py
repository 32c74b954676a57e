"""The emulated link's forwarder: a process of its own that moves IP packets between the two
namespaces' TUN devices, each way through its delay, loss, rate cap, queue and blackouts.

Run by :class:`_net.Link` as ``python _forward.py SERVER_FD CLIENT_FD`` with both TUN
file descriptors inherited; it reads JSON lines on stdin and answers each on stdout:
``{"cmd": "set", "up": {...}, "down": {...}, "seed": N}`` (a :class:`WaySpec`'s fields per
way; answered once applied) and ``{"cmd": "stats"}`` (the counters per way). End of stdin
ends it.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import random
import select
import sys
import time
from typing import Any

READ_BURST = 64
"""Packets read from one TUN before the due ones are written out (keeps both ways moving)."""


class Way:
    """One way of the link: what it does to a packet, the packets in flight, its counters."""

    def __init__(self, name: str, src: int, dst: int) -> None:
        self.name, self.src, self.dst = name, src, dst
        self.flight: list[tuple[float, int, bytes]] = []  # (due, seq, packet), a heap
        self.seq = 0
        self.busy_until = 0.0  # when the cap has sent the last packet it accepted
        self.counts = {"packets": 0, "bytes": 0, "sent": 0, "sent_bytes": 0}
        self.drops = {"loss": 0, "queue": 0, "blackout": 0, "udp": 0, "tun_full": 0}
        self.max_wait_s = 0.0
        self.configure({}, 0, time.monotonic())

    def configure(self, spec: dict[str, Any], seed: int, now: float) -> None:
        """Apply a way's fields from now on (packets in flight keep their due times)."""
        self.delay = float(spec.get("delay_s", 0.0))
        self.loss = float(spec.get("loss", 0.0))
        rate = spec.get("rate_bps")
        self.rate: float | None = None if rate is None else float(rate)
        self.queue_s = float(spec.get("queue_limit_s", 1.0))
        self.blackout = float(spec.get("blackout_s", 0.0))
        every = spec.get("blackout_every_s")
        self.every: float | None = None if every is None else float(every)
        self.udp_drop = bool(spec.get("udp_drop", False))
        self.since = now
        self.random = random.Random(f"{seed}:{self.name}")
        self.busy_until = min(self.busy_until, now) if self.rate is None else self.busy_until

    def dark(self, now: float) -> bool:
        """Whether a blackout drops every packet now."""
        if not self.blackout:
            return False
        elapsed = now - self.since
        if self.every is None:
            return elapsed < self.blackout
        return elapsed >= self.every and elapsed % self.every < self.blackout

    def accept(self, packet: bytes, now: float) -> None:
        """One packet read from ``src``: dropped, or queued to be written to ``dst`` when due."""
        self.counts["packets"] += 1
        self.counts["bytes"] += len(packet)
        version = packet[0] >> 4
        proto = packet[9] if version == 4 else packet[6] if version == 6 else -1
        if self.udp_drop and proto == 17:
            self.drops["udp"] += 1
            return
        if self.dark(now):
            self.drops["blackout"] += 1
            return
        if self.loss and self.random.random() < self.loss:
            self.drops["loss"] += 1
            return
        due = now
        if self.rate is not None:
            start = max(now, self.busy_until)
            if start - now > self.queue_s:
                self.drops["queue"] += 1
                return
            self.max_wait_s = max(self.max_wait_s, start - now)
            self.busy_until = start + len(packet) * 8 / self.rate
            due = self.busy_until
        due += self.delay
        if due <= now and not self.flight:
            self.send(packet)
            return
        self.seq += 1
        heapq.heappush(self.flight, (due, self.seq, packet))

    def send(self, packet: bytes) -> None:
        try:
            os.write(self.dst, packet)
        except BlockingIOError:
            self.drops["tun_full"] += 1
            return
        self.counts["sent"] += 1
        self.counts["sent_bytes"] += len(packet)

    def release(self, now: float) -> float | None:
        """Write out the packets due by ``now``; the next one's due time, if any."""
        flight = self.flight
        while flight and flight[0][0] <= now:
            self.send(heapq.heappop(flight)[2])
        return flight[0][0] if flight else None

    def drain(self) -> None:
        """Read what ``src`` holds (up to a burst), accepting each packet."""
        for _ in range(READ_BURST):
            try:
                packet = os.read(self.src, 65536)
            except BlockingIOError:
                return
            if packet:
                self.accept(packet, time.monotonic())

    def stats(self) -> dict[str, Any]:
        return {
            **self.counts,
            "drops": dict(self.drops),
            "in_flight": len(self.flight),
            "max_queue_wait_s": self.max_wait_s,
        }


def serve(server_fd: int, client_fd: int) -> None:
    """Forward until stdin ends."""
    ways = {"down": Way("down", server_fd, client_fd), "up": Way("up", client_fd, server_fd)}
    by_fd = {server_fd: ways["down"], client_fd: ways["up"]}
    control = sys.stdin.fileno()
    os.set_blocking(control, False)
    poll = select.epoll()
    for fd in (server_fd, client_fd, control):
        poll.register(fd, select.EPOLLIN)
    pending = b""
    while True:
        now = time.monotonic()
        dues = [d for way in ways.values() if (d := way.release(now)) is not None]
        timeout = max(0.0, min(dues) - time.monotonic()) if dues else 1.0
        for fd, _ in poll.poll(timeout):
            way = by_fd.get(fd)
            if way is not None:
                way.drain()
                continue
            chunk = os.read(control, 65536)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                sys.stdout.write(json.dumps(command(ways, json.loads(line))) + "\n")
                sys.stdout.flush()


def command(ways: dict[str, Way], message: dict[str, Any]) -> dict[str, Any]:
    """Answer one control line."""
    if message["cmd"] == "set":
        now = time.monotonic()
        for name, way in ways.items():
            way.configure(message[name], int(message["seed"]), now)
        return {"ok": True}
    return {name: way.stats() for name, way in ways.items()}


if __name__ == "__main__":
    with contextlib.suppress(OSError):  # root: ahead of the server and the browser
        os.nice(-10)
    serve(int(sys.argv[1]), int(sys.argv[2]))
