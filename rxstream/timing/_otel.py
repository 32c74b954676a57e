"""Timing records as OpenTelemetry traces, built after the fact from the record's own times.

Each :class:`~rxstream.timing.TimingRecord` becomes one trace: a root span for the input, from
the input (the record's origin stamp; the page's input event when the page reported it) to
egress, or to the pixels when the page reported showing the frame, and one child span per hop
(its wait, hold and compute as attributes) followed, with a page's report, by the page's hops
(``net``, ``decode``, ``present``; ``up`` before the first). Every span gets explicit start and
end times: nothing is live while the item moves, and nothing crosses ranks for it (rank 0
builds the trace of a record a rank > 0 folded as of its own).

The OpenTelemetry packages are the ``otel`` extra; this module imports them only when a
:class:`TraceExport` is made, so a run without traces never loads them.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rxstream._exceptions import ArgumentError, ArgumentTypeError
from rxstream._util import library_logger
from rxstream.timing._client import ClientTiming
from rxstream.timing._record import TimingRecord
from rxstream.timing._spanbatch import SpanBatcher

__all__ = [
    "EXTRA_HINT",
    "TraceExport",
    "env_asker",
    "env_ignored",
    "env_traces",
    "missing_extra",
    "otel_from_env",
    "span_times",
]

EXTRA_HINT = "install the otel extra with pip install 'rxstream[otel]'"
"""What a missing OpenTelemetry package's error tells the user to do."""

_NS_PER_MS = 1_000_000
_log = library_logger("rxstream.timing")

SpanTimes = list[tuple[str, int, int, dict[str, Any]]]
_Key = tuple[str, str, int]


def otel_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the standard ``OTEL_*`` environment asks for traces: ``OTEL_TRACES_EXPORTER``
    set to an exporter other than ``none``, or an OTLP endpoint set
    (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); never when
    ``OTEL_SDK_DISABLED`` is ``true``."""
    return bool(env_asker(environ))


def env_asker(environ: Mapping[str, str] | None = None) -> str:
    """The ``OTEL_*`` variable that asks for traces (:func:`otel_from_env`'s rule), ``""``
    when none does."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ""
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return "" if exporter == "none" else "OTEL_TRACES_EXPORTER"
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if env.get(name):
            return name
    return ""


def missing_extra() -> str:
    """The OpenTelemetry module that traces need and this environment lacks (the SDK, or the
    OTLP/HTTP exporter), ``""`` when the ``otel`` extra is installed."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        return exc.name or "opentelemetry"
    return ""


_said: set[str] = set()
_said_lock = threading.Lock()


def env_traces(*, torchrun: bool = False) -> bool:
    """Whether the ``OTEL_*`` environment alone turns this run's traces on: it asks
    (:func:`env_asker`), the ``otel`` extra is installed and (``torchrun``) the run is not
    under torchrun, which makes no traces yet. When it asks and cannot have them, one warning,
    ``otel_env_ignored``, naming the variable, once a process: a variable set for the
    machine's other services never stops a run."""
    asker = env_asker()
    if not asker:
        return False
    reason = env_ignored(asker, torchrun=torchrun)
    if reason:
        with _said_lock:
            said = reason in _said
            _said.add(reason)
        if not said:
            _log.warning("otel_env_ignored", reason=reason)
        return False
    return True


def env_ignored(asker: str, *, torchrun: bool = False) -> str:
    """Why the traces ``asker`` (an ``OTEL_*`` variable) asks for are not made: ``""`` when
    they are."""
    why = ""
    if torchrun:
        why = "traces are not made under torchrun yet"
    else:
        missing = missing_extra()
        if missing:
            why = f"the otel extra is not installed (missing: {missing}; {EXTRA_HINT})"
    if not why:
        return ""
    return (
        f"{asker} is set, which asks for OpenTelemetry traces, but {why}: the run goes on "
        "without them"
    )


def span_times(record: TimingRecord, egress_ns: int) -> SpanTimes:
    """The spans of ``record``'s trace as ``(name, start_ns, end_ns, attributes)``, the root
    first, then its children in the order they happened; ``egress_ns`` is the wall-clock time
    of egress (the last ``.out``) in ns since the epoch.

    The hops tile the root from the origin stamp: each starts where the one before ended (its
    wait is the gap to the previous stamp) and lasts its ``wait + hold + compute``.
    """
    origin_ns = egress_ns - _ns(record.total_ms)
    client = record.client
    start_ns, end_ns = origin_ns, egress_ns
    children: SpanTimes = []
    if client is not None and client.up_ms is not None:
        start_ns = origin_ns - _ns(client.up_ms)
        children.append(("up", start_ns, origin_ns, {"rxstream.up_ms": client.up_ms}))
    cursor = origin_ns
    for hop in record.hops:
        end = cursor + _ns(hop.wait_ms + hop.hold_ms + hop.compute_ms)
        attributes = {
            "rxstream.stage": hop.name,
            "rxstream.wait_ms": hop.wait_ms,
            "rxstream.hold_ms": hop.hold_ms,
            "rxstream.compute_ms": hop.compute_ms,
        }
        if hop.gpu_ms is not None:  # a CUDA stage's GPU time, where its events resolved
            attributes["rxstream.gpu_ms"] = hop.gpu_ms
        children.append((hop.name, cursor, end, attributes))
        cursor = end
    if client is not None:
        end_ns = _client_spans(client, egress_ns, children)
    root = ("input", start_ns, end_ns, _root_attributes(record))
    return [root, *children]


def _client_spans(client: ClientTiming, egress_ns: int, spans: SpanTimes) -> int:
    """Append the page's hops after egress; the time the frame was presented."""
    cursor = egress_ns
    for name, ms in (
        ("net", client.net_ms),
        ("decode", client.decode_ms),
        ("present", client.present_ms),
    ):
        end = cursor + _ns(ms)
        spans.append((name, cursor, end, {f"rxstream.{name}_ms": ms}))
        cursor = end
    return cursor


def _root_attributes(record: TimingRecord) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "rxstream.stream": record.stream,
        "rxstream.input_seq": record.input_seq,
        "rxstream.run": record.run,
        "rxstream.generation": record.prompt_generation,
        "rxstream.cutover": record.cutover,
        "rxstream.pts": record.pts,
        "rxstream.origin": record.origin,
        "rxstream.total_ms": record.total_ms,
    }
    if record.self_test:
        attributes["rxstream.self_test"] = True
    client = record.client
    if client is not None:
        attributes["rxstream.photon_ms"] = client.photon_ms
        attributes["rxstream.video"] = client.video
        attributes["rxstream.clock_rtt_ms"] = client.rtt_ms
    return attributes


def _ns(ms: float) -> int:
    return round(ms * _NS_PER_MS)


def egress_ns_of(record: TimingRecord) -> int:
    """The record's egress on the wall clock, in ns: ``input_at_ms + from_client_ms`` (the
    sink's clock when it folded the record) when it has both, else now (a steer's cutover,
    which has no client time: the record is handed on as it is folded)."""
    if record.input_at_ms and record.from_client_ms is not None:
        return record.input_at_ms * _NS_PER_MS + _ns(record.from_client_ms)
    return time.time_ns()


class TraceExport:
    """Turns each record it is given into one trace, exported by ``exporter``.

    The spans are made finished (the SDK's ``ReadableSpan``, what every exporter takes) and
    handed to a :class:`~rxstream.timing._spanbatch.SpanBatcher` together: no live span, no
    tracer, no per-span processor, so a record costs a few µs a span.

    ``exporter`` is an OpenTelemetry ``SpanExporter`` (the SDK's ``InMemorySpanExporter`` in
    tests); ``None`` picks one from the standard environment: ``OTEL_TRACES_EXPORTER``
    (``otlp``, the default, sends OTLP over HTTP as ``OTEL_EXPORTER_OTLP_*`` say, to
    ``http://localhost:4318`` unless they say otherwise; ``console`` prints the spans). The
    service is ``OTEL_SERVICE_NAME`` (default ``rxstream``). Spans are exported in batches off
    the caller's thread; :meth:`close` sends what is left. ``session`` is set on every root
    span when given. ``photon_wait_s`` (a served session's: a page reports a frame it showed
    some ms after egress) holds each record's trace that long for :meth:`photon` to bring the
    page's part, so that the trace runs to the pixels; 0 (a headless run's) exports at once.
    An ``ImportError`` naming the ``otel`` extra when it is not installed.
    """

    def __init__(
        self,
        exporter: Any = None,
        *,
        session: str = "",
        photon_wait_s: float = 0.0,
        keep: int = 256,
    ) -> None:
        if isinstance(photon_wait_s, bool) or not isinstance(photon_wait_s, int | float):
            raise ArgumentTypeError(
                f"photon_wait_s must be a number of seconds, got {type(photon_wait_s).__name__}"
            )
        if not 0 <= photon_wait_s <= 60:
            raise ArgumentError(
                f"photon_wait_s must be from 0 to 60 (seconds), got {photon_wait_s!r}"
            )
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import ReadableSpan
            from opentelemetry.sdk.util.instrumentation import InstrumentationScope
            from opentelemetry.trace import SpanContext, TraceFlags
        except ImportError as exc:
            raise ImportError(
                f"OpenTelemetry traces need the OpenTelemetry SDK, which rxstream does not "
                f"install by default: {EXTRA_HINT} (missing: {exc.name})"
            ) from exc
        if exporter is None:
            exporter = _exporter_from_env()
        service = os.environ.get("OTEL_SERVICE_NAME") or "rxstream"
        self._resource = Resource.create({"service.name": service})
        self._scope = InstrumentationScope("rxstream.timing")
        self._batcher = SpanBatcher(exporter)
        self._span = ReadableSpan
        self._context = SpanContext
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._random = random.Random()
        self._lock = threading.Lock()
        self._closed = False
        self.session = session
        self.photon_wait_s = float(photon_wait_s)
        self.keep = keep
        self._waiting: OrderedDict[int, tuple[_Key, TimingRecord, int, float]] = OrderedDict()
        """Records held for their page's report, by a serial of their own (two records may
        share a key: a steered pipeline's cutovers all have ``input_seq`` 0): the key, the
        record, its egress (ns) and until when it waits (monotonic s)."""
        self._keyed: dict[_Key, list[int]] = {}
        """The serials waiting under each (run, stream, input_seq), oldest first."""
        self._serial = 0
        self.traces = 0
        """Records turned into traces so far."""
        self.joined = 0
        """Of them, traces that reach the pixels (a page's report joined their record)."""
        self.early = 0
        """Of them, traces sent before their wait was over, without the page's part, because
        ``keep`` records were waiting already (a page's report of them joins nothing)."""

    def record(self, record: TimingRecord, *, egress_ns: int | None = None) -> None:
        """Export ``record``'s trace (``egress_ns``: its egress on the wall clock in ns, by
        default :func:`egress_ns_of`'s); with ``photon_wait_s``, first wait that long for a
        page's report (:meth:`photon`), at most ``keep`` records at a time (the oldest goes
        on without). Any thread; after :meth:`close`, nothing."""
        if self._closed:
            return
        egress = egress_ns_of(record) if egress_ns is None else egress_ns
        if not self.photon_wait_s or record.client is not None:
            self._export(record, egress)
            return
        now = time.monotonic()
        with self._lock:
            key = (record.run, record.stream, record.input_seq)
            self._serial += 1
            self._waiting[self._serial] = (key, record, egress, now + self.photon_wait_s)
            self._keyed.setdefault(key, []).append(self._serial)
            due = self._due(now)
        for late, late_egress in due:
            self._export(late, late_egress)

    def photon(self, record: TimingRecord, client: ClientTiming) -> None:
        """A page's report joined ``record``: its trace, waiting, goes on to the pixels (a
        record no longer waiting, or never given, is left: its trace went, or goes, without).
        Of two records waiting under one (run, stream, input_seq), the one of the same
        ``pts``, else the oldest."""
        with self._lock:
            held = self._take((record.run, record.stream, record.input_seq), record.pts)
            due = self._due(time.monotonic())
        if held is not None:
            self._export(replace(held[0], client=client), held[1])
        for late, late_egress in due:
            self._export(late, late_egress)

    def _take(self, key: _Key, pts: int) -> tuple[TimingRecord, int] | None:
        """The waiting record of ``key`` (the one of ``pts`` first) taken out (under the lock)."""
        serials = self._keyed.get(key)
        if not serials:
            return None
        serial = next((n for n in serials if self._waiting[n][1].pts == pts), serials[0])
        serials.remove(serial)
        if not serials:
            del self._keyed[key]
        _, held, egress, _ = self._waiting.pop(serial)
        return held, egress

    def _due(self, now: float) -> list[tuple[TimingRecord, int]]:
        """The records whose wait is over, or past ``keep``, taken out (under the lock)."""
        due: list[tuple[TimingRecord, int]] = []
        waiting = self._waiting
        while waiting:
            serial, (key, record, egress, until) = next(iter(waiting.items()))
            if until > now and len(waiting) <= self.keep:
                break
            self.early += until > now
            del waiting[serial]
            serials = self._keyed[key]
            serials.remove(serial)
            if not serials:
                del self._keyed[key]
            due.append((record, egress))
        return due

    def _export(self, record: TimingRecord, egress_ns: int) -> None:
        spans = span_times(record, egress_ns)
        if self.session:
            spans[0][3]["rxstream.session"] = self.session
        bits = self._random.getrandbits
        trace_id = bits(128) or 1
        contexts = [
            self._context(trace_id, bits(64) or 1, is_remote=False, trace_flags=self._sampled)
            for _ in spans
        ]
        root = contexts[0]
        made = self._span
        self._batcher.add(
            [
                made(
                    f"{record.stream} {name}" if index == 0 else name,
                    context=contexts[index],
                    parent=None if index == 0 else root,
                    resource=self._resource,
                    attributes=attributes,
                    instrumentation_scope=self._scope,
                    start_time=start,
                    end_time=end,
                )
                for index, (name, start, end, attributes) in enumerate(spans)
            ]
        )
        with self._lock:
            self.traces += 1
            self.joined += record.client is not None

    __call__ = record

    def flush(self) -> None:
        """Export every trace made so far, now (in the caller's thread)."""
        self._batcher.flush()

    @property
    def dropped(self) -> int:
        """Spans dropped because the exporter fell behind (16,384 waiting)."""
        return self._batcher.dropped

    @property
    def lost(self) -> int:
        """Spans that never reached the collector: dropped, refused by it, or (once closed)
        left unsent; :meth:`close` says them in one warning, ``otel_spans_lost``."""
        return self._batcher.lost

    def close(self) -> None:
        """Export what is left (the records still waiting, without a page's part) and stop
        (idempotent)."""
        if not self._closed:
            with self._lock:
                left = [(record, egress) for _, record, egress, _ in self._waiting.values()]
                self._waiting.clear()
                self._keyed.clear()
            for record, egress in left:
                self._export(record, egress)
            self._closed = True
            self._batcher.close()


def _exporter_from_env() -> Any:
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    kind = kind.split(",")[0].strip()
    if kind == "otlp":
        _check_protocol()
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ImportError(
                f"OpenTelemetry traces over OTLP need the OTLP/HTTP exporter: {EXTRA_HINT} "
                f"(missing: {exc.name})"
            ) from exc
        return OTLPSpanExporter()
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    raise ArgumentError(
        f"OTEL_TRACES_EXPORTER must be otlp or console for rxstream's traces, got {kind!r}"
    )


def _check_protocol() -> None:
    """``ArgumentError`` unless the OTLP protocol the environment names is HTTP/protobuf,
    the only one rxstream's traces are sent with."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = os.environ.get(name, "").strip()
        if value:
            if value != "http/protobuf":
                raise ArgumentError(
                    f"{name} must be http/protobuf for rxstream's traces (the only OTLP "
                    f"protocol they are sent with), got {value!r}"
                )
            return
