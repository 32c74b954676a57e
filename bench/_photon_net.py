"""``bench/photon.py --net SPEC``: mouse-to-photon for a remote visitor, through the emulator.

Per row, a fresh ``rxstream run examples/demo.py --serve --tls-self-signed`` and one headless
Chromium page (``photon.py --client``: the same on-screen measurement, ``measure_moves``):
``loopback`` (both on 127.0.0.1 in this namespace, no emulator), ``clean`` (the server in the
emulator's server namespace on its address with ``--allow-remote``, the browser in the client
namespace, the link doing nothing), then each SPEC on that link. The default page (HTTPS: the
WebCodecs path when the page is a secure context). Deltas are against the clean row. A spec
with a periodic blackout jumps for a whole period at least (more jumps), so that one blackout
falls among the jumps.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _net import Link, missing, open_link
from _photon_targets import SIZES, judge, size_of

from rxstream.timing import load

ROOT = Path(__file__).resolve().parent.parent
PORT = "8443"
_PIN = re.compile(r"--ignore-certificate-errors-spki-list=PIN: ([A-Za-z0-9+/]{43}=)$")
Percentile = Callable[[list[float], float], float]


def serve_demo(
    link: Link | None, log: Path, tls: bool = True, scale: str = "1"
) -> tuple[subprocess.Popen[str], str, str | None, list[str]]:
    """The demo served in ``link``'s server namespace on its address (None: on loopback, any
    free port), over TLS (``--tls-self-signed``) unless ``tls`` is false, its video ``scale``
    times its own size (``RXSTREAM_DEMO_SCALE``): the process (ended with the link), its URL,
    the certificate's SPKI pin (None without TLS), its stderr lines."""
    host, port = (link.server_addr, PORT) if link else ("127.0.0.1", "0")
    argv = [sys.executable, "-m", "rxstream", "run", str(ROOT / "examples/demo.py"), "--serve"]
    argv += ["--host", host, "--port", port, "--log", str(log), "--timeout", "900"]
    argv += (["--tls-self-signed"] if tls else []) + (["--allow-remote"] if link else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RXSTREAM_DEMO_SCALE": scale}
    kwargs: dict[str, Any] = {"stderr": subprocess.PIPE, "stdout": subprocess.DEVNULL}
    kwargs |= {"text": True, "env": env}
    server = link.popen("server", argv, **kwargs) if link else subprocess.Popen(argv, **kwargs)
    assert server.stderr is not None
    said: list[str] = []
    while not any("serving the page at " in line for line in said):
        line = server.stderr.readline()
        if not line:
            raise SystemExit(f"the demo ended before it served: {' | '.join(said[-5:])}")
        said.append(line.rstrip("\n"))
    url = said[-1].split("serving the page at ", 1)[1]
    pin = next((m.group(1) for m in map(_PIN.search, said) if m), None)
    drain = threading.Thread(target=lambda: said.extend(server.stderr or ()), daemon=True)
    drain.start()  # the run's later lines: kept, and its pipe never fills
    return server, url, pin, said


def cpu_s(pid: int) -> float:
    """Process ``pid``'s CPU seconds so far (user and system, its threads; Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(server: subprocess.Popen[str]) -> None:
    """End the served demo: SIGINT (a clean stop, its timing log complete), killed after 20 s."""
    if server.poll() is not None:
        return
    server.send_signal(signal.SIGINT)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(5)


def row(
    name: str,
    link: Link | None,
    moves: int,
    settle_s: float,
    max_s: float,
    percentile: Percentile,
    wire: str = "",
) -> dict[str, Any]:
    """One visit through ``link`` (None: loopback) with its spec already set, on ``wire``
    (the page's ``?wire=``; empty: its own choice); the row (a ``720p:`` name: the demo at
    that size)."""
    size, _ = size_of(name)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "timing.jsonl"
        server, url, pin, said = serve_demo(link, log, scale=SIZES.get(size, "1"))
        url = f"{url}&wire={wire}" if wire else url
        cpu_before = cpu_s(server.pid)
        try:
            assert pin is not None
            before = link.stats() if link else None
            argv = [sys.executable, str(ROOT / "bench/photon.py"), "--client", url, "--pin", pin]
            argv += ["--moves", str(moves), "--settle-s", str(settle_s), "--max-s", str(max_s)]
            way = link.spec.down if link else None
            if way is not None and way.blackout_every_s:  # jump a whole period: one blackout
                argv += ["--min-s", str(way.blackout_every_s + way.blackout_s)]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            argv = link.argv("client", argv) if link else argv
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
            after = link.stats() if link else None
            cpu = cpu_s(server.pid) - cpu_before
        finally:  # the loopback server is this process's child: never left serving
            stop(server)
        if done.returncode:
            tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
            return {"name": name, "error": f"the page failed: {tail[0]}"}
        keep = os.environ.get("RXSTREAM_PHOTON_LOGS")  # a folder: each row's server logs
        if keep:
            slug = re.sub(r"[^A-Za-z0-9=.%-]+", "_", name)
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / f"{slug}.stderr").write_text("\n".join(said) + "\n")
            if log.exists():
                (Path(keep) / f"{slug}.jsonl").write_bytes(log.read_bytes())
        visit = json.loads(done.stdout.strip().splitlines()[-1])
        records = {r.input_seq: r for r in load(log, stream="video").records}
        rate_changes = sum(1 for line in log.read_text().splitlines() if '"rate_changed"' in line)
    screen = [m["page_ms"] for m in visit["moves"]]
    total = [records[m["input_seq"]].total_ms for m in visit["moves"] if m["input_seq"] in records]
    beyond = [  # on screen minus the same move's server time: the link's and the page's part
        m["page_ms"] - records[m["input_seq"]].total_ms
        for m in visit["moves"]
        if m["input_seq"] in records
    ]
    result: dict[str, Any] = {
        "name": name,
        "path": visit["path"],
        "wire": visit.get("wire", ""),
        "asked": wire,
        "cpu_s": cpu,
        "moves": len(screen),
        "error": visit["error"],
        "stall_ms": visit["stall_ms"],
        "fps": visit["fps"],
        "kB_s": visit["bytes_per_s"] / 1000,
        "frames": visit["frames"],
        "total_p50": percentile(total, 50) if total else float("nan"),
        "beyond_p50": percentile(beyond, 50) if beyond else float("nan"),
        "rate_changes": rate_changes,
    }
    for q in (50, 95, 100):
        result[f"p{q}"] = percentile(screen, q) if screen else float("nan")
    received = visit["frames"]["received"]
    result["cpu_ms_frame"] = 1000 * cpu / received if received else float("nan")
    if before is not None and after is not None:
        result["drops"] = {
            way: {
                k: v - before[way]["drops"][k]
                for k, v in after[way]["drops"].items()
                if v - before[way]["drops"][k]
            }
            for way in ("up", "down")
        }
    return result


def _delta(row: dict[str, Any], clean: dict[str, Any]) -> str:
    if row is clean or "p50" not in row or "p50" not in clean:
        return ""
    return (
        f"p50 {row['p50'] - clean['p50']:+.0f} ({row['p50'] / clean['p50']:.1f}x), "
        f"p95 {row['p95'] - clean['p95']:+.0f}, stall {row['stall_ms'] - clean['stall_ms']:+.0f}"
    )


def table(rows: list[dict[str, Any]], moves: int) -> list[str]:
    """The rows as a markdown table, deltas against the clean row of the same wire
    (``moves``: the jumps asked for; a row with fewer or more says how many)."""
    first = next((r for r in rows if r["name"] == "clean"), rows[0])
    cleans = {r.get("asked"): r for r in rows if r["name"] == "clean"}  # per wire
    lines = [
        "| link (each way) | page | on screen p50 / p95 / max (ms) | longest stall (ms) | fps "
        "shown | server total_ms p50 | page kB/s | server CPU ms/frame | vs clean |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "p50" not in r:
            lines.append(f"| {r['name']} | {r['error']} | | | | | | | |")
            continue
        short = f"{r['moves']} moves" if r["moves"] != moves else ""
        note = "; ".join(part for part in (short, r["error"] or "") if part)
        note = f" ({note})" if note else ""
        on = f" on {r['wire']}" if r.get("wire") else ""
        delta = _delta(r, cleans.get(r.get("asked"), first))
        lines.append(
            f"| {r['name']} | {r['path']}{on}{note} | {r['p50']:.0f} / {r['p95']:.0f} / "
            f"{r['p100']:.0f} | {r['stall_ms']:.0f} | {r['fps']:.1f} | {r['total_p50']:.0f} | "
            f"{r['kB_s']:.0f} | {r['cpu_ms_frame']:.1f} | {delta} |"
        )
    return lines


def main(
    specs: list[str],
    moves: int,
    settle_s: float,
    max_s: float,
    percentile: Percentile,
    revision: str,
    wires: tuple[str, ...] = ("ws",),
) -> None:
    """Every row (one per link and wire, the wires side by side), then the table."""
    reason = missing()
    if reason is not None:
        raise SystemExit(f"bench/photon.py --net: {reason}: run it as root (sudo)")
    command = shlex.join(["python", "bench/photon.py", *sys.argv[1:]])
    names = ["clean"] + [s for s in specs if s != "clean"]
    for size in dict.fromkeys(size_of(s)[0] for s in specs):
        if size and f"{size}:clean" not in names:  # its own unimpaired row
            names.insert(
                names.index(next(s for s in names if size_of(s)[0] == size)), f"{size}:clean"
            )
    rows = [row("loopback", None, moves, settle_s, max_s, percentile, w) for w in wires]
    with open_link("clean") as link:
        for name in names:
            link.set(size_of(name)[1])
            for wire in wires:
                rows.append(row(name, link, moves, settle_s, max_s, percentile, wire))
                print(f"{name} {wire}: done", file=sys.stderr, flush=True)
    print(
        f"mouse-to-photon for a remote visitor, {moves} pointer jumps per link, the default "
        f"page over HTTPS (--tls-self-signed), {settle_s:g} s settle, at most {max_s:g} s of "
        f"jumps a link; command: {command}"
    )
    print("\n".join(table(rows, moves)))
    for r in rows:
        if "frames" in r:
            print(
                f"{r['name']}: the page's frames (visit) {r['frames']}; link drops "
                f"{r.get('drops')}; rate changes logged {r['rate_changes']}"
            )
    print("targets (against the unimpaired row of the same run and size):")
    print("\n".join(judge(rows)))
    print(f"command: {command}")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {revision}")
