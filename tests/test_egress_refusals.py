"""A transport may refuse an item (`ItemRefused`): the sink counts it as dropped, not egressed."""

from __future__ import annotations

from pathlib import Path

import pytest

import rxstream
from rxstream.item import PipelineItem
from rxstream.ranks._egress import Egress
from rxstream.transport import ItemRefused, MemoryTransport, Session, Transport


class OddRefused(Transport):
    """Takes even payloads, refuses odd ones (reason ``odd``)."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    @property
    def connected(self) -> bool:
        return True

    def send(self, stream: str, item: PipelineItem) -> None:
        if item.payload % 2:
            raise ItemRefused("odd")
        self.sent.append(item.payload)


def test_a_refused_item_is_dropped_at_the_sink_with_the_transports_reason() -> None:
    """The sink counts a refused item as dropped (its reason), not out; the run goes on."""
    transport = OddRefused()
    ctx = rxstream.Context(transport=transport)
    pipeline = ctx.source(lambda: iter(range(7)), name="src") | ctx.stream("video")
    pipeline.start()
    assert pipeline.wait(timeout=30)
    pipeline.stop()
    video = pipeline.statistics()["video"]
    assert transport.sent == [0, 2, 4, 6]
    assert (video.items_in, video.items_out, dict(video.dropped)) == (7, 4, {"odd": 3})


def test_the_launchs_egress_refuses_past_its_frames_naming_the_reason() -> None:
    """Egress passes exactly `frames` items on, then refuses each with reason `frames`."""
    page = MemoryTransport()
    egress = Egress(page, out=None, out_stream=None, frames=2, on_open=None)
    egress.open(Session(streams={"video": "raw"}))
    item = PipelineItem(0, rxstream.PipelineMetadata())
    egress.send("video", item)
    egress.send("video", item)
    assert egress.ended  # the second was the last: the session ends
    with pytest.raises(ItemRefused) as refused:
        egress.send("video", item)
    assert refused.value.reason == "frames"
    assert "2 frames" in str(refused.value)
    assert len(page.items("video")) == 2


def test_an_item_a_rank_forwarded_past_frames_is_counted_refused_by_the_controller() -> None:
    """Rank 1 forwards 3 items (its sink counted them out) into a session of 2 frames: the
    controller's watch sends 2 and counts the third in ``refused``, not silently lost."""
    from multiprocessing import Pipe
    from types import SimpleNamespace
    from typing import Any, cast

    from rxstream._kernel._stats import stats_to_wire
    from rxstream.ranks._watch import Watch

    page = MemoryTransport()
    egress = Egress(page, out=None, out_stream=None, frames=2, on_open=None)
    egress.open(Session(streams={"video": "raw"}))
    ours, theirs = Pipe()
    ranks = SimpleNamespace(conns={1: ours}, procs={1: None})
    watch = Watch(cast(Any, None), cast(Any, ranks), egress, None)
    for payload in range(3):
        theirs.send(("egress", "video", PipelineItem(payload, rxstream.PipelineMetadata())))
    theirs.send(("done", 1, 3, stats_to_wire({})))
    watch._read(1, ours)
    assert [item.payload for item in page.items("video")] == [0, 1]
    assert (watch.egressed[1], egress.refused) == (3, 1)
    assert watch.finished == {1}


TWO_SINKS_APP = '''\
"""One source on rank 0 feeding a sink there and, through rank 1, a sink on rank 1."""


def build(ctx):
    up = ctx.source(range(200), rank=0)
    return ctx.graph(
        up | ctx.stream("a", rank=0),
        up | ctx.pipe(lambda x: x, rank=1) | ctx.stream("b", rank=1),
    )
'''


def test_sinks_on_two_ranks_past_frames_balance_with_the_refused_count(tmp_path: Path) -> None:
    """Two sinks on two ranks share ``frames``: what reached the session is what the sinks
    counted out less ``refused``, and the session got exactly ``frames``."""
    app = tmp_path / "two_sinks.py"
    app.write_text(TWO_SINKS_APP)
    page = MemoryTransport()
    result = rxstream.launch(str(app), ranks=2, frames=10, transport=page, timeout=60)
    reached = len(page.items("a")) + len(page.items("b"))
    assert reached == 10
    assert result.egressed - result.refused == reached
