"""The project's network emulator (bench/_net): two namespaces, a TUN device in each and a
forwarder between them; delay, loss, a rate cap, blackouts, UDP dropping, a spec changed
while running, one-line spec errors, and nothing left behind."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rxstream import ArgumentError

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(1, str(BENCH))  # bench/'s modules import each other by their own names

from _net import Link, missing, namespaces, open_link, parse  # noqa: E402

PEERS = str(BENCH / "_net" / "_peers.py")
PORT = "7000"
needs_root = pytest.mark.skipif(missing() is not None, reason=missing() or "")
SLACK_MS = 150.0
"""An upper bound's allowance over the physics on a loaded machine (the lower bounds are the
physics: an emulated delay is never shorter)."""


@pytest.fixture
def link() -> Iterator[Link]:
    """A clean link with the echo server running in the server's namespace."""
    with open_link("clean") as opened:
        server = opened.popen(
            "server",
            [sys.executable, PEERS, "serve", opened.server_addr, PORT],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        assert server.stdout.readline() == "ready\n"
        yield opened


def client(link: Link, *args: str) -> str:
    """A peer mode run to its end in the client's namespace; its stdout."""
    done = link.run(
        "client",
        [sys.executable, PEERS, args[0], link.server_addr, PORT, *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return str(done.stdout)


def rtts(link: Link, count: int) -> list[float]:
    """``count`` TCP echo round trips across the link (ms)."""
    return [float(line) for line in client(link, "rtt", str(count)).split()]


@pytest.mark.slow
@needs_root
def test_the_link_delays_each_way_by_half_the_rtt(link: Link) -> None:
    """rtt=60ms: the median TCP echo takes at least 60 ms, and at most the clean link's median
    plus 60 ms plus a loose allowance for a loaded machine; clean: well under 60 ms."""
    clean = statistics.median(rtts(link, 20))
    link.set("rtt=60ms")
    delayed = statistics.median(rtts(link, 20))
    assert clean < 60, clean
    assert 60 <= delayed < clean + 60 + SLACK_MS, (delayed, clean)


@pytest.mark.slow
@needs_root
def test_loss_drops_the_configured_fraction(link: Link) -> None:
    """loss=10% each way: about 81% of UDP echoes come back and the forwarder counts about a
    tenth of each way's packets as lost."""
    link.set("loss=10%,seed=3")
    result = json.loads(client(link, "udp", "1000", "1"))
    assert 0.70 < result["echoed"] / 1000 < 0.90, result
    stats = link.stats()
    for way in ("up", "down"):
        counted = stats[way]["drops"]["loss"] / stats[way]["packets"]
        assert 0.05 < counted < 0.15, stats[way]


@pytest.mark.slow
@needs_root
def test_a_rate_cap_limits_throughput(link: Link) -> None:
    """rate=2mbit: a bulk TCP download runs at about 250 kB/s (0.5x..1.1x), its queue's wait
    bounded by the queue."""
    link.set("rate=2mbit,queue=200ms")
    result = json.loads(client(link, "blast", "2"))
    rate = result["bytes"] / result["seconds"]
    assert 0.5 * 250_000 < rate < 1.1 * 250_000, result
    assert link.stats()["down"]["max_queue_wait_s"] <= 0.2


@pytest.mark.slow
@needs_root
def test_a_blackout_stops_traffic_for_its_length(link: Link) -> None:
    """blackout=500ms/1500ms over 2 s of UDP echoes every 5 ms: one gap of at least about
    500 ms (400 up; less than the period), and the forwarder counts the packets it dropped."""
    link.set("blackout=500ms/1500ms")
    result = json.loads(client(link, "udp", "400", "5"))
    assert 400 <= result["longest_gap_ms"] < 1500, result
    assert link.stats()["up"]["drops"]["blackout"] > 0


@pytest.mark.slow
@needs_root
def test_a_single_blackout_starts_at_once(link: Link) -> None:
    """blackout=300ms (no period): UDP echoes sent from right after set() come back only after
    about 300 ms (a gap of 200 ms up; well under the 1 s of echoes), then steadily."""
    peer = link.popen(
        "client",
        [sys.executable, PEERS, "udp", link.server_addr, PORT, "200", "5"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    link.set("blackout=300ms")  # before the peer (a process starting) sends, or just after
    assert peer.stdout is not None
    result = json.loads(peer.stdout.read())
    assert peer.wait(30) == 0
    assert 200 <= result["longest_gap_ms"] < 300 + 4 * SLACK_MS, result
    assert result["echoed"] < 200


@pytest.mark.slow
@needs_root
def test_udp_drop_drops_udp_but_not_tcp(link: Link) -> None:
    """udp=drop: no UDP echo comes back, all its datagrams counted as dropped; TCP still echoes."""
    link.set("udp=drop")
    assert json.loads(client(link, "udp", "50", "2"))["echoed"] == 0
    assert link.stats()["up"]["drops"]["udp"] == 50
    assert len(rtts(link, 5)) == 5


@pytest.mark.slow
@needs_root
def test_a_spec_change_takes_effect_on_an_open_connection(link: Link) -> None:
    """One TCP connection: its echoes take about the clean link's time, then at least 100 ms
    more (and within a loose allowance of it) once set(rtt=100ms)."""
    argv = [sys.executable, PEERS, "rtt", link.server_addr, PORT, "20", "10"]
    peer = link.popen("client", argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert peer.stdin is not None
    assert peer.stdout is not None
    before = [float(peer.stdout.readline()) for _ in range(10)]
    assert peer.stdout.readline() == "paused\n"
    link.set("rtt=100ms")
    peer.stdin.write("go\n")
    peer.stdin.flush()
    after = [float(line) for line in peer.stdout]
    assert peer.wait(30) == 0
    clean = statistics.median(before)
    assert clean < 100, before
    assert len(after) == 10
    assert 100 <= statistics.median(after) < clean + 100 + SLACK_MS, (after, clean)


def _never_a_pid() -> int:
    """A pid no process can have (above the kernel's pid_max): a crashed run's, never reused."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def _devices() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def _fail_inside(
    stale: str, seen: list[tuple[Link, subprocess.Popen[bytes], subprocess.Popen[str]]]
) -> None:
    with open_link("rtt=10ms") as link:
        assert stale not in namespaces()
        forwarder = link._forwarder
        assert forwarder is not None
        seen.append((link, link.popen("server", ["sleep", "600"]), forwarder))
        assert {link.server_ns, link.client_ns} <= set(namespaces())
        raise RuntimeError("inside")


@pytest.mark.slow
@needs_root
def test_nothing_is_left_after_the_link_even_after_an_exception() -> None:
    """After the with block (ended by an exception too): both namespaces, the TUN devices, the
    forwarder and the processes started in the link are gone; a crashed run's namespace with
    the emulator's prefix is removed by the next link."""
    stale = f"rxnet-{_never_a_pid()}-0s"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    seen: list[tuple[Link, subprocess.Popen[bytes], subprocess.Popen[str]]] = []
    with pytest.raises(RuntimeError, match=r"^inside$"):
        _fail_inside(stale, seen)
    ((link, sleeper, forwarder),) = seen
    assert not {link.server_ns, link.client_ns} & set(namespaces())
    assert sleeper.poll() is not None
    assert forwarder.poll() is not None
    assert f"rx{link._tag}" not in _devices()


BAD = [
    ("rtt=40", "net spec item 'rtt=40': rtt must be a time (40ms, 1s, 500us), got '40'"),
    ("loss=3", "net spec item 'loss=3': loss must be a percentage from 0% to below 100%, got '3'"),
    (
        "loss=100%",
        "net spec item 'loss=100%': loss must be a percentage from 0% to below 100%, got '100%'",
    ),
    (
        "rate=1mbps",
        "net spec item 'rate=1mbps': rate must be above 0 in bit, kbit, mbit or gbit (250kbit), "
        "got '1mbps'",
    ),
    (
        "rate=1mbit,queue=lots",
        "net spec item 'queue=lots': queue must be a time (1s, 200ms) or bytes (64kB, 1500B), "
        "got 'lots'",
    ),
    (
        "queue=1s",
        "net spec 'queue=1s': queue goes with rate (the queue is the cap's), the up way has no "
        "rate",
    ),
    (
        "blackout=2s/1s",
        "net spec item 'blackout=2s/1s': blackout D/P must have its length D below its period P, "
        "got '2s/1s'",
    ),
    ("udp=block", "net spec item 'udp=block': udp must be drop or pass, got 'block'"),
    (
        "jitter=5ms",
        "net spec item 'jitter=5ms': the key must be one of rtt, delay, loss, rate, queue, "
        "blackout, udp, seed, got 'jitter'",
    ),
    (
        "left:delay=5ms",
        "net spec item 'left:delay=5ms': the prefix must be up: or down:, got 'left'",
    ),
    (
        "up:rtt=40ms",
        "net spec item 'up:rtt=40ms': rtt goes for both ways, without up:/down: (one way's: "
        "up:delay=… or down:delay=…)",
    ),
    (
        "rtt=40ms,down:delay=5ms",
        "net spec item 'down:delay=5ms': delay of the down way is given twice (first by "
        "'rtt=40ms')",
    ),
    ("rtt", "net spec item 'rtt': an item must be [up:|down:]key=value, got 'rtt'"),
    ("clean,loss=1%", "net spec 'clean,loss=1%': clean goes alone (it means no impairment)"),
]


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_a_bad_spec_is_one_line_naming_the_item_the_rule_and_the_value(
    spec: str, message: str
) -> None:
    """Each rule a spec breaks: an ArgumentError (a ValueError), one line, the item and value "
    "named."""
    with pytest.raises(ArgumentError) as raised:
        parse(spec)
    assert str(raised.value) == message
    assert "\n" not in message


def test_a_spec_reads_each_way_and_both() -> None:
    """rtt splits evenly; up:/down: set one way; rates, queues and blackouts read in their units."""
    spec = parse(
        "rtt=40ms,loss=3%,down:rate=250kbit,down:queue=64kB,blackout=500ms/10s,up:udp=drop"
    )
    assert spec.up.delay_s == spec.down.delay_s == pytest.approx(0.02)
    assert spec.up.loss == spec.down.loss == pytest.approx(0.03)
    assert spec.up.rate_bps is None
    assert spec.down.rate_bps == 250_000
    assert spec.down.queue_limit_s == pytest.approx(64_000 * 8 / 250_000)
    assert (spec.up.blackout_s, spec.up.blackout_every_s) == (0.5, 10.0)
    assert spec.up.udp_drop
    assert not spec.down.udp_drop
    assert parse("clean").clean
    assert parse("").clean
    assert not spec.clean
