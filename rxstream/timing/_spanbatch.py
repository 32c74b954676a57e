"""Finished spans to an OpenTelemetry exporter, in batches, from a thread of its own.

The SDK's ``BatchSpanProcessor`` takes spans one at a time, each with a fork check (a
``getpid`` system call) and a queue operation: for a record's seven or so spans that is most of
what a trace costs. A trace's spans are made together, so :class:`SpanBatcher` takes them
together: one lock and one list extension per record; a thread hands them to the exporter
every ``delay_s`` or once ``batch`` are waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from rxstream._util import library_logger

__all__ = ["SpanBatcher"]

_log = library_logger("rxstream.timing")


class SpanBatcher:
    """Spans :meth:`add`-ed by any thread, exported by one; at most ``keep`` waiting (the rest
    are dropped and counted: a collector that cannot keep up never grows the process).
    :attr:`lost` counts every span that did not reach the exporter's collector."""

    def __init__(
        self, exporter: Any, *, delay_s: float = 1.0, batch: int = 512, keep: int = 16_384
    ) -> None:
        self._exporter = exporter
        self.delay_s = delay_s
        self.batch = batch
        self.keep = keep
        self._spans: list[Any] = []
        self._cond = threading.Condition()
        self._exporting = threading.Lock()
        self._closed = False
        self.dropped = 0
        """Spans dropped because ``keep`` were waiting already."""
        self.failed = 0
        """Batches the exporter did not take (it raised or said it failed)."""
        self.failed_spans = 0
        """The spans of those batches."""
        self.added = 0
        """Spans queued (not dropped)."""
        self.exported = 0
        """Spans the exporter took."""
        self._thread = threading.Thread(target=self._loop, name="rxstream-otel", daemon=True)
        self._thread.start()

    def add(self, spans: Sequence[Any]) -> None:
        """Queue one trace's spans (dropped, counted, when ``keep`` are waiting or closed)."""
        with self._cond:
            if self._closed or len(self._spans) + len(spans) > self.keep:
                self.dropped += len(spans)
                return
            self._spans.extend(spans)
            self.added += len(spans)
            if len(self._spans) >= self.batch:
                self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._closed and len(self._spans) < self.batch:
                    self._cond.wait(self.delay_s)
                spans, self._spans = self._spans, []
                closed = self._closed
            if spans:
                self._export(spans)
            if closed:
                return

    def _export(self, spans: list[Any]) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        with self._exporting:
            for start in range(0, len(spans), self.batch):
                batch = spans[start : start + self.batch]
                try:
                    result = self._exporter.export(batch)
                except Exception as exc:  # a collector's failure never ends the run
                    result = None
                    _log.warning("otel_export_failed", error=f"{type(exc).__name__}: {exc}")
                with self._cond:
                    if result is SpanExportResult.SUCCESS:
                        self.exported += len(batch)
                    else:
                        self.failed += 1
                        self.failed_spans += len(batch)

    @property
    def lost(self) -> int:
        """Spans that never reached the collector: dropped, in failed batches, and (once
        closed) those left unsent."""
        with self._cond:
            return self.dropped + self.failed_spans + (self.unsent if self._closed else 0)

    @property
    def unsent(self) -> int:
        """Spans queued and neither exported nor failed (yet, before close returns: still
        waiting or being sent; after, what the exporter was not given or did not take)."""
        return self.added - self.exported - self.failed_spans

    def flush(self) -> None:
        """Export every span waiting now, in the caller's thread."""
        with self._cond:
            spans, self._spans = self._spans, []
        if spans:
            self._export(spans)

    def close(self, timeout_s: float = 5.0) -> None:
        """Export what is waiting (the thread's last round), then shut the exporter down; a
        collector that does not take it within ``timeout_s`` is left, said in one warning (a
        run's end never waits on it longer). Any span lost (dropped, failed, or left unsent)
        is said in one warning, ``otel_spans_lost``, with the counts. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            _log.warning(
                "otel_export_unfinished",
                reason=f"the exporter did not take the last spans within {timeout_s:g} s",
            )
        self._exporter.shutdown()
        with self._cond:
            exported, dropped = self.exported, self.dropped
            failed, unsent = self.failed_spans, self.unsent
        if dropped or failed or unsent:
            _log.warning(
                "otel_spans_lost",
                exported=exported,
                dropped=dropped,
                failed=failed,
                unsent=unsent,
            )
