"""The transport contract: open(Session) at start, on_timing from sinks, close at stop."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import rxstream
from rxstream.item import PipelineItem
from rxstream.timing import TimingRecord
from rxstream.transport import Session, Transport


class Recording(Transport):
    """Keeps every call it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.session: Session | None = None
        self.records: list[TimingRecord] = []
        self.lock = threading.Lock()

    @property
    def connected(self) -> bool:
        return True

    def open(self, session: Session) -> None:
        self.session = session
        self.calls.append("open")

    def send(self, stream: str, item: PipelineItem) -> None:
        with self.lock:
            self.calls.append(f"send:{stream}")

    def on_timing(self, record: TimingRecord) -> None:
        with self.lock:
            self.records.append(record)

    def close(self) -> None:
        self.calls.append("close")


def test_a_threaded_run_opens_sends_times_and_closes() -> None:
    """start() opens with the pipeline's streams/inputs/docs; stop() closes once, after sends."""
    transport = Recording()
    ctx = rxstream.Context(transport=transport)
    ctx.doc("control", defaults={"gain": 1.0})
    pipeline = (
        ctx.input("pointer")
        | ctx.pipe(lambda s: np.full((2, 2, 3), int(s[0] * 255), np.uint8), name="echo")
        | ctx.stream("video", "jpeg")  # a jpeg sink takes frames only
    )
    pipeline.start()
    session = transport.session
    assert session is not None
    assert dict(session.streams) == {"video": "jpeg"}
    assert session.inputs == ("pointer",)
    assert list(session.docs) == ["control"]
    assert session.feed("pointer", (0.5, 0.5), None) == 1
    session.feed("pointer", (0.6, 0.5), None)
    pause = threading.Event()
    for _ in range(500):
        if len(transport.records) >= 2:
            break
        pause.wait(0.02)
    pipeline.stop()
    pipeline.stop()
    assert transport.calls[0] == "open"
    assert transport.calls.count("send:video") == 2
    assert transport.calls[-1] == "close"
    assert transport.calls.count("close") == 1
    assert [r.input_seq for r in transport.records] == [1, 2]


def test_drive_does_not_touch_the_transport() -> None:
    """drive() returns what egressed and sends nothing to the (unopened) transport."""
    transport = Recording()
    ctx = rxstream.Context(transport=transport)
    pipeline = ctx.source(lambda: iter(range(3))) | ctx.stream("video")
    assert pipeline.drive(frames=3) == [0, 1, 2]
    assert transport.calls == []


def test_a_second_start_neither_opens_nor_closes() -> None:
    """start() on a running pipeline raises and leaves the open session alone."""
    transport = Recording()
    ctx = rxstream.Context(transport=transport)
    pipeline = ctx.source(lambda: iter(range(3))) | ctx.stream("video")
    pipeline.start()
    with pytest.raises(rxstream.PipelineStateError):
        pipeline.start()
    pipeline.stop()
    assert transport.calls.count("open") == 1
    assert transport.calls[-1] == "close"
