"""Mouse-to-photon timing: per-hop records, their structlog lines, and their analysis."""

from rxstream._util import fixup_module_metadata
from rxstream.timing._analysis import (
    LoggedRun,
    Malformed,
    TimingLog,
    format_summary,
    load,
    plot,
    summarize,
)
from rxstream.timing._client import ClientTiming
from rxstream.timing._emit import configure_logging
from rxstream.timing._otel import TraceExport
from rxstream.timing._prometheus import MetricsServer, RunMetrics
from rxstream.timing._record import HopTiming, TimingRecord

__all__ = [
    "ClientTiming",
    "HopTiming",
    "LoggedRun",
    "Malformed",
    "MetricsServer",
    "RunMetrics",
    "TimingLog",
    "TimingRecord",
    "TraceExport",
    "configure_logging",
    "format_summary",
    "load",
    "plot",
    "summarize",
]

fixup_module_metadata(__name__, globals())
