"""A stage's admission on its per-item path, threaded and driven: the routine item's inline
check and the other branches it hands to ``Admission.admit`` (stale, cutover, flush)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import rxstream
from rxstream._kernel._generations import Admission
from rxstream.item import PipelineItem, PipelineMetadata
from rxstream.transport import MemoryTransport

# (payload, prompt_generation, cutover, flush_generation); run after one steer (drop = 1)
ARRIVALS = [
    (0, 1, False, 0),  # routine
    (1, 1, True, 0),  # a cutover: counted, let in
    (2, 0, False, 0),  # stale: dropped (reason ``stale``)
    (3, 1, False, 1),  # a newer flush: resets the stage, let in
    (4, 1, False, 1),  # the same flush again: routine now, no second reset
    (5, 0, True, 1),  # stale though a cutover: dropped, not counted as a cutover
    (6, 1, False, 0),  # an older flush: routine
    (7, 1, False, 2),  # a newer flush again: a second reset
]


class Recorder:
    """A stage function with ``reset()``: records what it saw and when it was reset."""

    def __init__(self) -> None:
        self.log: list[Any] = []

    def __call__(self, x: int) -> int:
        self.log.append(x)
        return x

    def reset(self) -> None:
        self.log.append("reset")


def _arrivals() -> list[PipelineItem]:
    return [
        PipelineItem(p, PipelineMetadata(prompt_generation=g, cutover=c, flush_generation=f))
        for p, g, c, f in ARRIVALS
    ]


def _pipeline(ctx: rxstream.Context, kind: str, recorder: Recorder) -> rxstream.Pipeline:
    build: Callable[..., rxstream.Stage] = ctx.pipe if kind == "pipe" else ctx.tap
    return ctx.source(_arrivals(), name="src") | build(recorder, name="s") | ctx.stream("out")


@pytest.mark.parametrize("kind", ["pipe", "tap"])
@pytest.mark.parametrize("threaded", [True, False])
def test_admission_drops_stale_counts_cutovers_and_resets_on_a_newer_flush(
    kind: str, threaded: bool
) -> None:
    """Stale items dropped with their reason, cutovers counted, one reset per newer flush."""
    ctx = rxstream.Context(transport=MemoryTransport())
    ctx.generations.steer()  # prompt 1, items of prompt 0 stale
    recorder = Recorder()
    pipeline = _pipeline(ctx, kind, recorder)
    if threaded:
        pipeline.start()
        assert pipeline.wait(timeout=30)
        assert isinstance(ctx.transport, MemoryTransport)
        out = [item.payload for item in ctx.transport.items("out")]
    else:
        out = pipeline.drive(frames=len(ARRIVALS))
    assert out == [0, 1, 3, 4, 6, 7]
    assert recorder.log == [0, 1, "reset", 3, 4, 6, "reset", 7]
    stage = pipeline.statistics()["s"]
    assert stage.dropped == {"stale": 2}
    assert stage.cutovers == 1
    assert (stage.items_in, stage.items_out) == (6, 6)


@pytest.mark.parametrize("kind", ["pipe", "tap"])
def test_a_routine_item_is_admitted_without_a_call_to_admit(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the items that need something (stale, cutover, newer flush) reach Admission.admit."""
    seen: list[tuple[int, bool, int]] = []
    admit = Admission.admit

    def spy(self: Admission, metadata: PipelineMetadata) -> bool:
        seen.append((metadata.prompt_generation, metadata.cutover, metadata.flush_generation))
        return admit(self, metadata)

    monkeypatch.setattr(Admission, "admit", spy)
    ctx = rxstream.Context(transport=MemoryTransport())
    ctx.generations.steer()
    pipeline = _pipeline(ctx, kind, Recorder())
    pipeline.start()
    assert pipeline.wait(timeout=30)
    # the stage: every arrival but the routine ones (0, 4, 6); the stream after it: what
    # got through that needs something there (1's cutover, 3's and 7's newer flushes)
    expected = [(1, True, 0), (0, False, 0), (1, False, 1), (0, True, 1), (1, False, 2)]
    expected += [(1, True, 0), (1, False, 1), (1, False, 2)]
    assert sorted(seen) == sorted(expected)
