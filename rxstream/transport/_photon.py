"""Joining a page's presentation reports to the timing records of the inputs they showed.

The web transport tells :class:`PhotonJoin` of every frame it sends (its origin stamp on the
server's monotonic clock), of every record a sink folds, and of every ``shown`` report a page
sends (arrival, decode and presentation on the page's clock, mapped through that page's
:class:`~rxstream.timing._client.ClockOffset`). When a report and its record meet, the join
yields the record's :class:`~rxstream.timing.ClientTiming`, which the transport logs as a
``[photon:<stream>]`` line; ``rxstream.timing.load`` joins that line back to the record.

Everything is bounded: the last ``keep`` frames, records and waiting reports; a report whose
frame was forgotten (or never sent) yields nothing.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TypeVar

from rxstream._util import library_logger
from rxstream.timing import ClientTiming, TimingRecord
from rxstream.timing._client import ClockOffset
from rxstream.timing._emit import joined

__all__ = ["MAX_HOP_MS", "PhotonJoin", "Shown", "log_photon", "plausible"]

_K = TypeVar("_K")
_V = TypeVar("_V")

_EVENT_BEFORE_MS = 5_000.0
"""An input event mapped more than this before ``input.recv`` is not the input's event."""


@dataclass(frozen=True)
class Shown:
    """A page's report of one presented frame; times on the page's clock, in ms."""

    stream: str
    seq: int
    """The frame's number in its stream (the header's ``seq``)."""
    input_seq: int
    arrived: float
    decoded: float
    presented: float
    event: float | None = None
    """When the page's own input event of ``input_seq`` happened, if that page fed it."""
    video: str = ""


@dataclass(frozen=True)
class _Frame:
    origin_ms: float
    """The frame's first stamp on the server's monotonic clock, in ms."""
    from_input: bool
    """Whether that stamp is ``input.recv``."""


def _put(table: OrderedDict[_K, _V], key: _K, value: _V, keep: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > keep:
        table.popitem(last=False)


class PhotonJoin:
    """Frames sent, records folded and pages' reports, joined by ``(stream, input_seq)``."""

    def __init__(self, keep: int = 256) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._frames: OrderedDict[tuple[str, int], _Frame] = OrderedDict()
        self._records: OrderedDict[tuple[str, int], TimingRecord] = OrderedDict()
        self._waiting: OrderedDict[tuple[str, str, int, int], tuple[Shown, float, float]] = (
            OrderedDict()
        )
        """(run, stream, input_seq, page) of a report whose record was not known yet, the run
        the latest record's (a report waits for a record of the run it came in)."""
        self._run = ""
        """The run of the latest record folded."""
        self._joined: OrderedDict[tuple[str, str, int, int], None] = OrderedDict()
        """(run, stream, input_seq, page) already joined: a page's repeated report joins
        nothing (a later run's record of the same input_seq, a cutover's 0, joins anew)."""
        self.unsynced = 0
        """Reports dropped because the page's clock was not known yet."""
        self.implausible = 0
        """Joins dropped because a hop came out outside the frame's life, and reports with a
        hop over MAX_HOP_MS (never logged)."""

    def count_implausible(self) -> None:
        """A report with a hop over MAX_HOP_MS (a background tab's) joins nothing: counted."""
        with self._lock:
            self.implausible += 1

    def origin_ms(self, stream: str, seq: int) -> float | None:
        """Frame ``seq`` of ``stream``'s first stamp (server ms), if it is remembered."""
        with self._lock:
            frame = self._frames.get((stream, seq))
        return None if frame is None else frame.origin_ms

    def sent(self, stream: str, seq: int, timeline: tuple[tuple[str, float], ...]) -> None:
        """Frame ``seq`` of ``stream`` went out; ``timeline`` is its item's (any thread)."""
        if not timeline:
            return
        first, t = timeline[0]
        with self._lock:
            _put(self._frames, (stream, seq), _Frame(t * 1e3, first == "input.recv"), self.keep)

    def record(self, record: TimingRecord) -> list[tuple[TimingRecord, ClientTiming, int]]:
        """A sink folded ``record``; the joins of reports that waited for it, with their page."""
        key = (record.stream, record.input_seq)
        with self._lock:
            if record.run != self._run:  # a new run: the reports of the last never join it
                self._run = record.run
                for stale in [k for k in self._waiting if k[0] != record.run]:
                    del self._waiting[stale]
            _put(self._records, key, record, self.keep)
            waiting = [k for k in self._waiting if k[1:3] == key]
            reports = [(k[3], *self._waiting.pop(k)) for k in waiting]
        return [
            (record, client, page)
            for page, report, offset, rtt in reports
            if (client := self._join(report, record, offset, rtt)) is not None
            and self._first((record.run, *key, page))
        ]

    def _first(self, key: tuple[str, str, int, int]) -> bool:
        """Whether this page's report of this input joins for the first time (then marked)."""
        with self._lock:
            if key in self._joined:
                return False
            _put(self._joined, key, None, self.keep)
            return True

    def shown(
        self, report: Shown, clock: ClockOffset, page: int = 0
    ) -> tuple[TimingRecord, ClientTiming] | None:
        """A page presented a frame: its record's client part, once the record is known."""
        offset, rtt = clock.offset_ms, clock.rtt_ms
        if offset is None or rtt is None:
            self.unsynced += 1
            return None
        with self._lock:
            record = self._records.get((report.stream, report.input_seq))
            if record is None:
                key = (self._run, report.stream, report.input_seq, page)
                _put(self._waiting, key, (report, offset, rtt), self.keep)
                return None
        client = self._join(report, record, offset, rtt)
        if client is None or not self._first((record.run, report.stream, report.input_seq, page)):
            return None
        return record, client

    def _join(
        self, report: Shown, record: TimingRecord, offset: float, rtt: float
    ) -> ClientTiming | None:
        with self._lock:
            frame = self._frames.get((report.stream, report.seq))
        if frame is None:
            return None
        egress = frame.origin_ms + record.total_ms
        arrived = report.arrived - offset
        decoded = report.decoded - offset
        presented = report.presented - offset
        start, up = frame.origin_ms, None
        if report.event is not None and frame.from_input:
            event = report.event - offset
            if frame.origin_ms - _EVENT_BEFORE_MS <= event <= frame.origin_ms + rtt:
                start, up = event, frame.origin_ms - event
        timing = ClientTiming(
            photon_ms=presented - start,
            net_ms=arrived - egress,
            decode_ms=decoded - arrived,
            present_ms=presented - decoded,
            up_ms=up,
            rtt_ms=rtt,
            video=report.video,
        )
        if not plausible(timing):
            with self._lock:
                self.implausible += 1
            return None
        return timing


MAX_HOP_MS = 60_000.0
"""The longest client hop (net, decode, present) a join takes: past it a report joins nothing
(counted in ``PhotonJoin.implausible``)."""


def plausible(timing: ClientTiming) -> bool:
    """Whether every hop is finite and within the frame's life: a hop may be short of 0 by
    the clock estimate's error (the round trip) at most, and no hop is over MAX_HOP_MS."""
    slack = timing.rtt_ms + 1.0
    hops = (timing.net_ms, timing.decode_ms, timing.present_ms, timing.photon_ms)
    return (
        math.isfinite(timing.rtt_ms)
        and all(math.isfinite(h) and -slack <= h <= MAX_HOP_MS for h in hops)
        and (timing.up_ms is None or -slack <= timing.up_ms <= MAX_HOP_MS)
    )


_log = library_logger("rxstream.timing")


def log_photon(record: TimingRecord, client: ClientTiming, page: int) -> dict[str, Any]:
    """Log the ``[photon:<stream>]`` line of a joined record, and hand it to the photon
    listeners (the traces and metrics of a run); the fields it carried (the record's ``run``
    among them, so that a log's reader joins it within its run)."""
    fields: dict[str, Any] = {
        "run": record.run,
        "stream": record.stream,
        "input_seq": record.input_seq,
        "pts": record.pts,
        "prompt_generation": record.prompt_generation,
        "cutover": record.cutover,
        "total_ms": round(record.total_ms, 3),
        **client.fields(),
        "page": page,
    }
    _log.info(f"[photon:{record.stream}]", **fields)
    joined(record, client)
    return fields
