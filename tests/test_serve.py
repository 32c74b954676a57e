"""``rxstream serve``: a session per visitor on warm workers, over real sockets."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from _serve import ROOT, SERVE_APP, Server, Visitor, alive, get_json, shm_segments

pytestmark = pytest.mark.slow

BOOKS = re.compile(
    r" \((\d+) frames produced: (\d+) delivered, (\d+) dropped"
    r"(?:, (\d+) in flight as the page left)?\)$"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server of the serve app: 2 workers, a queue of 1, a short grace."""
    loads = tmp_path_factory.mktemp("loads")
    args = ("--workers", "2", "--queue", "1", "--grace", "0.3", "--set", f"loads={loads}")
    with Server(SERVE_APP, *args) as up:
        up.loads = loads  # type: ignore[attr-defined]
        yield up


async def _free(http: aiohttp.ClientSession, server: Server, count: int = 2) -> None:
    """Wait until ``count`` workers are free again (each ended session's worker is reset)."""
    async with asyncio.timeout(20):
        while True:
            status, body, _ = await get_json(http, f"{server.base}/sessions?token={server.token}")
            assert status == 200
            if body["free"] >= count:
                return
            await asyncio.sleep(0.05)


def test_two_sessions_are_steered_each_by_its_own_socket(server: Server) -> None:
    """Two visitors at once get two sessions on two workers; a doc write in one shows in its
    frames and docs only, never in the other's."""

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            a, b = Visitor(http, server), Visitor(http, server)
            await a.open()
            await b.open()
            assert a.id != b.id
            await asyncio.gather(a.frames_until(3), b.frames_until(3))
            await a.set(shade=200)
            await b.set(shade=50)
            a.shades.clear()
            b.shades.clear()
            async with asyncio.timeout(20):
                while not (a.shades[-3:] == [200] * 3 and b.shades[-3:] == [50] * 3):
                    await asyncio.gather(a.frames_until(1), b.frames_until(1))
            assert 50 not in a.shades
            assert 200 not in b.shades
            docs_b = [t["desired"] for t in b.texts if t["type"] == "doc"]
            assert all(d["shade"] != 200 for d in docs_b)
            listed = (await get_json(http, f"{server.base}/sessions?token={server.token}"))[1]
            assert {s["id"] for s in listed["sessions"]} == {a.id, b.id}
            assert {s["worker"] for s in listed["sessions"]} == {0, 1}
            await a.close()
            await b.close()
            await _free(http, server)
            for visitor in (a, b):
                said = server.wait_line(rf"session {visitor.id} ended on worker \d: the page left")
                found = BOOKS.search(said)
                assert found is not None, said
                produced, delivered, dropped, in_flight = (int(n or 0) for n in found.groups())
                assert produced == delivered + dropped + in_flight
                assert delivered >= visitor.frames

    asyncio.run(check())


def test_a_third_visitor_waits_in_the_queue_and_is_served_when_one_leaves(
    server: Server,
) -> None:
    """With both workers busy a browser waits at place 1 (the page updates), an API client
    gets 503 with Retry-After, the full queue refuses everyone, /readyz says 503; once a
    visitor leaves, the waiting one is sent to a session of their own."""

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            assert (await get_json(http, f"{server.base}/readyz"))[0] == 200
            a, b = await Visitor(http, server).open(), await Visitor(http, server).open()
            await asyncio.gather(a.frames_until(1), b.frames_until(1))
            assert (await get_json(http, f"{server.base}/readyz"))[0] == 503
            status, body, headers = await get_json(http, f"{server.base}/?token={server.token}")
            assert status == 503
            assert int(headers["Retry-After"]) >= 1
            assert body["error"] == "every worker is busy"
            html = {"Accept": "text/html"}
            root = f"{server.base}/?token={server.token}"
            async with http.get(root, headers=html, allow_redirects=False) as got:
                assert got.status == 303
                queued = got.headers["Location"]
            assert queued.startswith("/q/")
            async with http.get(server.base + queued) as page:
                assert page.status == 200
                assert "number <b id=place>1</b>" in await page.text()
            async with http.get(root, headers=html, allow_redirects=False) as full:
                assert full.status == 503  # the queue (1) is full
                assert "Retry-After" in full.headers
            state = f"{server.base}{queued}/state"
            assert (await get_json(http, state))[1] == {"place": 1, "queue": 1}
            await a.close()
            async with asyncio.timeout(20):
                while "url" not in (got_state := (await get_json(http, state))[1]):
                    assert got_state["place"] == 1
                    await asyncio.sleep(0.1)
            c = Visitor(http, server)
            c.info = {"url": got_state["url"], "ws": "/ws?token=" + got_state["url"].split("=")[1]}
            await c.attach()
            await c.frames_until(3)
            await b.close()
            await c.close()
            await _free(http, server)

    asyncio.run(check())


def test_a_session_whose_stage_raises_ends_with_a_message_and_the_other_goes_on(
    server: Server,
) -> None:
    """A stage raising ends its session only: its page is told why (``session_ended``, the
    stage and the error), its address then answers 410 with it; the other session keeps
    producing frames, and the worker takes the next visitor."""

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            a, b = await Visitor(http, server).open(), await Visitor(http, server).open()
            await asyncio.gather(a.frames_until(2), b.frames_until(2))
            await a.set(fail=True)
            await a.until_closed()
            (said,) = [e for e in a.errors() if e["code"] == "session_ended"]
            assert said["error"].startswith("session ended: the app failed: ")
            assert "paint" in said["error"]
            assert "RuntimeError: asked to fail" in said["error"]
            before = b.frames
            await b.frames_until(15)  # 0.5 s of frames at 30 fps, after the other's end
            assert b.frames - before == 15
            said_end = server.wait_line(rf"session {a.id} ended on worker \d: the app failed")
            books = BOOKS.search(said_end)
            assert books is not None, said_end
            produced, delivered, dropped, in_flight = (int(n or 0) for n in books.groups())
            assert produced == delivered + dropped + in_flight >= a.frames
            status, body, _ = await get_json(http, server.base + a.info["url"])
            assert status == 410
            assert body["ended"] == said["error"].removeprefix("session ended: ")
            await _free(http, server, 1)
            c = await Visitor(http, server).open()  # the failed session's worker, reset
            await c.frames_until(3)
            await b.close()
            await c.close()
            await _free(http, server)

    asyncio.run(check())


def test_a_session_token_opens_no_other_session(server: Server) -> None:
    """A session's token opens its own page and socket only; the server's token is needed
    for a new session and for /sessions; /healthz answers without one; another Host (a
    rebound DNS name) or another site's Origin is refused."""

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            a, b = await Visitor(http, server).open(), await Visitor(http, server).open()
            a_token = a.info["ws"].split("=")[1]
            other_page = f"{server.base}/s/{b.id}/?token={a_token}"
            assert (await get_json(http, other_page))[0] == 403
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"{server.base}/s/{b.id}/ws?token={a_token}")
            assert refused.value.status == 403
            with pytest.raises(aiohttp.WSServerHandshakeError):
                await http.ws_connect(f"{server.base}/ws?token=not-a-session-token-at-all")
            assert (await get_json(http, f"{server.base}/"))[0] == 403
            assert (await get_json(http, f"{server.base}/sessions?token={a_token}"))[0] == 403
            assert (await get_json(http, f"{server.base}/healthz"))[0] == 200
            rebound = {"Host": "rebound.example:80", "Accept": "application/json"}
            async with http.get(server.base + a.info["url"], headers=rebound) as got:
                assert got.status == 403
                assert (await got.text()).startswith("Host 'rebound.example:80' is not this")
            async with http.get(f"{server.base}/healthz", headers=rebound) as got:
                assert got.status == 200  # a probe under the balancer's own name
            with pytest.raises(aiohttp.WSServerHandshakeError) as foreign:
                await http.ws_connect(server.base + a.info["ws"], origin="http://other.example")
            assert foreign.value.status == 403
            await a.close()
            await b.close()
            await _free(http, server)

    asyncio.run(check())


def test_resources_stay_loaded_across_a_workers_sessions(server: Server) -> None:
    """The app's ``ctx.resource`` is made once per worker process, not once per session."""

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                a = await Visitor(http, server).open()
                await a.frames_until(1)
                await a.close()
                await _free(http, server)

    asyncio.run(check())
    loads = list(Path(server.loads).glob("load-*"))  # type: ignore[attr-defined]
    pids = {path.name.split("-")[1] for path in loads}
    assert len(loads) == len(pids) <= 2


def test_a_worker_that_dies_ends_its_session_only_and_is_replaced(server: Server) -> None:
    """SIGKILL of a worker ends its session with a message; a fresh worker takes its place."""

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            a, b = await Visitor(http, server).open(), await Visitor(http, server).open()
            await asyncio.gather(a.frames_until(1), b.frames_until(1))
            listed = (await get_json(http, f"{server.base}/sessions?token={server.token}"))[1]
            (worker,) = [w for w in listed["workers"] if w["session"] == a.id]
            os.kill(worker["pid"], signal.SIGKILL)
            await a.until_closed()
            (said,) = [e for e in a.errors() if e["code"] == "session_ended"]
            assert said["error"] == "session ended: its worker process died (exit status -9)"
            await b.frames_until(10)
            await b.close()
            await _free(http, server)
            listed = (await get_json(http, f"{server.base}/sessions?token={server.token}"))[1]
            assert worker["pid"] not in {w["pid"] for w in listed["workers"]}

    asyncio.run(check())


def test_idle_and_maximum_sessions_end_and_a_stop_leaves_no_process(tmp_path: Path) -> None:
    """``--idle-s`` ends a session without input, ``--max-session-s`` one with; SIGTERM
    stops the server (143) with no worker process and no /dev/shm segment left."""
    args = ("--workers", "2", "--idle-s", "1", "--max-session-s", "3", "--grace", "0.2")
    with Server(SERVE_APP, *args) as server:

        async def check() -> list[int]:
            async with aiohttp.ClientSession() as http:
                idle, busy = await Visitor(http, server).open(), await Visitor(http, server).open()
                listed = await get_json(http, f"{server.base}/sessions?token={server.token}")
                pids = [w["pid"] for w in listed[1]["workers"]]

                async def steer_on() -> None:
                    with_input = busy.ws
                    assert with_input is not None
                    for shade in range(1, 200):
                        await busy.set(shade=shade)
                        await busy.frames_until(3)

                feeding = asyncio.ensure_future(steer_on())
                await idle.until_closed()
                assert [e["error"] for e in idle.errors() if e["code"] == "session_ended"] == [
                    "session ended: no input for 1 s (--idle-s)"
                ]
                with pytest.raises(ConnectionError):
                    await feeding
                assert [e["error"] for e in busy.errors() if e["code"] == "session_ended"] == [
                    "session ended: it reached its maximum of 3 s (--max-session-s)"
                ]
                return pids

        pids = asyncio.run(check())
        assert all(alive(pid) for pid in pids)
        assert server.stop(signal.SIGTERM) == 143
    assert not [pid for pid in pids if alive(pid)]
    assert server.process is not None
    makers = (*pids, server.process.pid)
    ours = [n for n in shm_segments() if any(n.startswith(f"rxs_{pid}_") for pid in makers)]
    assert ours == []  # (a ring's name starts with its maker's pid: other programs' are not ours)
    assert "rxstream serve: SIGTERM: every session ended, every worker stopped" in server.lines


def test_timing_lines_carry_the_session_and_timing_picks_one(tmp_path: Path) -> None:
    """Every timing line of a served session carries its id; ``rxstream timing --session``
    summarises that session's records and names the sessions when given another."""
    log = tmp_path / "timing.jsonl"
    with Server(SERVE_APP, "--workers", "2", "--log", str(log)) as server:

        async def check() -> tuple[str, str]:
            async with aiohttp.ClientSession() as http:
                a, b = await Visitor(http, server).open(), await Visitor(http, server).open()
                await asyncio.gather(a.frames_until(2), b.frames_until(2))
                for visitor, shade in ((a, 10), (a, 20), (a, 30), (b, 99)):
                    await visitor.steer(shade=shade)
                    async with asyncio.timeout(20):
                        while visitor.shades[-1:] != [shade]:
                            await visitor.frames_until(1)
                return a.id, b.id

        a_id, b_id = asyncio.run(check())
        server.stop()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    timing = [x for x in lines if x["event"].startswith("[timing:") and not x.get("self_test")]
    assert {x["session"] for x in timing} == {a_id, b_id}
    assert sum(x["session"] == a_id for x in timing) == 3
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    summary = subprocess.run(
        [sys.executable, "-m", "rxstream", "timing", str(log), "--session", a_id, "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert json.loads(summary.stdout)["records"] == 3
    refused = subprocess.run(
        [sys.executable, "-m", "rxstream", "timing", str(log), "--session", "nope"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        f"rxstream timing: {log}: --session must be a session with timing records in the "
        "log, got 'nope'; the sessions with some: "
    )
    assert a_id in refused.stderr
    assert b_id in refused.stderr


def test_public_serves_without_a_token_and_limits_each_address() -> None:
    """With ``--public`` anyone opens a session without the token; an address that asks
    for more than 4 new sessions at once gets 429 with Retry-After; /sessions keeps its
    token (printed on a line of its own)."""
    with Server(SERVE_APP, "--workers", "1", "--public") as server:
        assert server.token == ""
        listing = server.wait_line(r"the sessions at ")
        token = listing.rsplit("token=", 1)[1]

        async def check() -> None:
            async with aiohttp.ClientSession() as http:
                answers = [(await get_json(http, f"{server.base}/"))[0] for _ in range(4)]
                assert answers == [200, 503, 503, 503]
                status, body, headers = await get_json(http, f"{server.base}/")
                assert status == 429
                assert body["error"] == "too many new sessions from this address"
                assert int(headers["Retry-After"]) >= 1
                assert (await get_json(http, f"{server.base}/sessions"))[0] == 403
                assert (await get_json(http, f"{server.base}/sessions?token={token}"))[0] == 200

        asyncio.run(check())


@pytest.mark.parametrize(
    ("app", "args", "status", "said"),
    [
        ("nope.py", (), 1, "rxstream serve: app file 'nope.py' does not exist"),
        (
            SERVE_APP,
            ("--host", "0.0.0.0"),
            2,
            "rxstream serve: --host must be a loopback address unless --allow-remote, "
            "got '0.0.0.0'",
        ),
    ],
)
def test_an_app_that_will_not_load_or_a_bad_flag_is_one_line(
    app: str, args: tuple[str, ...], status: int, said: str
) -> None:
    """An app that cannot be imported exits 1, a refused flag 2, each said in one line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ran = subprocess.run(
        [sys.executable, "-m", "rxstream", "serve", app, "--port", "0", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert (ran.returncode, ran.stderr.splitlines()) == (status, [said])
