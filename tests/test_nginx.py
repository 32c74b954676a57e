"""``rxstream serve`` behind nginx (deploy/nginx/rxstream.conf): two servers on this machine,
scripted visitors over real sockets through the balancer."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from _serve import ROOT, SERVE_APP, Server, Visitor, alive, get_json

from rxstream.serve._sessions import Sessions

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
)
CONF = ROOT / "deploy" / "nginx" / "rxstream.conf"
TOKEN = "nginx-test-token-0123456789"


def test_a_route_name_starts_every_id_token_and_ticket() -> None:
    """With a route name, each session id, session token and queue ticket starts with
    ``NAME-`` (what the balancer routes by), then hex digits (a token stays URL-safe)."""
    routed, plain = Sessions(4, "b"), Sessions(4)
    session, ticket = routed.open(0), routed.wait()
    assert ticket is not None
    assert session.id.startswith("b-")
    assert session.token.startswith("b-")
    assert ticket.id.startswith("b-")
    other, other_ticket = plain.open(0), plain.wait()
    assert other_ticket is not None
    assert not other.id.startswith(("a-", "b-"))
    assert len(other.id) == 12
    assert re.fullmatch("b-[0-9a-f]+", session.token)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Balancer:
    """What a :class:`Visitor` needs of where it goes: the balancer's address, the token."""

    base: str
    token: str


class Nginx:
    """nginx with the shipped config (its ports made this test's) in a temp prefix, in the
    foreground, while in ``with``."""

    def __init__(self, prefix: Path, ports: tuple[int, int]) -> None:
        self.prefix = prefix
        self.port = _free_port()
        shipped = CONF.read_text()
        conf = (
            shipped.replace("127.0.0.1:8801", f"127.0.0.1:{ports[0]}")
            .replace("127.0.0.1:8802", f"127.0.0.1:{ports[1]}")
            .replace("listen 8080;", f"listen 127.0.0.1:{self.port};")
        )
        assert conf.count(str(ports[0])) == 2
        assert conf.count(str(ports[1])) == 2
        (prefix / "rxstream.conf").write_text(conf)
        temps = " ".join(
            f"{kind}_temp_path {prefix / kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        (prefix / "nginx.conf").write_text(
            f"worker_processes 1; pid {prefix / 'nginx.pid'}; error_log {prefix / 'error.log'};\n"
            "events { worker_connections 256; }\n"
            f"http {{ access_log off; {temps} include {prefix / 'rxstream.conf'}; }}\n"
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.workers: list[int] = []
        """nginx's worker processes (read as it stops)."""

    def __enter__(self) -> Nginx:
        assert NGINX is not None
        argv = [NGINX, "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf")]
        checked = subprocess.run([*argv, "-t"], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr
        self.process = subprocess.Popen([*argv, "-g", "daemon off;"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.prefix / "error.log").read_text()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.02)  # polling its port: nginx says nothing when it listens
        raise AssertionError("nginx did not listen within 30 s")

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        pid = self.process.pid
        self.workers = [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
        self.process.send_signal(signal.SIGQUIT)
        self.process.wait(30)


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, Server]]:
    """Two servers of the serve app, routes ``a`` and ``b``, one worker each, one token."""
    monkeypatch.setenv("RXSTREAM_SERVE_TOKEN", TOKEN)
    args = ("--workers", "1", "--queue", "1", "--grace", "0.3")
    with (
        Server(SERVE_APP, *args, "--route", "a") as a,
        Server(SERVE_APP, *args, "--route", "b") as b,
    ):
        yield a, b


async def _browser_gets_a_session_on(http: aiohttp.ClientSession, lb: Balancer, route: str) -> None:
    """A browser visitor while one server is busy: sent to a session on the free one (not
    to the busy one's queue); that session is then left and its worker free again."""
    html = {"Accept": "text/html"}
    async with http.get(f"{lb.base}/?token={lb.token}", headers=html, allow_redirects=False) as got:
        assert got.status == 303, (got.status, await got.text())
        url = got.headers["Location"]
    assert url.startswith(f"/s/{route}"), url
    visitor = Visitor(http, lb)  # type: ignore[arg-type]
    visitor.info = {"url": url, "ws": "/ws?token=" + url.split("token=", 1)[1]}
    await visitor.attach()
    await visitor.frames_until(1)
    await visitor.close()
    async with asyncio.timeout(20):
        while (await get_json(http, f"{lb.base}/readyz"))[0] != 200:
            await asyncio.sleep(0.05)


def _port(server: Server) -> int:
    return int(server.base.rsplit(":", 1)[1])


@pytest.mark.slow
@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
def test_nginx_spreads_sessions_keeps_each_on_its_server_and_queues_the_next(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    """Through nginx, two visitors get a session each, one on each server (their /sessions
    say so); each steers only its own; a third gets 503 with Retry-After (an API client) or
    the queue page (a browser), served through nginx once a visitor leaves; afterwards no
    server process nor nginx is left."""
    a, b = servers
    pids = {s.process.pid for s in servers if s.process is not None}

    async def check(lb: Balancer) -> None:
        async with aiohttp.ClientSession() as http:
            one = await Visitor(http, lb).open()  # type: ignore[arg-type]
            other = "b-" if one.id.startswith("a-") else "a-"
            for _ in range(3):  # a busy server first or second in nginx's turn: either way
                await _browser_gets_a_session_on(http, lb, other)
            two = await Visitor(http, lb).open()  # type: ignore[arg-type]
            assert {one.id[:2], two.id[:2]} == {"a-", "b-"}
            for server in servers:
                listed = (await get_json(http, f"{server.base}/sessions?token={TOKEN}"))[1]
                route = server.argv[-1]
                assert [s["id"][:2] for s in listed["sessions"]] == [route + "-"]
            await asyncio.gather(one.frames_until(3), two.frames_until(3))
            await one.set(shade=200)
            await two.set(shade=50)
            one.shades.clear()
            two.shades.clear()
            async with asyncio.timeout(20):
                while not (one.shades[-3:] == [200] * 3 and two.shades[-3:] == [50] * 3):
                    await asyncio.gather(one.frames_until(1), two.frames_until(1))
            assert 50 not in one.shades
            assert 200 not in two.shades

            root = f"{lb.base}/?token={TOKEN}"
            status, body, headers = await get_json(http, root)
            assert status == 503, (status, body)
            assert body["error"] == "every worker is busy"
            assert int(headers["Retry-After"]) >= 1
            html = {"Accept": "text/html"}
            async with http.get(root, headers=html, allow_redirects=False) as got:
                assert got.status == 303, (got.status, await got.text())
                queued = got.headers["Location"]
            assert queued[:5] in ("/q/a-", "/q/b-")
            async with http.get(lb.base + queued) as page:
                assert page.status == 200
                assert "number <b id=place>1</b>" in await page.text()
            state = f"{lb.base}{queued}/state"
            assert (await get_json(http, state))[1] == {"place": 1, "queue": 1}
            leaving = one if one.id[0] == queued[3] else two
            staying = two if leaving is one else one
            await leaving.close()
            async with asyncio.timeout(20):
                while "url" not in (got_state := (await get_json(http, state))[1]):
                    await asyncio.sleep(0.1)
            three = Visitor(http, lb)  # type: ignore[arg-type]
            token = got_state["url"].split("token=", 1)[1]
            three.info = {"url": got_state["url"], "ws": f"/ws?token={token}"}
            await three.attach()
            await three.frames_until(3)
            await staying.frames_until(1)
            await three.close()
            await staying.close()

    with Nginx(tmp_path, (_port(a), _port(b))) as nginx:
        asyncio.run(check(Balancer(f"http://127.0.0.1:{nginx.port}", TOKEN)))
        master = nginx.process
    assert master is not None
    assert master.returncode is not None
    assert not alive(master.pid)
    assert nginx.workers
    assert not any(alive(pid) for pid in nginx.workers)
    for server in servers:
        assert server.stop() == 128 + signal.SIGINT
    assert not any(alive(pid) for pid in pids)


@pytest.mark.slow
def test_a_tls_balancers_forwarded_scheme_is_the_origins(
    servers: tuple[Server, Server],
) -> None:
    """Behind a TLS balancer a page's ``Origin`` is ``https://`` its Host: accepted with
    ``X-Forwarded-Proto: https``, refused (403, saying why) without it or with another host."""
    a = servers[0]
    host = a.base.removeprefix("http://")
    url = f"{a.base}/sessions?token={TOKEN}"

    async def check() -> list[tuple[int, str]]:
        async with aiohttp.ClientSession() as http:
            out = []
            for origin, proto in (
                (f"https://{host}", "https"),
                (f"https://{host}", None),
                ("https://other.example", "https"),
            ):
                headers = {"Origin": origin, "Host": host}
                if proto is not None:
                    headers["X-Forwarded-Proto"] = proto
                async with http.get(url, headers=headers) as got:
                    out.append((got.status, await got.text()))
            return out

    accepted, plain, other = asyncio.run(check())
    assert accepted[0] == 200, accepted
    assert plain[0] == 403
    assert f"Origin 'https://{host}' is not this page's origin http://{host}" in plain[1]
    assert other[0] == 403
    assert "Origin 'https://other.example' is not this page's origin" in other[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "token", "said"),
    [
        (
            ("--route", "A-1"),
            None,
            "rxstream serve: --route must be 1 to 32 lowercase letters and digits, got 'A-1'",
        ),
        (
            (),
            "short",
            "rxstream serve: RXSTREAM_SERVE_TOKEN must be 16 to 128 of A-Z a-z 0-9 - _, got 5 "
            "characters",
        ),
    ],
)
def test_a_bad_route_or_shared_token_is_refused_in_one_line(
    args: tuple[str, ...], token: str | None, said: str
) -> None:
    """A route name the balancer could not match, or a shared token too short, exits 2 with
    one line naming it (the token itself is not echoed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RXSTREAM_SERVE_TOKEN", None)
    if token is not None:
        env["RXSTREAM_SERVE_TOKEN"] = token
    ran = subprocess.run(
        [sys.executable, "-m", "rxstream", "serve", SERVE_APP, "--port", "0", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert (ran.returncode, ran.stderr.splitlines()) == (2, [said])
