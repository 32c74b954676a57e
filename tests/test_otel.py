"""OpenTelemetry traces of timing records: structure, attributes, times, ranks, the wire."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

import rxstream
from rxstream.timing import (
    ClientTiming,
    HopTiming,
    RunMetrics,
    TimingRecord,
    TraceExport,
    _otel,
    load,
)
from rxstream.timing._client import ClockOffset
from rxstream.timing._otel import otel_from_env
from rxstream.transport._photon import PhotonJoin, Shown

ROOT = Path(__file__).resolve().parent.parent
FRAMES_APP = str(ROOT / "tests" / "apps" / "frames_app.py")
EGRESS_NS = 1_800_000_000_123_456_789
US = 1_000  # ns


def a_record(**changes: Any) -> TimingRecord:
    """A record of three hops, the pace one holding, as a sink folds one."""
    record = TimingRecord(
        stream="video",
        input_seq=7,
        input_at_ms=0,
        cutover=False,
        prompt_generation=2,
        pts=30,
        origin="input.recv",
        total_ms=41.25,
        from_client_ms=None,
        hops=(
            HopTiming("mouse", 0.5, 0.25),
            HopTiming("pace", 1.5, 2.0, 30.0),
            HopTiming("video", 0.75, 6.25),
        ),
        run="r1",
    )
    return replace(record, **changes)


def spans_of(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """The finished spans, roots first, each trace's in start order."""
    spans = list(exporter.get_finished_spans())
    return sorted(spans, key=lambda s: (s.parent is not None, s.start_time or 0))


def duration_ms(span: ReadableSpan) -> float:
    assert span.start_time is not None
    assert span.end_time is not None
    return (span.end_time - span.start_time) / 1e6


def test_a_record_is_one_trace_a_root_and_a_span_per_hop() -> None:
    """One root span (input to egress) whose children are the hops, tiling it in order, each
    lasting its wait + hold + compute with those as attributes, to the microsecond."""
    exporter = InMemorySpanExporter()
    traces = TraceExport(exporter, session="s1")
    traces.record(a_record(), egress_ns=EGRESS_NS)
    traces.close()
    root, *hops = spans_of(exporter)
    assert root.parent is None
    assert root.name == "video input"
    assert dict(root.attributes or {}) == {
        "rxstream.stream": "video",
        "rxstream.input_seq": 7,
        "rxstream.run": "r1",
        "rxstream.generation": 2,
        "rxstream.cutover": False,
        "rxstream.pts": 30,
        "rxstream.origin": "input.recv",
        "rxstream.total_ms": 41.25,
        "rxstream.session": "s1",
    }
    assert root.end_time == EGRESS_NS
    assert root.start_time == EGRESS_NS - 41_250 * US
    assert [span.name for span in hops] == ["mouse", "pace", "video"]
    assert {span.context.trace_id for span in hops} == {root.context.trace_id}
    assert all(
        span.parent is not None and span.parent.span_id == root.context.span_id for span in hops
    )
    assert hops[0].start_time == root.start_time
    assert [a.end_time for a in hops[:-1]] == [b.start_time for b in hops[1:]]
    assert hops[-1].end_time == root.end_time
    for span, hop in zip(hops, a_record().hops, strict=True):
        assert duration_ms(span) == pytest.approx(
            hop.wait_ms + hop.hold_ms + hop.compute_ms, abs=1e-3
        )
        attributes = dict(span.attributes or {})
        assert attributes["rxstream.wait_ms"] == hop.wait_ms
        assert attributes["rxstream.hold_ms"] == hop.hold_ms
        assert attributes["rxstream.compute_ms"] == hop.compute_ms


def test_a_record_with_input_time_ends_at_its_egress_on_the_wall_clock() -> None:
    """Without an explicit egress, a record's egress is its input_at_ms + from_client_ms."""
    exporter = InMemorySpanExporter()
    traces = TraceExport(exporter)
    traces.record(a_record(input_at_ms=1_800_000_000_000, from_client_ms=52.5))
    traces.close()
    root = spans_of(exporter)[0]
    assert root.end_time == 1_800_000_000_052_500_000


def synced(offset_ms: float, rtt_ms: float = 0.5) -> ClockOffset:
    """A page clock ``offset_ms`` ahead of the server's, known to ``rtt_ms``."""
    clock = ClockOffset()
    clock.add(0.0, offset_ms + rtt_ms / 2, rtt_ms)
    return clock


def joined_record() -> TimingRecord:
    """A record the photon join gave its page's part: 3 ms up, then net 2, decode 3, present 5."""
    join = PhotonJoin()
    join.sent("video", 12, (("input.recv", 10.0), ("mouse.in", 10.0005)))
    record = a_record()
    join.record(record)
    shown = Shown("video", 12, 7, 15_043.25, 15_046.25, 15_051.25, event=14_997.0, video="jpeg")
    joined = join.shown(shown, synced(5000.0), page=1)
    assert joined is not None
    return replace(joined[0], client=joined[1])


def test_a_photon_joined_record_runs_from_the_input_event_to_the_pixels() -> None:
    """With the page's report the root spans up + server + net + decode + present: its length
    is the record's photon_ms, and the page's hops follow egress as children."""
    record = joined_record()
    client = record.client
    assert isinstance(client, ClientTiming)
    assert client.up_ms is not None
    exporter = InMemorySpanExporter()
    traces = TraceExport(exporter)
    traces.record(record, egress_ns=EGRESS_NS)
    traces.close()
    root, *children = spans_of(exporter)
    assert [s.name for s in children] == [
        "up",
        "mouse",
        "pace",
        "video",
        "net",
        "decode",
        "present",
    ]
    assert duration_ms(root) == pytest.approx(client.photon_ms, abs=1e-3)
    assert dict(root.attributes or {})["rxstream.photon_ms"] == client.photon_ms
    up, *_, net, decode, present = children
    assert up.start_time == root.start_time
    assert up.end_time == EGRESS_NS - 41_250 * US
    assert net.start_time == EGRESS_NS
    assert duration_ms(net) == pytest.approx(client.net_ms, abs=1e-3)
    assert duration_ms(decode) == pytest.approx(client.decode_ms, abs=1e-3)
    assert duration_ms(present) == pytest.approx(client.present_ms, abs=1e-3)
    assert present.end_time == root.end_time


@pytest.fixture
def in_memory(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The exporter a launch's traces use, in place of the environment's OTLP one."""
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(_otel, "_exporter_from_env", lambda: exporter)
    return exporter


@pytest.mark.slow
def test_a_two_rank_launch_traces_each_record_rank_1_logged(
    in_memory: InMemorySpanExporter, tmp_path: Path
) -> None:
    """Rank 1's sink folds the records; rank 0 traces each: one root per logged record, its
    hops' spans lasting what the log says, to the microsecond."""
    log = tmp_path / "timing.jsonl"
    result = rxstream.launch(
        FRAMES_APP, ranks=2, frames=40, timeout=60, settings=("split=true",), log=log, otel=True
    )
    records = [r for r in load(log).records if not r.self_test]
    assert records
    assert result.statistics[1]["video"].items_out == 40
    spans = spans_of(in_memory)
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == len(records)
    for root, record in zip(roots, records, strict=True):
        attributes = dict(root.attributes or {})
        assert attributes["rxstream.run"] == result.run_id
        assert attributes["rxstream.input_seq"] == record.input_seq
        assert attributes["rxstream.cutover"] is record.cutover
        assert attributes["rxstream.generation"] == record.prompt_generation
        assert duration_ms(root) == pytest.approx(record.total_ms, abs=1e-3)
        children = [
            s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id
        ]
        assert [s.name for s in children] == [hop.name for hop in record.hops]
        for span, hop in zip(children, record.hops, strict=True):
            total = hop.wait_ms + hop.hold_ms + hop.compute_ms
            assert duration_ms(span) == pytest.approx(total, abs=2e-3)  # 3 fields rounded to 1 µs
            assert dict(span.attributes or {})["rxstream.compute_ms"] == pytest.approx(
                hop.compute_ms, abs=1e-3
            )
    assert {"paint", "video"} <= {s.name for s in spans}  # rank 1's stages


@pytest.fixture
def collector() -> Iterator[tuple[str, list[bytes]]]:
    """A local OTLP/HTTP receiver (``/v1/traces``) keeping each request's body."""
    bodies: list[bytes] = []
    ready = threading.Event()
    loop_box: list[Any] = []
    port_box: list[int] = []

    async def traces(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    def serve() -> None:
        import asyncio

        loop = asyncio.new_event_loop()
        loop_box.append(loop)
        app = web.Application()
        app.router.add_post("/v1/traces", traces)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port_box.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port_box[0]}/v1/traces", bodies
    finally:
        loop_box[0].call_soon_threadsafe(loop_box[0].stop)
        thread.join(10)


def test_the_otlp_exporter_sends_what_a_collector_decodes(
    collector: tuple[str, list[bytes]],
) -> None:
    """Over OTLP/HTTP the receiver decodes one resource (service rxstream) with the root and
    its hops, their times and attributes as the record has them."""
    url, bodies = collector
    traces = TraceExport(OTLPSpanExporter(endpoint=url))
    traces.record(a_record(), egress_ns=EGRESS_NS)
    traces.close()
    assert len(bodies) == 1
    request = ExportTraceServiceRequest.FromString(bodies[0])
    (resource,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert service["service.name"] == "rxstream"
    spans = [span for scope in resource.scope_spans for span in scope.spans]
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {"video input", "mouse", "pace", "video"}
    root = by_name["video input"]
    assert root.end_time_unix_nano == EGRESS_NS
    assert root.start_time_unix_nano == EGRESS_NS - 41_250 * US
    assert all(by_name[n].parent_span_id == root.span_id for n in ("mouse", "pace", "video"))
    pace = by_name["pace"]
    assert pace.end_time_unix_nano - pace.start_time_unix_nano == 33_500 * US
    held = {a.key: a.value.double_value for a in pace.attributes if a.key.endswith("_ms")}
    assert held == {"rxstream.wait_ms": 1.5, "rxstream.hold_ms": 30.0, "rxstream.compute_ms": 2.0}
    seq = {a.key: a.value.int_value for a in root.attributes}["rxstream.input_seq"]
    assert seq == 7


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traces asked for without the OpenTelemetry SDK: one ImportError naming the extra."""
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(
        ImportError,
        match=r"^OpenTelemetry traces need the OpenTelemetry SDK, which rxstream does not install "
        r"by default: install the otel extra with pip install 'rxstream\[otel\]' \(missing: ",
    ):
        TraceExport(InMemorySpanExporter())


@pytest.mark.parametrize(
    ("environ", "enabled"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_the_standard_environment_turns_traces_on(environ: dict[str, str], enabled: bool) -> None:
    """OTEL_TRACES_EXPORTER or an OTLP endpoint asks for traces; none or OTEL_SDK_DISABLED not."""
    assert otel_from_env(environ) is enabled


def test_an_unknown_exporter_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_TRACES_EXPORTER naming an exporter rxstream does not make: refused, named."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(
        rxstream.ArgumentError,
        match=r"^OTEL_TRACES_EXPORTER must be otlp or console for rxstream's traces, got 'zipkin'$",
    ):
        TraceExport()


@pytest.mark.slow
def test_a_run_without_exports_never_imports_them() -> None:
    """Off costs nothing: a launch without otel or metrics loads neither package."""
    code = (
        "import sys, rxstream\n"
        f"rxstream.launch({FRAMES_APP!r}, ranks=1, frames=5, timeout=60)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('opentelemetry', 'prometheus_client')))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_served_trace_waits_for_its_page_and_runs_to_the_pixels() -> None:
    """With photon_wait_s the trace of a record goes once a page's report joins it, to the
    pixels; a record no page reported goes without, when closed (never twice)."""
    exporter = InMemorySpanExporter()
    traces = TraceExport(exporter, photon_wait_s=30)
    seen = joined_record()
    assert seen.client is not None
    traces.record(replace(seen, client=None), egress_ns=EGRESS_NS)
    traces.record(a_record(input_seq=8), egress_ns=EGRESS_NS + 1_000_000)
    assert exporter.get_finished_spans() == ()
    traces.photon(seen, seen.client)
    traces.photon(seen, seen.client)  # a second page's report of it: its trace went
    traces.close()
    roots = [s for s in spans_of(exporter) if s.parent is None]
    assert [dict(r.attributes or {})["rxstream.input_seq"] for r in roots] == [7, 8]
    assert traces.traces == 2
    assert traces.joined == 1
    assert duration_ms(roots[0]) == pytest.approx(seen.client.photon_ms, abs=1e-3)
    assert "rxstream.photon_ms" not in dict(roots[1].attributes or {})


def test_photon_wait_is_refused_out_of_range() -> None:
    """photon_wait_s is seconds from 0 to 60: its rule and value said."""
    with pytest.raises(
        rxstream.ArgumentError, match=r"^photon_wait_s must be from 0 to 60 \(seconds\), got -1$"
    ):
        TraceExport(InMemorySpanExporter(), photon_wait_s=-1)


def test_a_launch_s_exports_get_the_page_s_report_as_the_session_logs_it(
    in_memory: InMemorySpanExporter,
) -> None:
    """A photon line logged on rank 0 (log_photon, as the session server does) reaches the
    launch's traces, which then run to the pixels, and its photon histogram."""
    from rxstream.ranks._telemetry import Telemetry
    from rxstream.transport._photon import log_photon

    seen = joined_record()
    assert seen.client is not None
    telemetry = Telemetry(otel=True, metrics_port=None, served=True)
    telemetry.metrics = RunMetrics()  # counted, not served
    try:
        telemetry.on_record(replace(seen, client=None))
        log_photon(replace(seen, client=None), seen.client, page=1)
    finally:
        telemetry.close()
    log_photon(replace(seen, client=None), seen.client, page=2)  # closed: nothing more
    roots = [s for s in in_memory.get_finished_spans() if s.parent is None]
    assert len(roots) == 1
    assert dict(roots[0].attributes or {})["rxstream.photon_ms"] == seen.client.photon_ms
    text = telemetry.metrics.text().decode()
    assert 'rxstream_photon_seconds_count{stream="video"} 1.0' in text


@pytest.mark.slow
def test_rxstream_run_sends_traces_where_the_otel_environment_says(
    collector: tuple[str, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT alone (no --otel) turns traces on; the collector gets the
    run's records, named by its run id."""
    from rxstream import cli

    url, bodies = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url.removesuffix("/v1/traces"))
    monkeypatch.setenv("OTEL_SERVICE_NAME", "demo")
    assert cli.main(["run", FRAMES_APP, "--frames", "40", "--timeout", "60"]) == 0
    assert bodies
    requests = [ExportTraceServiceRequest.FromString(body) for body in bodies]
    services = {
        a.value.string_value
        for r in requests
        for rs in r.resource_spans
        for a in rs.resource.attributes
        if a.key == "service.name"
    }
    assert services == {"demo"}
    roots = [
        span
        for r in requests
        for rs in r.resource_spans
        for scope in rs.scope_spans
        for span in scope.spans
        if not span.parent_span_id
    ]
    assert roots
    runs = {a.value.string_value for s in roots for a in s.attributes if a.key == "rxstream.run"}
    assert len(runs) == 1
    assert next(iter(runs))


def test_rxstream_run_without_the_extra_says_which_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--otel without the OpenTelemetry SDK: exit 1, one line naming the extra."""
    from rxstream import cli

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    assert cli.main(["run", FRAMES_APP, "--otel", "--frames", "2"]) == 1
    err = capsys.readouterr().err
    assert "rxstream run: --otel: OpenTelemetry traces need the otel extra" in err
    assert "install the otel extra with pip install 'rxstream[otel]'" in err
    assert len([line for line in err.splitlines() if "otel extra" in line]) == 1


class Held:
    """A span exporter that takes nothing until released (a collector that hangs), or raises."""

    def __init__(self, *, raises: bool = False) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.raises = raises
        self.spans: list[Any] = []
        self.shut = False

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.entered.set()
        if self.raises:
            raise ConnectionError("collector refused")
        self.release.wait(30)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True


def test_a_hung_collector_never_holds_the_end_of_a_run() -> None:
    """close() waits a bounded time for the exporter, says so in one warning, shuts it down."""
    import structlog

    from rxstream.timing._spanbatch import SpanBatcher

    exporter = Held()
    batcher = SpanBatcher(exporter, delay_s=30)
    batcher.add(["a", "b"])
    with structlog.testing.capture_logs() as logs:
        batcher.close(timeout_s=0.2)
    assert exporter.entered.is_set()
    assert exporter.shut
    assert [log["event"] for log in logs] == ["otel_export_unfinished", "otel_spans_lost"]
    assert logs[0]["reason"] == "the exporter did not take the last spans within 0.2 s"
    lost = {k: logs[1][k] for k in ("exported", "dropped", "failed", "unsent")}
    assert lost == {"exported": 0, "dropped": 0, "failed": 0, "unsent": 2}
    assert batcher.lost == 2
    exporter.release.set()
    batcher.add(["c"])  # closed: dropped, counted
    assert batcher.dropped == 1
    assert batcher.lost == 3


def test_a_failing_collector_is_counted_and_the_spans_past_keep_dropped() -> None:
    """An exporter that raises is warned about and counted; past keep, spans are dropped."""
    import structlog

    from rxstream.timing._spanbatch import SpanBatcher

    exporter = Held(raises=True)
    batcher = SpanBatcher(exporter, delay_s=30, batch=100, keep=3)
    batcher.add(["a", "b"])
    batcher.add(["c", "d"])  # 4 > keep: the whole trace dropped
    with structlog.testing.capture_logs() as logs:
        batcher.close()
    assert batcher.dropped == 2
    assert batcher.failed == 1
    assert logs[0]["event"] == "otel_export_failed"
    assert logs[0]["error"] == "ConnectionError: collector refused"
    assert logs[1]["event"] == "otel_spans_lost"
    lost = {k: logs[1][k] for k in ("exported", "dropped", "failed", "unsent")}
    assert lost == {"exported": 0, "dropped": 2, "failed": 2, "unsent": 0}
    assert batcher.lost == 4


def test_a_run_s_metrics_count_the_trace_spans_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """With traces and metrics, rxstream_otel_spans_dropped_total is TraceExport.lost; a
    collector that takes everything says no loss at close."""
    import socket

    import structlog

    from rxstream.ranks._telemetry import Telemetry

    monkeypatch.setattr(_otel, "_exporter_from_env", lambda: Held(raises=True))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    telemetry = Telemetry(otel=True, metrics_port=port)
    assert telemetry.traces is not None
    assert telemetry.metrics is not None
    telemetry.on_record(a_record())
    telemetry.traces.flush()
    text = telemetry.metrics.text().decode()
    assert "rxstream_otel_spans_dropped_total 4.0" in text
    telemetry.close()
    fine = TraceExport(InMemorySpanExporter())
    fine.record(a_record(), egress_ns=EGRESS_NS)
    with structlog.testing.capture_logs() as logs:
        fine.close()
    assert logs == []
    assert fine.lost == 0


INPUTS_APP = str(ROOT / "tests" / "apps" / "inputs_app.py")
PAGE_OFFSET_MS = 5000.0


class PageLike(rxstream.transport.Transport):
    """Rank 0's session transport standing in for a page: for each record, the frame that
    carried its input is reported shown 2, 3 and 5 ms after egress (on a clock 5 s ahead),
    through the photon join and the ``[photon:…]`` line, as the web session does."""

    def __init__(self) -> None:
        self.join = PhotonJoin()
        self.clock = synced(PAGE_OFFSET_MS)
        self.frames: dict[int, tuple[int, float]] = {}
        self.sent = 0

    @property
    def connected(self) -> bool:
        return True

    def send(self, stream: str, item: rxstream.PipelineItem) -> None:
        self.sent += 1
        timeline = item.metadata.timeline
        self.join.sent(stream, self.sent, timeline)
        self.frames[item.metadata.input_seq] = (self.sent, timeline[0][1] * 1e3)

    def on_timing(self, record: TimingRecord) -> None:
        from rxstream.transport._photon import log_photon

        self.join.record(record)
        seq, origin_ms = self.frames[record.input_seq]
        egress = origin_ms + record.total_ms + PAGE_OFFSET_MS
        shown = Shown(record.stream, seq, record.input_seq, egress + 2, egress + 5, egress + 10)
        joined = self.join.shown(shown, self.clock, page=1)
        assert joined is not None
        log_photon(joined[0], joined[1], page=1)


@pytest.mark.slow
def test_a_served_two_rank_launch_traces_each_record_to_the_pixels(
    in_memory: InMemorySpanExporter, tmp_path: Path
) -> None:
    """Rank 1 folds each record, rank 0's page reports it: each trace has the hops and the
    page's net, decode and present, its root as long as the logged photon_ms (to the µs)."""
    log = tmp_path / "timing.jsonl"
    page = PageLike()
    result = rxstream.launch(
        INPUTS_APP, ranks=2, frames=30, timeout=60, log=log, otel=True, transport=page
    )
    assert set(result.statistics) == {0, 1}
    records = [r for r in load(log).records if r.client is not None]
    assert len(records) >= 25  # a page reported each record the session passed on
    spans = spans_of(in_memory)
    roots = {dict(s.attributes or {})["rxstream.input_seq"]: s for s in spans if s.parent is None}
    assert len(roots) == len(records)
    for record in records:
        assert record.client is not None
        root = roots[record.input_seq]
        assert dict(root.attributes or {})["rxstream.run"] == result.run_id
        assert duration_ms(root) == pytest.approx(record.client.photon_ms, abs=2e-3)
        children = [
            s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id
        ]
        names = [hop.name for hop in record.hops]
        assert [s.name for s in children] == [*names, "net", "decode", "present"]
        assert "work" in names  # rank 1's stage
        net, decode, present = children[-3:]
        assert duration_ms(net) == pytest.approx(record.client.net_ms, abs=1e-3)
        assert duration_ms(decode) == pytest.approx(record.client.decode_ms, abs=1e-3)
        assert duration_ms(present) == pytest.approx(record.client.present_ms, abs=1e-3)
        for span, hop in zip(children, record.hops, strict=False):
            total = hop.wait_ms + hop.hold_ms + hop.compute_ms
            assert duration_ms(span) == pytest.approx(total, abs=2e-3)


def test_two_waiting_records_of_one_input_seq_are_both_traced_each_joined_by_pts() -> None:
    """A steered pipeline's cutovers share input_seq 0: each waiting record keeps its trace,
    and a page's report joins the one of its pts."""
    exporter = InMemorySpanExporter()
    traces = TraceExport(exporter, photon_wait_s=30)
    seen = joined_record()
    assert seen.client is not None
    first = a_record(input_seq=0, cutover=True, pts=1)
    second = a_record(input_seq=0, cutover=True, pts=2)
    traces.record(first, egress_ns=EGRESS_NS)
    traces.record(second, egress_ns=EGRESS_NS)
    traces.photon(second, seen.client)
    traces.close()
    roots = [dict(s.attributes or {}) for s in spans_of(exporter) if s.parent is None]
    assert sorted((r["rxstream.pts"], "rxstream.photon_ms" in r) for r in roots) == [
        (1, False),
        (2, True),
    ]
    assert (traces.traces, traces.joined, traces.early) == (2, 1, 0)


def test_traces_sent_early_past_keep_are_counted() -> None:
    """Past keep waiting records, the oldest goes without its page's part, counted in early."""
    exporter = InMemorySpanExporter()
    traces = TraceExport(exporter, photon_wait_s=30, keep=2)
    for seq in range(5):
        traces.record(a_record(input_seq=seq), egress_ns=EGRESS_NS)
    assert traces.early == 3
    traces.close()
    assert traces.early == 3
    assert traces.traces == 5


def test_rxstream_run_with_only_the_environment_asking_and_no_extra_runs_without_traces(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OTLP endpoint set for other services, no otel extra: the run goes on, one warning
    naming the variable."""
    from rxstream import cli

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert cli.main(["run", FRAMES_APP, "--frames", "2"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "OTEL_" in line]
    assert warned == [
        "rxstream run: warning: OTEL_EXPORTER_OTLP_ENDPOINT is set, which asks for "
        "OpenTelemetry traces, but the otel extra is not installed (missing: "
        "opentelemetry.sdk.trace; install the otel extra with pip install 'rxstream[otel]'): "
        "the run goes on without them"
    ]


@pytest.mark.parametrize(
    ("torchrun", "why"),
    [
        (False, "the otel extra is not installed"),
        (True, "traces are not made under torchrun yet"),
    ],
)
def test_a_launch_the_environment_alone_asks_traces_of_warns_once_and_runs_without(
    monkeypatch: pytest.MonkeyPatch, torchrun: bool, why: str
) -> None:
    """launch(otel=None)'s rule: traces the environment asks for but the run cannot make
    (no extra; under torchrun) are off, said once a process naming the variable."""
    import structlog

    if not torchrun:
        monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    monkeypatch.setattr(_otel, "_said", set())
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    with structlog.testing.capture_logs() as logs:
        assert _otel.env_traces(torchrun=torchrun) is False
        assert _otel.env_traces(torchrun=torchrun) is False
    assert [log["event"] for log in logs] == ["otel_env_ignored"]
    assert logs[0]["reason"].startswith(
        f"OTEL_TRACES_EXPORTER is set, which asks for OpenTelemetry traces, but {why}"
    )
    monkeypatch.delitem(sys.modules, "opentelemetry.sdk.trace", raising=False)
    assert _otel.env_traces(torchrun=False) is True


def test_launch_with_otel_true_and_no_extra_names_what_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """otel=True without the SDK still fails, the error naming otel=True and the extra."""
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(
        ImportError, match=r"^otel=True: OpenTelemetry traces need .*rxstream\[otel\]"
    ):
        rxstream.launch(FRAMES_APP, ranks=1, frames=1, otel=True)


@pytest.mark.parametrize(
    ("environ", "name", "value"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
            },
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "http/json",
        ),
    ],
)
def test_an_otlp_protocol_other_than_http_protobuf_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], name: str, value: str
) -> None:
    """OTLP over gRPC (or JSON) is not what rxstream sends: refused, the variable and value
    said (the traces' own variable first)."""
    for key, setting in environ.items():
        monkeypatch.setenv(key, setting)
    with pytest.raises(
        rxstream.ArgumentError,
        match=rf"^{name} must be http/protobuf for rxstream's traces \(the only OTLP protocol "
        rf"they are sent with\), got '{value}'$",
    ):
        TraceExport()


def test_a_served_launch_s_root_spans_carry_its_session(
    in_memory: InMemorySpanExporter,
) -> None:
    """Traces of a run served by a WebTransport carry its session_id as rxstream.session; a
    headless run's carry none."""
    from rxstream.ranks._telemetry import Telemetry
    from rxstream.transport import WebTransport

    web = WebTransport(port=0)
    served = Telemetry(otel=True, metrics_port=None, transport=web)
    headless = Telemetry(otel=True, metrics_port=None)
    try:
        served.on_record(a_record(client=joined_record().client))
        headless.on_record(a_record(input_seq=8))
        for telemetry in (served, headless):  # one exporter: both sent before either shuts it
            assert telemetry.traces is not None
            telemetry.traces.flush()
    finally:
        served.close()
        headless.close()
    roots = {
        dict(s.attributes or {})["rxstream.input_seq"]: dict(s.attributes or {})
        for s in in_memory.get_finished_spans()
        if s.parent is None
    }
    assert web.session_id
    assert web.session_id not in (web.token or "")
    assert roots[7]["rxstream.session"] == web.session_id
    assert "rxstream.session" not in roots[8]
