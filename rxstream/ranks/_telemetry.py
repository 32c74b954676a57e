"""A launch's exports: OpenTelemetry traces and a Prometheus endpoint, both on rank 0.

Rank 0 sees every timing record of the run (its own sinks', and those each rank > 0 forwards
over its control pipe) and every rank's stage statistics (each rank reports them every half
second): one :class:`Telemetry` per launch turns them into traces and serves the metrics, so a
run has one trace stream and one ``/metrics`` endpoint, whatever its ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from rxstream._exceptions import ArgumentError
from rxstream.ranks._common import Statistics
from rxstream.timing import ClientTiming, TimingRecord
from rxstream.timing._emit import listen_photon
from rxstream.timing._otel import TraceExport
from rxstream.timing._prometheus import MetricsServer, RunMetrics

__all__ = ["PHOTON_WAIT_S", "Telemetry", "check_metrics_port", "serves_metrics"]

PHOTON_WAIT_S = 2.0
"""How long a served run's trace waits for the page's report of its frame (the page reports
within a frame or two of showing it; a report later than this joins no trace)."""


def check_metrics_port(port: int | None) -> None:
    """``ArgumentError`` unless ``port`` is ``None`` or a TCP port (1 to 65535)."""
    if port is None:
        return
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ArgumentError(f"metrics_port must be a TCP port from 1 to 65535, got {port!r}")


def serves_metrics(transport: Any) -> bool:
    """Whether ``transport`` serves the run's metrics (a ``WebTransport(metrics=True)``)."""
    return transport is not None and getattr(transport, "metrics", False) is True


class Telemetry:
    """The traces (``otel``) and the metrics endpoint (``metrics_port``, on 127.0.0.1; or the
    session server's ``/metrics``, given a ``transport`` that :func:`serves_metrics`) of one
    launch; :meth:`close` sends the traces left and stops serving. A ``transport`` with a
    ``session_id`` puts it on every trace's root span (``rxstream.session``)."""

    def __init__(
        self,
        *,
        otel: bool,
        metrics_port: int | None,
        served: bool = False,
        transport: Any = None,
    ) -> None:
        check_metrics_port(metrics_port)
        served = served or transport is not None
        self.traces: TraceExport | None = None
        if otel:
            session = getattr(transport, "session_id", "") if transport is not None else ""
            try:
                self.traces = TraceExport(
                    photon_wait_s=PHOTON_WAIT_S if served else 0.0, session=str(session or "")
                )
            except ImportError as exc:
                raise ImportError(f"otel=True: {exc}", name=exc.name) from exc
        on_session = serves_metrics(transport)
        self.metrics = RunMetrics() if metrics_port is not None or on_session else None
        self._served_on: Any = None
        """The transport whose server answers ``/metrics`` with these metrics."""
        if self.metrics is not None and self.traces is not None:
            traces = self.traces
            self.metrics.spans_lost = lambda: traces.lost
        self.server: MetricsServer | None = None
        self._photon: contextlib.AbstractContextManager[None] | None = None
        self.runs: set[str] = set()
        """The run ids of the records this launch saw: a page's report of another run's
        record (another launch in this process) is not this launch's."""
        if self.metrics is not None and metrics_port is not None:
            try:
                self.server = self.metrics.serve(metrics_port)
            except OSError as exc:
                self.close()
                raise ArgumentError(
                    f"metrics_port {metrics_port}: cannot listen on 127.0.0.1:{metrics_port} "
                    f"({exc.strerror or exc})"
                ) from exc
        if on_session and self.metrics is not None:
            transport.serve_metrics(self.metrics.aiohttp_handler())
            self._served_on = transport
        self._photon = listen_photon(self.on_photon)
        self._photon.__enter__()

    @property
    def active(self) -> bool:
        """Whether anything is exported (else a launch leaves it out)."""
        return self.traces is not None or self.metrics is not None

    def on_record(self, record: TimingRecord) -> None:
        """A timing record rank 0 saw (any rank's)."""
        self.runs.add(record.run)
        if self.traces is not None:
            self.traces.record(record)
        if self.metrics is not None:
            self.metrics.record(record)

    def on_photon(self, record: TimingRecord, client: ClientTiming) -> None:
        """A page's report joined a record (a served session, on rank 0); one of a run this
        launch did not see (another launch's, in this process) is left."""
        if record.run not in self.runs:
            return
        if self.traces is not None:
            self.traces.photon(record, client)
        if self.metrics is not None:
            self.metrics.photon(record, client)

    def on_status(
        self, then: Callable[[Statistics], None] | None
    ) -> Callable[[Statistics], None] | None:
        """The launch's ``on_status``: every rank's statistics to the metrics, then ``then``."""
        metrics = self.metrics
        if metrics is None:
            return then

        def status(statistics: Statistics) -> None:
            metrics.stats(statistics)
            if then is not None:
                then(statistics)

        return status

    def close(self) -> None:
        """Send the traces left, stop serving (idempotent)."""
        if self._photon is not None:
            self._photon.__exit__(None, None, None)
            self._photon = None
        if self.traces is not None:
            self.traces.close()
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._served_on is not None:
            self._served_on.serve_metrics(None)
            self._served_on = None
