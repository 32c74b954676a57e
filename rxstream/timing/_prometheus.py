"""A run's stage statistics and timing records as Prometheus metrics, on a registry of its own.

:class:`RunMetrics` takes every rank's stage statistics as the launch learns them (rank 0
hears each rank's every half second) and every timing record rank 0 sees (its own sinks' and
those a rank > 0 forwards), so one endpoint serves the whole run. The stage series are the
latest snapshot's (a counter is the run's own books, not a count kept beside them); the
timing series are histograms in seconds, the Prometheus base unit. Each :class:`RunMetrics`
has its own ``CollectorRegistry``: two runs, or a test and a session, never share a series.

prometheus-client is imported when a :class:`RunMetrics` is made, not with this module.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from rxstream._kernel._stats import StageStatistics
from rxstream.timing._client import ClientTiming
from rxstream.timing._histograms import Histogram
from rxstream.timing._record import TimingRecord

__all__ = ["CONTENT_TYPE", "HOP_BUCKETS_S", "TOTAL_BUCKETS_S", "MetricsServer", "RunMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format's content type."""

HOP_BUCKETS_S = (
    0.0001,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)
"""A hop's wait, hold or compute: 0.1 ms to 5 s."""

TOTAL_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
"""Input to egress, input to pixels: 1 ms to 10 s."""

Statistics = Mapping[int, Mapping[str, StageStatistics]]


class RunMetrics:
    """One run's metrics: feed it :meth:`stats` and :meth:`record`; read :meth:`text`.

    Series (``rank`` and ``stage`` label the stage ones, ``stream`` and ``stage`` the hop ones):
    ``rxstream_stage_items_in_total``, ``rxstream_stage_items_out_total``,
    ``rxstream_stage_dropped_total`` (with ``reason``), ``rxstream_stage_cutovers_total``,
    ``rxstream_stage_inbox_depth``, ``rxstream_stage_fps`` (items out per second between the
    last two snapshots); ``rxstream_hop_wait_seconds``, ``rxstream_hop_hold_seconds``,
    ``rxstream_hop_compute_seconds``, ``rxstream_end_to_end_seconds`` (input to egress) and
    ``rxstream_photon_seconds`` (input to pixels, when a page reported); with traces
    (:attr:`spans_lost` set), ``rxstream_otel_spans_dropped_total``.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._stats: dict[int, dict[str, StageStatistics]] = {}
        self._fps: dict[tuple[int, str], float] = {}
        self._seen: dict[tuple[int, str], tuple[float, StageStatistics]] = {}
        """Each stage's last snapshot taken in, and its time."""
        hop = ("stream", "stage")
        self._wait = Histogram(
            "rxstream_hop_wait_seconds",
            "Queue-wait of a hop: from the previous stamp to the stage's .in",
            hop,
            HOP_BUCKETS_S,
        )
        self._hold = Histogram(
            "rxstream_hop_hold_seconds",
            "Hold of a hop: a pace or window keeping the item for its tick or window",
            hop,
            HOP_BUCKETS_S,
        )
        self._compute = Histogram(
            "rxstream_hop_compute_seconds",
            "Compute of a hop: from the stage's .in (or .hold) to its .out",
            hop,
            HOP_BUCKETS_S,
        )
        self._gpu = Histogram(
            "rxstream_hop_gpu_seconds",
            "GPU time of a CUDA stage's call: between CUDA events around it on its stream",
            hop,
            HOP_BUCKETS_S,
        )
        self._total = Histogram(
            "rxstream_end_to_end_seconds",
            "Input to egress of a timing record (its total_ms)",
            ("stream",),
            TOTAL_BUCKETS_S,
        )
        self._photon = Histogram(
            "rxstream_photon_seconds",
            "Input to pixels of a timing record a page reported (its photon_ms)",
            ("stream",),
            TOTAL_BUCKETS_S,
        )
        self.histograms = (
            self._wait,
            self._hold,
            self._compute,
            self._gpu,
            self._total,
            self._photon,
        )
        self._hops: dict[tuple[str, str], tuple[list[Any], list[Any], list[Any]]] = {}
        """Each hop's wait, hold and compute series, found once."""
        self.spans_lost: Callable[[], int] | None = None
        """The run's lost trace spans (:attr:`TraceExport.lost`), when it exports traces:
        ``rxstream_otel_spans_dropped_total``."""
        self.registry.register(_Collector(self))

    def record(self, record: TimingRecord) -> None:
        """Count one timing record in the hop, end-to-end and photon histograms (any
        thread). A self test's record is left out, as ``rxstream timing`` leaves it out."""
        if record.self_test:
            return
        stream = record.stream
        hop_bounds, total_bounds = self._wait.bounds_ms, self._total.bounds_ms
        hops = self._hops
        with self._lock:
            for hop in record.hops:
                rows = hops.get((stream, hop.name))
                if rows is None:
                    key = (stream, hop.name)
                    rows = hops[key] = (
                        self._wait.series(key),
                        self._hold.series(key),
                        self._compute.series(key),
                    )
                for row, ms in zip(rows, (hop.wait_ms, hop.hold_ms, hop.compute_ms), strict=True):
                    row[0][bisect_left(hop_bounds, ms)] += 1
                    row[1] += ms
                if hop.gpu_ms is not None:  # a CUDA stage's, where its events resolved
                    row = self._gpu.series((stream, hop.name))
                    row[0][bisect_left(hop_bounds, hop.gpu_ms)] += 1
                    row[1] += hop.gpu_ms
            row = self._total.series((stream,))
            row[0][bisect_left(total_bounds, record.total_ms)] += 1
            row[1] += record.total_ms
        if record.client is not None:
            self.photon(record, record.client)

    __call__ = record

    def photon(self, record: TimingRecord, client: ClientTiming) -> None:
        """A page's report joined ``record``: its input-to-pixels time in the photon histogram."""
        if record.self_test:
            return
        with self._lock:
            row = self._photon.series((record.stream,))
            row[0][bisect_left(self._photon.bounds_ms, client.photon_ms)] += 1
            row[1] += client.photon_ms

    def families(self) -> list[Any]:
        """The histogram families now (copied under the lock, made outside it)."""
        with self._lock:
            copies = [(h, h.copy()) for h in self.histograms]
        return [h.family(copied) for h, copied in copies]

    def stats(self, statistics: Statistics) -> None:
        """Take every rank's latest stage statistics (``{rank: {stage: statistics}}``, as
        ``launch``'s ``on_status`` gets them); a rank left out keeps its last.

        A stage's fps changes only when its snapshot did (a rank > 0's latest report may be
        the one already seen), over the snapshots' own times (:attr:`StageStatistics.taken_s`,
        on the clock of the rank that took them; this call's time for one made by hand)."""
        now = time.monotonic()
        with self._lock:
            for rank, stages in statistics.items():
                self._stats[rank] = dict(stages)
                for name, stage in stages.items():
                    key = (rank, name)
                    before = self._seen.get(key)
                    if before is not None and (
                        stage.taken_s == before[1].taken_s if stage.taken_s else stage == before[1]
                    ):
                        continue  # the same snapshot again: its rate is the one made of it
                    taken = stage.taken_s or now
                    if before is not None and taken > before[0]:
                        done = stage.items_out - before[1].items_out
                        self._fps[key] = max(done, 0) / (taken - before[0])
                    self._seen[key] = (taken, stage)

    def snapshot(
        self,
    ) -> tuple[dict[int, dict[str, StageStatistics]], dict[tuple[int, str], float]]:
        """The latest statistics by rank and the fps by ``(rank, stage)`` (copies)."""
        with self._lock:
            return {r: dict(s) for r, s in self._stats.items()}, dict(self._fps)

    def text(self) -> bytes:
        """The exposition (Prometheus text format, :data:`CONTENT_TYPE`)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def aiohttp_handler(self) -> Callable[[Any], Awaitable[Any]]:
        """An aiohttp handler that answers with :meth:`text` (for a server's ``/metrics``
        route, behind whatever guards the server puts on its routes)."""
        from aiohttp import web

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=self.text(), headers={"Content-Type": CONTENT_TYPE})

        return metrics

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve ``/metrics`` on ``host:port`` (``port`` 0: a free one) until closed."""
        return MetricsServer(self, port, host)


class MetricsServer:
    """An HTTP server (a thread of its own) serving one :class:`RunMetrics` at ``/metrics``."""

    def __init__(self, metrics: RunMetrics, port: int, host: str = "127.0.0.1") -> None:
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(port, host, registry=metrics.registry)
        self.host = host
        self.port: int = self._server.server_port
        """The port it listens on (the one chosen when asked for 0)."""

    @property
    def url(self) -> str:
        """The endpoint: ``http://127.0.0.1:<port>/metrics``."""
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(2.0)


class _Collector:
    """The stage series of the latest snapshot and the histograms, made when scraped."""

    def __init__(self, metrics: RunMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats, fps = self._metrics.snapshot()
        labels = ["rank", "stage", "kind"]
        items_in = CounterMetricFamily(
            "rxstream_stage_items_in", "Items a stage started work on", labels=labels
        )
        items_out = CounterMetricFamily(
            "rxstream_stage_items_out", "Items a stage emitted downstream", labels=labels
        )
        cutovers = CounterMetricFamily(
            "rxstream_stage_cutovers", "Cutover items that reached a stage", labels=labels
        )
        dropped = CounterMetricFamily(
            "rxstream_stage_dropped",
            "Items dropped at a stage, by reason",
            labels=[*labels, "reason"],
        )
        depth = GaugeMetricFamily(
            "rxstream_stage_inbox_depth", "Items waiting in a stage's inbox", labels=labels
        )
        rate = GaugeMetricFamily(
            "rxstream_stage_fps",
            "Items a stage emitted per second, between the last two snapshots",
            labels=labels,
        )
        for rank in sorted(stats):
            for name, s in stats[rank].items():
                values = [str(rank), name, s.kind]
                items_in.add_metric(values, s.items_in)
                items_out.add_metric(values, s.items_out)
                cutovers.add_metric(values, s.cutovers)
                for reason, count in sorted(s.dropped.items()):
                    dropped.add_metric([*values, reason], count)
                depth.add_metric(values, s.inbox_depth)
                rate.add_metric(values, fps.get((rank, name), 0.0))
        yield from (items_in, items_out, cutovers, dropped, depth, rate)
        yield from self._metrics.families()
        spans_lost = self._metrics.spans_lost
        if spans_lost is not None:
            yield CounterMetricFamily(
                "rxstream_otel_spans_dropped",
                "Trace spans that never reached the collector (dropped, refused, unsent)",
                value=spans_lost(),
            )
