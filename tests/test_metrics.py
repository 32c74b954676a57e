"""Prometheus metrics of a run: the exposition, one endpoint for every rank, a real scrape."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

import rxstream
from rxstream import cli
from rxstream.timing import RunMetrics, TimingRecord
from rxstream.timing._emit import listen

ROOT = Path(__file__).resolve().parent.parent
FRAMES_APP = str(ROOT / "tests" / "apps" / "frames_app.py")


def samples(text: bytes | str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition, by name and labels."""
    body = text.decode() if isinstance(text, bytes) else text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """The one sample ``name`` with ``labels`` among its labels."""
    hits = [v for (n, ls), v in found.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def numbered(n: int) -> Iterator[rxstream.PipelineItem]:
    """Items of inputs 1..n (each folds one timing record at the sink)."""
    for i in range(n):
        md = rxstream.PipelineMetadata(pts=i, input_seq=i + 1, input_at_ms=1000 + i)
        yield rxstream.PipelineItem(i, md)


def test_the_exposition_holds_the_run_s_books_and_its_records(ctx: rxstream.Context) -> None:
    """A stage's counters equal its statistics, and each hop histogram counts the records."""
    pipeline = (
        ctx.source(lambda: numbered(12), name="frames")
        | ctx.pipe(lambda i: i * 2, name="double")
        | ctx.stream("video")
    )
    metrics = RunMetrics()
    records: list[TimingRecord] = []

    def keep(record: TimingRecord) -> None:
        records.append(record)
        metrics.record(record)

    with listen(keep):
        pipeline.drive(frames=12)
    stats = pipeline.statistics()
    metrics.stats({0: stats})
    found = samples(metrics.text())
    for name in ("frames", "double", "video"):
        s = stats[name]
        assert value(found, "rxstream_stage_items_in_total", rank="0", stage=name) == s.items_in
        assert value(found, "rxstream_stage_items_out_total", rank="0", stage=name) == s.items_out
        assert value(found, "rxstream_stage_cutovers_total", stage=name) == s.cutovers
        assert value(found, "rxstream_stage_inbox_depth", stage=name) == s.inbox_depth
    assert stats["video"].items_out == 12
    assert len(records) == 12
    for hop in ("double", "video"):
        for part in ("wait", "hold", "compute"):
            count = value(found, f"rxstream_hop_{part}_seconds_count", stream="video", stage=hop)
            assert count == len(records)
        total = sum(h.compute_ms for r in records for h in r.hops if h.name == hop) / 1e3
        summed = value(found, "rxstream_hop_compute_seconds_sum", stream="video", stage=hop)
        assert summed == pytest.approx(total)
    assert value(found, "rxstream_end_to_end_seconds_count", stream="video") == 12


def test_drops_are_counted_by_reason_and_fps_from_two_snapshots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dropped carries the reason as a label; fps is items out per second between snapshots."""
    from types import SimpleNamespace

    from rxstream._kernel._stats import StageStatistics
    from rxstream.timing import _prometheus

    clock = iter([10.0, 12.0])  # the two snapshots, 2 s apart on the monotonic clock
    monkeypatch.setattr(_prometheus, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    metrics = RunMetrics()
    metrics.stats({1: {"work": StageStatistics("work", "pipe", 10, 4, dropped={"latest": 6})}})
    metrics.stats({1: {"work": StageStatistics("work", "pipe", 20, 9, dropped={"latest": 11})}})
    found = samples(metrics.text())
    assert (
        value(found, "rxstream_stage_dropped_total", rank="1", stage="work", reason="latest") == 11
    )
    assert value(found, "rxstream_stage_items_out_total", rank="1", stage="work") == 9
    assert value(found, "rxstream_stage_fps", rank="1", stage="work") == 2.5  # (9 - 4) / 2 s


def test_fps_of_a_rank_s_stage_is_over_its_own_snapshot_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1's report seen twice, or two landing between status calls, keep fps at its rate:
    computed when the snapshot changed, over the times rank 1 took them."""
    from types import SimpleNamespace

    from rxstream._kernel._stats import StageStatistics
    from rxstream.timing import _prometheus

    clock = iter([10.0, 10.5, 11.0, 11.5])  # rank 0's status calls, every 0.5 s
    monkeypatch.setattr(_prometheus, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    metrics = RunMetrics()
    rows = []
    # rank 1 at 30/s, reporting at its own 100.2, 100.7, (none), 101.2 then 101.7 (one seen)
    for out, taken in ((0, 100.2), (15, 100.7), (15, 100.7), (45, 101.7)):
        stage = StageStatistics("work", "pipe", out, out, taken_s=taken)
        metrics.stats({1: {"work": stage}})
        rows.append(metrics.snapshot()[1].get((1, "work")))
    assert rows == [None, pytest.approx(30.0), pytest.approx(30.0), pytest.approx(30.0)]
    assert value(samples(metrics.text()), "rxstream_stage_fps", rank="1", stage="work") == (
        pytest.approx(30.0)
    )


def test_a_snapshot_carries_the_time_it_was_taken(ctx: rxstream.Context) -> None:
    """A run's statistics say when they were taken, on the monotonic clock (between the
    calls), so a rate between two needs no clock of the reader's."""
    import time

    pipeline = ctx.source(lambda: numbered(3), name="frames") | ctx.stream("video")
    pipeline.drive(frames=3)
    before = time.monotonic()
    stats = pipeline.statistics()
    after = time.monotonic()
    assert stats
    assert all(before <= s.taken_s <= after for s in stats.values())


def test_two_runs_never_share_a_series() -> None:
    """Each RunMetrics has its own registry: one run's records are not in the other's."""
    first, second = RunMetrics(), RunMetrics()
    from rxstream.timing import HopTiming

    first.record(TimingRecord("video", 1, 0, False, 0, 0, "x", 1.0, None, (HopTiming("a", 0, 1),)))
    assert value(samples(first.text()), "rxstream_end_to_end_seconds_count", stream="video") == 1
    assert not [k for k in samples(second.text()) if k[0] == "rxstream_end_to_end_seconds_count"]


def test_the_aiohttp_handler_serves_the_exposition() -> None:
    """The handler a session server routes at /metrics answers the text format."""
    metrics = RunMetrics()
    from rxstream._kernel._stats import StageStatistics

    metrics.stats({0: {"video": StageStatistics("video", "stream", 3, 3)}})

    async def get() -> tuple[int, str, str]:
        app = web.Application()
        app.router.add_get("/metrics", metrics.aiohttp_handler())
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/metrics")
            return response.status, response.headers["Content-Type"], await response.text()

    status, kind, body = asyncio.run(get())
    assert status == 200
    assert kind.startswith("text/plain; version=0.0.4")
    assert value(samples(body), "rxstream_stage_items_out_total", stage="video") == 3


@pytest.mark.slow
def test_a_two_rank_run_has_one_endpoint_with_rank_1_s_stages() -> None:
    """Rank 0's endpoint serves rank 1's stage series (reported through rank 0): a scrape
    mid-run counts some of the items the run's final statistics count, never more."""
    port = free_port()
    stop = threading.Event()
    seen: list[dict[tuple[str, frozenset[tuple[str, str]]], float]] = []

    def scrape(_: object) -> None:
        if stop.is_set():
            return
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            found = samples(answer.read())
        painted = [
            v
            for (n, ls), v in found.items()
            if n == "rxstream_stage_items_in_total"
            and ("rank", "1") in ls
            and ("stage", "paint") in ls
        ]
        if painted and painted[0] >= 1:
            seen.append(found)
            stop.set()

    result = rxstream.launch(
        FRAMES_APP,
        ranks=2,
        timeout=60,
        settings=("split=true", "fps=60"),
        metrics_port=port,
        on_status=scrape,
        stop=stop,
    )
    assert seen, "rank 1's stages never reached the endpoint"
    found = seen[0]
    assert set(result.statistics) == {0, 1}
    final = result.statistics
    painted = value(found, "rxstream_stage_items_in_total", rank="1", stage="paint")
    assert 1 <= painted <= final[1]["paint"].items_in
    paced = value(found, "rxstream_stage_items_out_total", rank="0", stage="pace")
    assert paced <= final[0]["pace"].items_out
    assert final[0]["pace"].items_out >= 1
    with pytest.raises(urllib.error.URLError):  # the endpoint is gone with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_metrics_port_out_of_range_is_refused_naming_it() -> None:
    """launch's metrics_port must be a TCP port; rxstream run's --metrics-port too."""
    with pytest.raises(
        rxstream.ArgumentError,
        match=r"^metrics_port must be a TCP port from 1 to 65535, got 70000$",
    ):
        rxstream.launch(FRAMES_APP, ranks=1, frames=1, metrics_port=70000)


def test_cli_refuses_a_bad_metrics_port(capsys: pytest.CaptureFixture[str]) -> None:
    """--metrics-port 0: a usage error naming the flag and the rule."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", FRAMES_APP, "--metrics-port", "0"])
    assert exited.value.code == 2
    assert "argument --metrics-port: must be a TCP port from 1 to 65535, got '0'" in (
        capsys.readouterr().err
    )


def query(base: str, promql: str) -> list[dict[str, object]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    result: list[dict[str, object]] = body["data"]["result"]
    return result


def wait_for(check: object, what: str, timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()  # type: ignore[operator]
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_real_prometheus_scrapes_a_headless_run(tmp_path: Path) -> None:
    """Prometheus scrapes rxstream run --metrics-port twice or more; its query API then gives
    the sink's items out and the paint hop's compute histogram count, both > 0."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus; .ci/run)")
    metrics_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: rxstream\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(
        [sys.executable, "-m", "rxstream", "run", FRAMES_APP, "--timeout", "90",
         "--set", "fps=60", "--metrics-port", str(metrics_port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    prometheus = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{prom_port}"
    try:

        def scraped_twice() -> bool:
            try:
                got = query(base, 'count_over_time(up{job="rxstream"}[5m])')
            except OSError:
                return False
            ups = query(base, 'up{job="rxstream"}')
            return bool(got) and float(got[0]["value"][1]) >= 2 and bool(ups)  # type: ignore[index]

        wait_for(scraped_twice, "two scrapes of the run")
        out = wait_for(
            lambda: query(base, 'rxstream_stage_items_out_total{stage="video",rank="0"} > 0'),
            "the sink's items out",
        )
        hop = wait_for(
            lambda: query(base, 'rxstream_hop_compute_seconds_count{stage="paint"} > 0'),
            "the paint hop's histogram",
        )
        assert float(out[0]["value"][1]) > 0  # type: ignore[index]
        assert float(hop[0]["value"][1]) > 0  # type: ignore[index]
        assert hop[0]["metric"]["stream"] == "video"  # type: ignore[index]
    finally:
        prometheus.terminate()
        run.terminate()
        prometheus.wait(20)
        _, err = run.communicate(timeout=30)
    assert f"Prometheus metrics at http://127.0.0.1:{metrics_port}/metrics" in err


def test_exports_asked_for_under_torchrun_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun the exports are not made yet: asking for them is refused, named."""
    from rxstream.ranks import _torchrun

    monkeypatch.setattr(_torchrun, "torchrun_env", lambda: object())
    with pytest.raises(
        rxstream.ArgumentError,
        match=r"^metrics_port=9464: traces and metrics are exports of a spawned launch, not "
        r"made under torchrun yet$",
    ):
        rxstream.launch(FRAMES_APP, ranks=1, frames=1, metrics_port=9464)


def test_a_page_s_report_reaches_only_the_launch_of_its_run() -> None:
    """Two launches in one process: a photon report of run A's record counts in A's photon
    histogram only, and B's in B's."""
    from rxstream.ranks._telemetry import Telemetry
    from rxstream.timing import ClientTiming, HopTiming
    from rxstream.timing._emit import joined

    def record(run: str) -> TimingRecord:
        return TimingRecord(
            "video", 1, 0, False, 0, 0, "x", 1.0, None, (HopTiming("a", 0, 1),), run=run
        )

    a = Telemetry(otel=False, metrics_port=None)
    b = Telemetry(otel=False, metrics_port=None)
    metrics = a.metrics, b.metrics = RunMetrics(), RunMetrics()
    try:
        a.on_record(record("runA"))
        b.on_record(record("runB"))
        joined(record("runA"), ClientTiming(50.0, 5.0, 1.0, 1.0))
        joined(record("runB"), ClientTiming(60.0, 5.0, 1.0, 1.0))
        joined(record("runB"), ClientTiming(70.0, 5.0, 1.0, 1.0))
    finally:
        a.close()
        b.close()
    for made, count in zip(metrics, (1, 2), strict=True):
        found = samples(made.text())
        assert value(found, "rxstream_photon_seconds_count", stream="video") == count


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """GET ``url``: the status and the body, an HTTP error's too."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_session_server_serves_the_run_s_metrics_behind_its_token() -> None:
    """WebTransport(metrics=True): /metrics answers with the launch's metrics given the token
    (query or bearer), 403 without it or from another Host, 404 once the launch is over."""
    from rxstream._kernel._stats import StageStatistics
    from rxstream.ranks._telemetry import Telemetry
    from rxstream.transport import WebTransport

    web = WebTransport(port=0, metrics=True)
    telemetry = Telemetry(otel=False, metrics_port=None, transport=web)
    assert telemetry.metrics is not None
    telemetry.metrics.stats({0: {"work": StageStatistics("work", "pipe", 5, 4)}})
    web.server.serve(web.url)
    try:
        status, body = get(web.metrics_url)
        assert status == 200
        assert value(samples(body), "rxstream_stage_items_out_total", rank="0", stage="work") == 4
        bare = web.metrics_url.split("?")[0]
        assert get(bare, {"Authorization": f"Bearer {web.token}"})[0] == 200
        status, body = get(bare)
        assert (status, body) == (
            403,
            "403 Forbidden: the session token is missing: open the URL that rxstream printed "
            "(?token=…)\n",
        )
        assert get(bare, {"Authorization": "Bearer " + "x" * 32})[0] == 403
        assert get(web.metrics_url, {"Host": "evil.example:80"})[0] == 403
        telemetry.close()
        status, body = get(web.metrics_url)
        assert status == 404
        assert body == (
            "404 Not Found: this session serves no metrics (rxstream run --serve --metrics)\n"
        )
    finally:
        telemetry.close()
        web.server.stop()


@pytest.mark.slow
def test_a_served_launch_with_metrics_is_scraped_at_the_session_s_metrics() -> None:
    """launch with WebTransport(metrics=True): the session server's /metrics has the run's
    stage counters while it runs, at most the final statistics."""
    from rxstream.transport import WebTransport

    web = WebTransport(port=0, metrics=True)
    stop = threading.Event()
    seen: list[dict[tuple[str, frozenset[tuple[str, str]]], float]] = []

    def scrape(_: object) -> None:
        if stop.is_set():
            return
        status, body = get(web.metrics_url)
        assert status == 200, body
        found = samples(body)
        outs = [v for (n, ls), v in found.items() if n == "rxstream_stage_items_out_total"]
        if outs and max(outs) >= 1:
            seen.append(found)
            stop.set()

    result = rxstream.launch(
        FRAMES_APP, ranks=1, timeout=60, transport=web, on_status=scrape, stop=stop
    )
    assert seen, "the run's stages never reached the session's /metrics"
    final = result.statistics[0]
    for name, stage in final.items():
        scraped = value(seen[0], "rxstream_stage_items_out_total", rank="0", stage=name)
        assert scraped <= stage.items_out


def test_cli_metrics_goes_with_serve(capsys: pytest.CaptureFixture[str]) -> None:
    """--metrics is the session server's /metrics: without --serve a usage error saying so
    and naming --metrics-port for a headless run."""
    from rxstream import cli

    assert cli.main(["run", FRAMES_APP, "--metrics", "--frames", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "rxstream run: --metrics goes with --serve (the session server's /metrics); a headless "
        "run: --metrics-port N"
    ]
