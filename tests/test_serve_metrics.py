"""``rxstream serve --metrics``: one /metrics with the front's series and each live session's
run metrics under its own ``session`` label."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from _serve import SERVE_APP, Server, Visitor, get_json
from prometheus_client.parser import text_string_to_metric_families

from rxstream.serve._metrics import REASONS, FrontMetrics, end_reason, merge

pytestmark = pytest.mark.slow

SLACK = 60
"""Frames a stage counter may differ from a session's ``delivered`` at the scrape's moment:
the run's books are a snapshot of every half second, the app paces 30 a second."""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One server of the serve app with --metrics: 2 workers, a short grace."""
    with Server(SERVE_APP, "--workers", "2", "--grace", "0.3", "--metrics") as up:
        yield up


def samples(text: str) -> list[Any]:
    """Every sample of an exposition, parsed back (each family's HELP and TYPE once)."""
    names = [f.name for f in text_string_to_metric_families(text)]
    assert len(names) == len(set(names)), names
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def value(found: list[Any], name: str, **labels: str) -> float:
    """The one sample ``name`` whose labels include ``labels``."""
    got = [s.value for s in found if s.name == name and labels.items() <= s.labels.items()]
    assert len(got) == 1, (name, labels, got)
    return float(got[0])


async def scrape(http: aiohttp.ClientSession, server: Server, token: str | None) -> Any:
    url = f"{server.base}/metrics" + (f"?token={token}" if token is not None else "")
    async with http.get(url) as got:
        return got.status, await got.text()


def test_metrics_label_each_live_session_and_drop_an_ended_one(server: Server) -> None:
    """Two live sessions: /metrics parses, each session's stage counters sit under its own
    session label near its /sessions books, the front's gauges say 2 live and 0 free; without
    the token 403 (a bearer token does); once a session ended its series are gone and its
    end is counted."""

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            a, b = await Visitor(http, server).open(), await Visitor(http, server).open()
            await asyncio.gather(a.frames_until(20), b.frames_until(20))
            reading = [asyncio.ensure_future(v.until_closed(60)) for v in (a, b)]
            listing = f"{server.base}/sessions?token={server.token}"
            before = {s["id"]: s for s in (await get_json(http, listing))[1]["sessions"]}
            status, text = await scrape(http, server, server.token)
            after = {s["id"]: s for s in (await get_json(http, listing))[1]["sessions"]}
            assert status == 200, text
            found = samples(text)
            assert value(found, "rxstream_serve_sessions_live") == 2
            assert value(found, "rxstream_serve_queue_length") == 0
            assert value(found, "rxstream_serve_workers", state="busy") == 2
            assert value(found, "rxstream_serve_workers", state="free") == 0
            started = value(found, "rxstream_serve_sessions_started_total")
            assert started >= 2
            for visitor in (a, b):
                out = value(
                    found, "rxstream_stage_items_out_total", session=visitor.id, stage="paint"
                )
                low, high = before[visitor.id]["delivered"], after[visitor.id]["delivered"]
                assert low - SLACK <= out <= high + SLACK, (visitor.id, low, out, high)
                assert out >= 1
            sessions = {s.labels["session"] for s in found if "session" in s.labels}
            assert sessions == {a.id, b.id}
            assert (await scrape(http, server, None))[0] == 403
            assert (await scrape(http, server, "wrong"))[0] == 403
            bearer = {"Authorization": f"Bearer {server.token}"}
            async with http.get(f"{server.base}/metrics", headers=bearer) as got:
                assert got.status == 200
                assert got.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            ended_before = value(found, "rxstream_serve_sessions_ended_total", reason="page_left")
            await a.close()
            async with asyncio.timeout(20):
                while a.id in {s["id"] for s in (await get_json(http, listing))[1]["sessions"]}:
                    await asyncio.sleep(0.05)
            found = samples((await scrape(http, server, server.token))[1])
            assert {s.labels["session"] for s in found if "session" in s.labels} == {b.id}
            assert value(found, "rxstream_serve_sessions_live") == 1
            ended = value(found, "rxstream_serve_sessions_ended_total", reason="page_left")
            assert ended == ended_before + 1
            await b.close()
            for task in reading:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    asyncio.run(check())


@pytest.mark.parametrize(
    ("why", "reason"),
    [
        ("the page left", "page_left"),
        ("no input for 120 s (--idle-s)", "idle"),
        ("it reached its maximum of 30 s (--max-session-s)", "max_duration"),
        ("the app's pipeline ended", "pipeline_ended"),
        ("the app failed: RuntimeError: asked to fail (app.py:3); the page left", "app_failed"),
        ("its worker process died (exit status -9)", "worker_died"),
        ("the server stopped", "server_stopped"),
        ("the server went away", "server_stopped"),
        ("something new", "other"),
    ],
)
def test_an_end_is_counted_under_a_bounded_reason(why: str, reason: str) -> None:
    """Each why a session ends with maps to one of the fixed reasons, by how it begins."""
    assert reason in REASONS
    assert end_reason(why) == reason


def test_merge_gives_each_family_one_help_and_each_sample_its_session() -> None:
    """Two sessions' expositions merge: one HELP/TYPE per family, every sample of a session
    labelled with it, the front's series unlabelled, histograms intact."""
    run = (
        "# HELP rxstream_stage_items_out_total items out\n"
        "# TYPE rxstream_stage_items_out_total counter\n"
        'rxstream_stage_items_out_total{{rank="0",stage="video"}} {n}\n'
        "# HELP rxstream_end_to_end_seconds input to egress\n"
        "# TYPE rxstream_end_to_end_seconds histogram\n"
        'rxstream_end_to_end_seconds_bucket{{stream="video",le="0.1"}} {n}\n'
        'rxstream_end_to_end_seconds_bucket{{stream="video",le="+Inf"}} {n}\n'
        'rxstream_end_to_end_seconds_count{{stream="video"}} {n}\n'
        'rxstream_end_to_end_seconds_sum{{stream="video"}} 0.5\n'
    )
    front = FrontMetrics()
    front.session_started()
    front.session_ended("the page left")
    families = front.families(live=2, queue=0, workers=["busy", "busy"])
    text = merge(families, [("a1", run.format(n=3)), ("b2", run.format(n=7))]).decode()
    assert text.count("# TYPE rxstream_stage_items_out_total counter") == 1
    found = samples(text)
    assert value(found, "rxstream_stage_items_out_total", session="a1") == 3
    assert value(found, "rxstream_stage_items_out_total", session="b2") == 7
    assert value(found, "rxstream_end_to_end_seconds_count", session="b2") == 7
    assert value(found, "rxstream_end_to_end_seconds_bucket", session="a1", le="+Inf") == 3
    assert value(found, "rxstream_serve_sessions_ended_total", reason="page_left") == 1
    assert value(found, "rxstream_serve_sessions_started_total") == 1
    assert value(found, "rxstream_serve_workers", state="busy") == 2
    assert (
        "session" not in next(s for s in found if s.name == "rxstream_serve_sessions_live").labels
    )
