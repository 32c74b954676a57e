"""Test traffic for the emulated link (tests/test_net.py, bench/net_overhead.py), each end run
in one of its namespaces (``python _peers.py MODE HOST PORT ...``):

- ``serve HOST PORT``: a TCP echo (a line back for each line; ``blast S`` sends zeros for S
  seconds, then closes) and a UDP echo on the same port; prints ``ready`` once listening.
- ``rtt HOST PORT N [K]``: N one-line TCP echoes, one at a time, each round trip's ms on a line
  of its own; after K of them it waits for a line on stdin (the test changes the link).
- ``udp HOST PORT N GAP_MS``: N datagrams GAP_MS apart, then prints JSON: how many came back
  and the longest gap between two echoes, or the first datagram and the first echo (ms).
- ``blast HOST PORT S``: asks for S seconds of zeros; prints JSON: bytes and the seconds from
  the first byte to the last.
- ``stream HOST PORT RATE SIZE``: SIZE-byte UDP datagrams to HOST:PORT, RATE a second, until
  killed (background load).
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
import threading
import time


def serve(host: str, port: int) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((host, port))
    tcp = socket.create_server((host, port))

    def echo_udp() -> None:
        while True:
            data, peer = udp.recvfrom(2048)
            udp.sendto(data, peer)

    def echo_tcp(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                if line.startswith(b"blast "):
                    end = time.monotonic() + float(line.split()[1])
                    chunk = bytes(16384)
                    while time.monotonic() < end:
                        conn.sendall(chunk)
                    return
                conn.sendall(line)

    threading.Thread(target=echo_udp, daemon=True).start()
    print("ready", flush=True)
    while True:
        conn, _ = tcp.accept()
        threading.Thread(target=echo_tcp, args=(conn,), daemon=True).start()


def rtt(host: str, port: int, count: int, pause: int) -> None:
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines = conn.makefile("rb")
        for index in range(count):
            if index == pause:
                print("paused", flush=True)
                sys.stdin.readline()
            start = time.perf_counter()
            conn.sendall(b"ping\n")
            lines.readline()
            print(f"{(time.perf_counter() - start) * 1000:.3f}", flush=True)
            time.sleep(0.01)


def udp(host: str, port: int, count: int, gap_ms: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((host, port))
    sock.setblocking(False)
    arrived: list[float] = []
    end = time.monotonic() + count * gap_ms / 1000 + 1.0  # the last echoes' time to come back
    sent, began = 0, time.monotonic()
    while time.monotonic() < end:
        if sent < count:
            sock.send(b"x" * 100)
            sent += 1
        deadline = time.monotonic() + gap_ms / 1000
        while time.monotonic() < deadline:
            try:
                sock.recv(2048)
                arrived.append(time.monotonic())
            except BlockingIOError:
                time.sleep(0.0005)
    gaps = [b - a for a, b in itertools.pairwise([began, *arrived])]  # a late first echo too
    print(json.dumps({"echoed": len(arrived), "longest_gap_ms": max(gaps, default=0) * 1000}))


def blast(host: str, port: int, seconds: float) -> None:
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(f"blast {seconds}\n".encode())
        total, first, last = 0, 0.0, 0.0
        while chunk := conn.recv(65536):
            last = time.monotonic()
            first = first or last
            total += len(chunk)
    print(json.dumps({"bytes": total, "seconds": last - first}))


def stream(host: str, port: int, rate: float, size: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload, start, sent = bytes(size), time.monotonic(), 0
    while True:
        sock.sendto(payload, (host, port))
        sent += 1
        time.sleep(max(0.0, start + sent / rate - time.monotonic()))


if __name__ == "__main__":
    mode, host, port, *rest = sys.argv[1:]
    if mode == "serve":
        serve(host, int(port))
    elif mode == "rtt":
        rtt(host, int(port), int(rest[0]), int(rest[1]) if len(rest) > 1 else -1)
    elif mode == "stream":
        stream(host, int(port), float(rest[0]), int(rest[1]))
    elif mode == "udp":
        udp(host, int(port), int(rest[0]), float(rest[1]))
    else:
        blast(host, int(port), float(rest[0]))
