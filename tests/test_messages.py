"""Messages a new user met that read unclearly, each pinned as one line naming the stage or
field, the rule and the value: a rule the pipeline that ``build`` returned breaks (not "build
raised"), an unknown field of a doc, said in one form with a schema or defaults, and every
``--set`` refusal in one form (``refused:``); and a ``ctx.lease`` waiting for a ring slot
counted as the stage's stall, not its work."""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rxstream
from rxstream import DocValidationError, cli
from rxstream._kernel._stats import StageCounters
from rxstream.ipc import ShmRing, _lease
from rxstream.ranks._lease import lease as stage_lease
from rxstream.ranks._lease import offer, withdraw
from rxstream.runtime._thread import charge_stalls_to, stall_begins

WAIT_S = 20.0


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- a rule the built pipeline breaks is not a raise of build -----------------------------------

READS_OFF_RANK_0 = """\
def build(ctx):
    pointer = ctx.input("pointer")
    world = ctx.source(range(3), name="world", reads=pointer, rank=1)
    return world | ctx.stream("video")
"""

REUSED_STAGE = """\
def build(ctx):
    twice = ctx.pipe(abs, name="twice")
    return ctx.source(range(3), name="a") | twice | twice | ctx.stream("video")
"""


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "readr1.py",
            READS_OFF_RANK_0,
            "source 'world' reads input 'pointer', whose samples arrive on rank 0 (the "
            "session's): place the source on rank 0, got rank=1",
        ),
        (
            "reused.py",
            REUSED_STAGE,
            "stage 'twice' (pipe) is used at two places in the pipeline; a stage object is one "
            "node: build another with ctx.pipe(...) (one upstream feeding two downstreams is a "
            "fan-out and needs no copy)",
        ),
    ],
)
def test_a_rule_the_returned_pipeline_breaks_is_said_as_the_rule_not_as_builds_raise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, said: str
) -> None:
    """A pipeline build returned that breaks a rule checked after it: the rule, no "raised"."""
    app = _write(tmp_path / name, text)
    assert cli.main(["run", app, "--ranks", "2", "--frames", "3"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"rxstream run: app {app!r}: {said}"]


# --- an unknown field of a doc: one form, a schema's or the defaults' ---------------------------


@dataclasses.dataclass
class _Prompted:
    prompt: str = "a cat"


@dataclasses.dataclass
class _Sectioned:
    vae: _Prompted = dataclasses.field(default_factory=_Prompted)


@pytest.mark.parametrize(
    ("made", "write", "message"),
    [
        (
            {"schema": _Prompted},
            {"promt": "a storm"},
            r"^control\.promt is not a field of the doc \(fields there: prompt\), got 'a storm'$",
        ),
        (
            {"defaults": {"prompt": "a cat"}},
            {"promt": "a storm"},
            r"^control\.promt is not a field of the doc \(fields there: prompt\), got 'a storm'$",
        ),
        (
            {"schema": _Sectioned},
            {"vae": {"promt": "a storm"}},
            r"^control\.vae\.promt is not a field of the doc \(fields there: prompt\), "
            r"got 'a storm'$",
        ),
    ],
)
def test_an_unknown_field_reads_alike_with_a_schema_or_defaults(
    ctx: rxstream.Context, made: dict[str, Any], write: dict[str, Any], message: str
) -> None:
    """A write to a field the doc has not names its dotted field and the fields there, alike."""
    doc = ctx.doc("control", **made)
    with pytest.raises(DocValidationError, match=message):
        doc.set(write)


# --- every --set refusal in one form ------------------------------------------------------------

FRAMES_APP = str(Path(__file__).resolve().parent / "apps" / "frames_app.py")


@pytest.mark.parametrize(
    ("setting", "line"),
    [
        ("gain=abc", "control.gain must be a number, got 'abc'"),
        ("size.height=7", "control.size: height and width must be even and >= 2, got 7x48"),
    ],
)
def test_a_set_that_cannot_be_typed_reads_as_one_the_doc_refuses(
    setting: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An untypable ``--set`` value says ``refused:`` as the doc's refusals do, exit 2."""
    assert cli.main(["run", FRAMES_APP, "--frames", "1", "--set", setting]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rxstream run: --set {setting}: refused: {line}"
    ]


# --- a lease's wait for a ring slot is the stage's stall ----------------------------------------


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (a state the engine exposes), failing after ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def ring_pair() -> Iterator[tuple[ShmRing, ShmRing]]:
    """An owner ring of 2 slots and a ring attached to it in this process."""
    owner = ShmRing.create(slots=2, slot_bytes=1 << 16, name=f"rxs_msg{os.getpid()}_lease")
    other = ShmRing.attach(owner.handle())
    yield owner, other
    other.close()
    owner.close()
    owner.unlink()


@pytest.mark.parametrize("wait", ["free slot", "room"])
def test_a_lease_waiting_for_a_slot_is_the_stages_stall_marked_and_charged(
    ring_pair: tuple[ShmRing, ShmRing], monkeypatch: pytest.MonkeyPatch, wait: str
) -> None:
    """``ctx.lease`` waiting for a slot (every slot written; or the consumer holding one) marks
    the stage stalled for the watchdog and charges the wait once, as stalled_s."""
    producer, consumer = ring_pair
    monkeypatch.setattr(_lease, "LEASE_WAIT_S", WAIT_S)  # the hand-back ends the wait
    producer.on_wait = stall_begins  # as a boundary's writer sets it
    counters = StageCounters("frames", "source")
    filled, holding = threading.Event(), threading.Event()
    got: list[Any] = []

    def stage() -> None:  # the stage's thread: the ring offered to it, as a boundary does
        charge_stalls_to(counters)
        offer(producer)
        for _ in range(2 if wait == "free slot" else 1):
            producer.put(np.ones(100))
        counters.current = "the item"
        filled.set()
        assert holding.wait(WAIT_S)  # (the room's wait: once the consumer holds its item)
        got.append(stage_lease((100,), np.float64))
        got.append(counters.current)

    thread = threading.Thread(target=stage)
    thread.start()
    try:
        assert filled.wait(WAIT_S)
        kept = consumer.get(timeout=WAIT_S) if wait == "room" else None
        holding.set()
        _until(lambda: counters.current is None, "the lease marked stalled")
        before = counters.stalled_s
        if kept is None:
            kept = consumer.get(timeout=WAIT_S)
        del kept
        gc.collect()  # the consumer's view is gone: its slot goes back
        thread.join(WAIT_S)
        assert not thread.is_alive()
    finally:
        withdraw(producer)
    leased, resumed = got
    assert resumed == "the item"  # the mark ends with the wait
    assert before == 0.0
    assert counters.stalled_s > 0.0
    assert counters.stalled_s == pytest.approx(producer._put_wait_ns / 1e9)  # charged once
    del leased


@pytest.mark.slow
def test_a_source_leasing_slots_from_a_slow_rank_is_stalled_not_working() -> None:
    """A rank-0 source whose ``ctx.lease`` waits on a full ring (rank 1 hung) counts that wait
    as stalled_s, not work_s, also when the stop ends the wait."""
    ctx = rxstream.Context(transport=rxstream.transport.MemoryTransport(keep=4))
    release = threading.Event()

    def frame() -> Any:
        leased = ctx.lease((4,), np.float64)
        leased[...] = 0.0
        return leased

    def hold(x: float) -> float:
        release.wait()
        return x

    pipeline = (
        ctx.source(frame, name="frames", rank=0)
        | ctx.pipe(lambda a: float(a.sum()), name="decode", rank=1)
        | ctx.pipe(hold, name="hold", rank=1)
        | ctx.stream("out", rank=1)
    )
    pipeline.start()
    try:
        _until(lambda: pipeline.statistics()["hold"].busy_s > 0.5, "the stage held")
    finally:
        pipeline.stop()  # the source's lease is woken by the close: its wait is a stall
        release.set()
    source = pipeline.statistics()["frames"]
    assert source.stalled_s > source.work_s
