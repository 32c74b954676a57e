"""One transport suite, run against every kind of hop between two stages.

- ``inbox``: both stages on one rank, the hop is the downstream stage's bounded inbox;
- ``ring``: the stages on two ranks of one process, the hop is a shared-memory ring;
- ``cuda``: the same with CUDA tensors (mock CUDA), which cross through the IPC bridge;
- ``dist``: the two ranks as two runs of this process, the hop over ``torch.distributed``
  point-to-point (two gloo process groups on 127.0.0.1), as between two hosts.

Each checks order, metadata equality, backpressure, drops counted, stop semantics, and
empty and large payloads.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import pytest
import torch

import rxstream
from rxstream.distributed import DistChannel, loopback_groups
from rxstream.ipc import ShmRing
from rxstream.ipc._cuda import FakeCudaApi
from rxstream.ranks._channel import Channel
from rxstream.ranks._distboundary import DistRun
from rxstream.runtime._aio import AsyncBridge
from rxstream.transport import MemoryTransport

KINDS = ["inbox", "ring", "cuda", "dist"]


class Running(Protocol):
    """What the tests do with a pipeline: start it, wait for it, read statistics, stop it."""

    def start(self) -> object: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def statistics(self) -> Mapping[str, rxstream.StageStatistics]: ...

    def stop(self) -> None: ...


class GlooRanks:
    """A pipeline's ranks as runs of this process, every boundary over gloo send/recv."""

    def __init__(self, pipeline: rxstream.Pipeline) -> None:
        plan, ctx = pipeline.plan, pipeline.context
        groups = loopback_groups(plan.world)
        links: list[dict[str, DistChannel]] = [{} for _ in range(plan.world)]
        for up, down in plan.boundaries:
            name = plan.edge_name(up, down)
            a, b = plan.ranks[up], plan.ranks[down]
            links[a][name] = DistChannel(name, groups[a], b, side="writer")
            links[b][name] = DistChannel(name, groups[b], a, side="reader")
        self.runs = [
            DistRun(
                plan,
                links=links[rank],
                bridge=AsyncBridge(),
                generations=ctx.generations,
                timing=ctx.timing,
                rank=rank,
            )
            for rank in range(plan.world)
        ]

    def start(self) -> GlooRanks:
        for run in reversed(self.runs):  # readers first
            run.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for run in self.runs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not run.done.wait(left):
                return False
        self.stop()
        for run in self.runs:
            run.raise_error()
        return True

    def statistics(self) -> Mapping[str, rxstream.StageStatistics]:
        return {name: s for run in self.runs for name, s in run.statistics().items()}

    def stop(self) -> None:
        for run in self.runs:  # every side closes before any joins: readers drain writers
            run.halt()
        for run in self.runs:
            assert run.stop(1.0) == []


class Hop:
    """How to build a two-stage pipeline across one kind of hop, and read its payloads."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.api = FakeCudaApi() if kind == "cuda" else None
        self.ctx = rxstream.Context(transport=MemoryTransport(keep=None), cuda_api=self.api)

    def payload(self, array: np.ndarray) -> Any:
        """``array`` as this hop's payload (a mock CUDA tensor for ``cuda``)."""
        if self.api is None:
            return array
        return self.api.to_device(torch.from_numpy(array))

    def pipeline(self, source: object, fn: Callable[[Any], Any], **downstream: Any) -> Running:
        """``source | up | down(fn) | sink`` with ``down`` across the hop."""
        rank = 0 if self.kind == "inbox" else 1
        ctx = self.ctx
        pipeline = (
            ctx.source(source, name="src")
            | ctx.pipe(lambda x: x, name="up")
            | ctx.pipe(fn, name="down", rank=rank, **downstream)
            | ctx.stream("out", rank=rank)
        )
        return GlooRanks(pipeline) if self.kind == "dist" else pipeline

    @property
    def delivered(self) -> list[rxstream.PipelineItem]:
        transport = self.ctx.transport
        assert isinstance(transport, MemoryTransport)
        return transport.items("out")


def to_numpy(value: Any) -> np.ndarray:
    """A payload back as numpy (tensors copied out)."""
    if isinstance(value, torch.Tensor):
        return value.numpy().copy()
    return np.asarray(value).copy()


@pytest.fixture(params=KINDS)
def hop(request: pytest.FixtureRequest) -> Hop:
    """A fresh hop of each kind."""
    return Hop(request.param)


def test_order_and_metadata_cross_intact(hop: Hop) -> None:
    """Items arrive in order, payloads equal, metadata equal but for the hop's own stamps."""
    sent = [
        rxstream.PipelineItem(
            hop.payload(np.full((8,), i, dtype=np.int64)),
            rxstream.PipelineMetadata(
                pts=10 * i, input_seq=i + 1, input_at_ms=1000 + i, cutover=i == 3
            ),
        )
        for i in range(30)
    ]
    pipeline = hop.pipeline(sent, to_numpy)
    pipeline.start()
    assert pipeline.wait(timeout=30)
    got = hop.delivered
    assert [int(item.payload[0]) for item in got] == list(range(30))
    for item, original in zip(got, sent, strict=True):
        md, want = item.metadata, original.metadata
        assert (md.pts, md.input_seq, md.input_at_ms, md.cutover) == (
            want.pts,
            want.input_seq,
            want.input_at_ms,
            want.cutover,
        )
    hops = [name for name, _ in got[0].metadata.timeline]
    crossing = ["up>down.in", "up>down.out"] if hop.kind != "inbox" else []
    assert hops == ["src.in", "src.out", "up.in", "up.out", *crossing, "down.in", "down.out"]


@pytest.mark.parametrize("payload", ["array", "bytes"])
def test_metadata_values_cross_with_their_types(hop: Hop, payload: str) -> None:
    """A numpy scalar given as metadata crosses as its plain value, never as its bytes.

    (marshal, which small payloads and plain arrays cross with, writes a numpy scalar as bytes;
    the metadata holds plain values from the start.)
    """
    if payload == "bytes" and hop.kind == "cuda":
        pytest.skip("the cuda hop carries tensors")
    made = [
        hop.payload(np.arange(6, dtype=np.float32) + i) if payload == "array" else b"%d" % i
        for i in range(3)
    ]
    given: list[dict[str, Any]] = [
        {"pts": np.int64(10 * i), "capture_ts": np.float32(0.5)} for i in range(3)
    ]
    sent = [
        rxstream.PipelineItem(value, rxstream.PipelineMetadata(**numpy_values))
        for value, numpy_values in zip(made, given, strict=True)
    ]
    pipeline = hop.pipeline(sent, lambda x: x if isinstance(x, bytes) else to_numpy(x))
    pipeline.start()
    assert pipeline.wait(timeout=30)
    got = hop.delivered
    assert [item.metadata.pts for item in got] == [0, 10, 20]
    assert {type(item.metadata.pts) for item in got} == {int}
    assert {item.metadata.capture_ts for item in got} == {0.5}
    if payload == "array":
        assert [float(item.payload[0]) for item in got] == [0.0, 1.0, 2.0]
    else:
        assert [item.payload for item in got] == [b"0", b"1", b"2"]


def test_a_downstream_that_keeps_every_view_does_not_stall_the_ring() -> None:
    """When every slot is leased to items downstream keeps, the reader copies the next one out.

    The sink keeps all 24 arrays, views of the ring's 4 slots as they come; the source's
    items all arrive, and only those that came while every slot was leased are copies.
    """
    hop = Hop("ring")
    arrays = [np.full((256,), i, dtype=np.int64) for i in range(24)]
    pipeline = hop.pipeline(arrays, lambda x: x)  # downstream keeps the slot's view
    pipeline.start()
    assert pipeline.wait(timeout=30)
    got = hop.delivered
    assert [int(item.payload[0]) for item in got] == list(range(24))
    assert all(np.array_equal(item.payload, want) for item, want in zip(got, arrays, strict=True))


def test_backpressure_holds_the_source(hop: Hop) -> None:
    """A slow downstream holds a generator source: it never runs far ahead of delivery."""
    pulled = [0]
    done = [0]
    lead: list[int] = []

    def frames() -> Iterator[Any]:
        for i in range(40):
            pulled[0] = i + 1
            yield hop.payload(np.full((4,), i, dtype=np.int64))

    def slow(value: Any) -> Any:
        done[0] += 1
        lead.append(pulled[0] - done[0])
        time.sleep(0.003)
        return to_numpy(value)

    pipeline = hop.pipeline(frames, slow)
    pipeline.start()
    assert pipeline.wait(timeout=30)
    # inboxes of 2 (+1 working, +1 blocked) on each side; a ring adds its 4 slots
    bound = 8 + (4 if hop.kind != "inbox" else 0)
    assert max(lead) <= bound
    assert len(hop.delivered) == 40


def test_drops_are_counted(hop: Hop) -> None:
    """A real-time downstream drops under load, and produced == delivered + dropped."""

    def slow(value: Any) -> Any:
        time.sleep(0.002)
        return to_numpy(value)

    source = [hop.payload(np.full((4,), i, dtype=np.int64)) for i in range(200)]
    pipeline = hop.pipeline(source, slow, policy="latest")
    pipeline.start()
    assert pipeline.wait(timeout=30)
    stats = pipeline.statistics()
    dropped = sum(s.dropped_total for s in stats.values())
    assert dropped > 0
    assert stats["src"].items_out == 200 == len(hop.delivered) + dropped


def test_stop_mid_run_is_bounded_and_accounts_for_everything(hop: Hop) -> None:
    """stop() on an endless run returns promptly; every produced item is delivered or dropped."""

    def frames() -> Iterator[Any]:
        for i in itertools.count():
            yield hop.payload(np.full((4,), i, dtype=np.int64))

    def slow(value: Any) -> Any:
        time.sleep(0.002)
        return to_numpy(value)

    pipeline = hop.pipeline(frames, slow)
    pipeline.start()
    deadline = time.monotonic() + 10
    while len(hop.delivered) < 10 and time.monotonic() < deadline:
        time.sleep(0.005)
    started = time.monotonic()
    pipeline.stop()
    assert time.monotonic() - started < 1.0
    stats = pipeline.statistics()
    dropped = sum(s.dropped_total for s in stats.values())
    assert stats["src"].items_out == len(hop.delivered) + dropped


@pytest.mark.parametrize("size", [0, 1, 4 << 20])
def test_empty_and_large_payloads(hop: Hop, size: int) -> None:
    """Empty and multi-megabyte payloads cross unchanged."""
    source = [hop.payload(np.arange(size, dtype=np.uint8) + i) for i in range(3)]
    pipeline = hop.pipeline(source, to_numpy)
    pipeline.start()
    assert pipeline.wait(timeout=30)
    got = [item.payload for item in hop.delivered]
    assert [g.shape for g in got] == [(size,)] * 3
    for i, value in enumerate(got):
        assert np.array_equal(value, np.arange(size, dtype=np.uint8) + i)


def test_every_channel_says_which_wire_form_it_takes() -> None:
    """A ring and a DistChannel are both Channels; only the one that leaves the host is portable."""
    channels: list[type[Channel]] = [ShmRing, DistChannel]  # mypy holds each to the Protocol
    assert [channel.portable for channel in channels] == [False, True]


@pytest.mark.parametrize("sole", [True, False])
def test_a_closed_ring_uncounts_an_item_only_from_its_sole_producer(sole: bool) -> None:
    """Refused at stop: a sole upstream never emitted it; a shared one did (its others had it)."""
    import reactivex

    from rxstream._kernel._stats import StageCounters
    from rxstream.ranks._boundary import Boundary

    ring = ShmRing.create(slots=2, slot_bytes=1 << 12)
    ring.unlink()
    ring.close()
    counters = StageCounters("up", "pipe")
    counters.items_out = 3  # the upstream counted each item out before handing it on
    boundary = Boundary("up>down", ring, timing=False)
    items = [rxstream.PipelineItem(i, rxstream.PipelineMetadata()) for i in range(3)]
    closed: list[bool] = []
    boundary.write(
        reactivex.from_iterable(items),
        counters,
        "up",
        lambda exc: pytest.fail(str(exc)),
        lambda: None,
        on_closed=lambda: closed.append(True),
        sole=sole,
    )
    assert closed == [True]
    if sole:
        assert (counters.items_out, dict(counters.snapshot().dropped)) == (0, {"stopped": 3})
    else:
        assert (counters.items_out, dict(counters.snapshot().dropped)) == (3, {})
