"""Walks and chunked connections in the engine: ``ctx.walks``, ``chunks=``, their topology."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import rxstream
from rxstream import PipelineError, PipelineItem
from rxstream.doc import DocPathError
from rxstream.topology import (
    CLIENT,
    ClientStream,
    EveryItem,
    FixedSize,
    GraphSection,
    PartitionDefinition,
    ProducerWalkCtx,
    Sliding,
    UntilFinal,
    find_client_streams,
    format_topology,
    model_of,
)
from rxstream.transport import MemoryTransport

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "tests" / "apps" / "walks_app.py")


def run_threads(pipeline: rxstream.Pipeline, stream: str = "out") -> list[PipelineItem]:
    """Start ``pipeline`` (every rank in this process, through rings), wait, the items out."""
    pipeline.start()
    assert pipeline.wait(timeout=30)
    transport = pipeline.context.transport
    assert isinstance(transport, MemoryTransport)
    return transport.items(stream)


def tagger(walk: str) -> Callable[[Any], tuple[str, Any]]:
    """A walk's stage function: the payload, marked with the walk that ran it."""
    return lambda payload: (walk, payload)


def hops(item: PipelineItem) -> list[str]:
    """The hop names of an item's timeline, in order."""
    return [hop for hop, _ in item.metadata.timeline]


class RandomPicker:
    """A consumer_walk that picks at random and records every call it gets."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.calls: list[tuple[str, str, dict[str, int], Any, str]] = []

    def __call__(self, ctx: ProducerWalkCtx) -> str:
        walk = self.random.choice(["loud", "quiet"])
        item = ctx.fwd_info
        assert isinstance(item, PipelineItem)
        self.calls.append((ctx.producer_walk, ctx.node, dict(ctx.loop_iters), item.payload, walk))
        return walk


def talker(ctx: rxstream.Context, picker: RandomPicker) -> rxstream.Pipeline:
    """think (rank 0) -> talk (rank 1, producer-triggered, chunks of 3) -> out."""
    return (
        ctx.source(range(11), name="think")
        | ctx.walks(
            {
                "loud": ctx.pipe(lambda c: [x * 10 for x in c], name="amp")
                | ctx.pipe(tagger("loud"), name="shout"),
                "quiet": ctx.pipe(tagger("quiet"), name="whisper"),
            },
            consumer_walk=picker,
            chunks=lambda: FixedSize(3),
            name="talk",
            rank=1,
        )
        | ctx.stream("out")
    )


@pytest.mark.parametrize("mode", ["threads", "drive"])
def test_each_chunk_runs_the_walk_its_producer_picked_across_a_rank_boundary(
    ctx: rxstream.Context, mode: str
) -> None:
    """The producer picks per item before the ring; each chunk runs its last item's walk."""
    picker = RandomPicker(seed=7)
    pipeline = talker(ctx, picker)
    # the 12th pull ends the source under drive, which releases the last, short chunk
    items = run_threads(pipeline) if mode == "threads" else pipeline.drive(frames=12, items=True)
    picks = [call[-1] for call in picker.calls]
    chunks = [list(range(start, min(start + 3, 11))) for start in range(0, 11, 3)]
    assert any(len({picks[x] for x in chunk}) == 2 for chunk in chunks)  # the seed mixes walks
    expected = []
    for chunk in chunks:
        walk = picks[chunk[-1]]
        expected.append((walk, [x * 10 for x in chunk] if walk == "loud" else chunk))
    assert [item.payload for item in items] == expected
    for item, (walk, _) in zip(items, expected, strict=True):
        ran = [hop for hop in hops(item) if hop.startswith(("loud.", "quiet."))]
        assert ran == (
            ["loud.amp.in", "loud.amp.out", "loud.shout.in", "loud.shout.out"]
            if walk == "loud"
            else ["quiet.whisper.in", "quiet.whisper.out"]
        )
    assert [call[:4] for call in picker.calls] == [
        ("rank0.walk", "think", {"think": index}, index) for index in range(11)
    ]
    if mode == "threads":
        assert "think>talk.out" in hops(items[0])
        talk = pipeline.statistics()["talk"]
        assert (talk.kind, talk.items_in, talk.items_out) == ("walks", 4, 4)


def test_launched_ranks_pick_on_the_producer_and_run_the_walk_on_the_consumer(
    tmp_path: Path,
) -> None:
    """Across processes the producer's rank picks and rank 1 runs each chunk's walk."""
    out = tmp_path / "chunks.jsonl"
    result = rxstream.launch(APP, ranks=2, config={"out": str(out)}, timeout=60)
    assert result.egressed == 5
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [
        {"walk": "loud", "chunk": [0, 1], "rank": 1},
        {"walk": "quiet", "chunk": [2, 3], "rank": 1},
        {"walk": "loud", "chunk": [4, 5], "rank": 1},
        {"walk": "quiet", "chunk": [6, 7], "rank": 1},
        {"walk": "loud", "chunk": [8], "rank": 1},
    ]


def test_the_conductor_picks_each_pass_from_a_doc_path(ctx: rxstream.Context) -> None:
    """pick=doc.desired.walk is read per pass: a write switches the walk of the next item."""
    doc = ctx.doc("control", defaults={"walk": "denoise"})

    def frames() -> Iterator[int]:
        for index in range(6):
            if index == 3:
                doc.set(walk="skip")
            yield index

    pipeline = (
        ctx.source(frames, name="frames")
        | ctx.walks(
            {
                "denoise": ctx.pipe(lambda x: x * 2, name="a") | ctx.pipe(tagger("denoise")),
                "skip": ctx.pipe(tagger("skip")),
            },
            pick=doc.desired.walk,
        )
        | ctx.stream("out")
    )
    assert pipeline.drive(frames=6) == [
        ("denoise", 0),
        ("denoise", 2),
        ("denoise", 4),
        ("skip", 3),
        ("skip", 4),
        ("skip", 5),
    ]


def test_a_pick_function_reads_the_control_doc_in_a_threaded_run(ctx: rxstream.Context) -> None:
    """pick=f gets the control doc's snapshot per pass; a conductor pass may be a chunk."""
    doc = ctx.doc("control", defaults={"steps": 0})
    pipeline = (
        ctx.source(range(6), name="frames")
        | ctx.walks(
            {"denoise": ctx.pipe(tagger("denoise")), "skip": ctx.pipe(tagger("skip"))},
            pick=lambda snapshot: "skip" if snapshot["steps"] == 0 else "denoise",
            chunks=lambda: Sliding(3, 2),
            rank=1,
        )
        | ctx.stream("out")
    )
    assert [item.payload for item in run_threads(pipeline)] == [
        ("skip", [0, 1, 2]),
        ("skip", [2, 3, 4]),
        ("skip", [4, 5]),
    ]
    doc.set(steps=4)
    assert pipeline.drive(frames=3) == [("denoise", [0, 1, 2])]


def test_a_chunk_is_one_item_of_the_payloads_with_merged_metadata(ctx: rxstream.Context) -> None:
    """chunks= on a pipe across ranks: fn gets lists; pts is the last item's, input the newest."""
    got: list[list[str]] = []

    def say(chunk: list[str]) -> str:
        got.append(chunk)
        return " ".join(chunk)

    pipeline = (
        ctx.input("words")
        | ctx.pipe(str.upper, name="upper")
        | ctx.pipe(
            say,
            name="say",
            rank=1,
            chunks=lambda: UntilFinal(lambda word: word.endswith(".")),
        )
        | ctx.stream("out")
    )
    for word in ["hello", "there.", "bye", "now.", "left"]:
        pipeline.feed("words", word, at_ms=1000)
    items = pipeline.drive(frames=5, items=True)
    assert got == [["HELLO", "THERE."], ["BYE", "NOW."]]  # "left" waits for its final word
    pipeline.feed("words", "over.", at_ms=1000)
    items += pipeline.drive(frames=5, items=True)
    assert got == [["HELLO", "THERE."], ["BYE", "NOW."], ["LEFT", "OVER."]]
    assert [item.payload for item in items] == ["HELLO THERE.", "BYE NOW.", "LEFT OVER."]
    assert [item.metadata.input_seq for item in items] == [2, 4, 6]
    assert [item.metadata.pts for item in items] == [1, 3, 5]
    assert hops(items[0])[:2] == ["input.recv", "words.in"]


def test_a_client_stream_is_chunked_by_its_own_policy(ctx: rxstream.Context) -> None:
    """ctx.input(chunks=) releases lists of samples; a short rest waits for the next ones."""
    pipeline = ctx.input("audio", chunks=lambda: FixedSize(3)) | ctx.stream("out")
    for sample in range(7):
        pipeline.feed("audio", sample)
    assert pipeline.drive(frames=7) == [[0, 1, 2], [3, 4, 5]]
    for sample in range(7, 9):
        pipeline.feed("audio", sample)
    assert pipeline.drive(frames=7) == [[6, 7, 8]]  # a driven input ends only with its session


def test_the_topology_reports_the_walks_chunks_and_walk_driver(ctx: rxstream.Context) -> None:
    """pipeline.topology() and model_of report the walks the run runs and each edge's policy."""
    picker = RandomPicker(seed=1)
    pipeline = (
        ctx.input("mouse", chunks=lambda: FixedSize(4))
        | ctx.pipe(lambda c: c, name="think")
        | ctx.walks(
            {
                "loud": ctx.pipe(lambda c: c, name="amp") | ctx.pipe(lambda c: c, name="shout"),
                "quiet": ctx.pipe(lambda c: c, name="whisper"),
            },
            consumer_walk=picker,
            chunks=lambda: FixedSize(3),
            name="talk",
            rank=1,
        )
        | ctx.pipe(lambda c: c, name="post")
        | ctx.stream("out")
    )
    topology = pipeline.topology()
    client, boundary = topology.connections
    assert (client.from_partition, client.edge_name) == (CLIENT, "mouse")
    assert repr(client.chunk_policy_factory()) == "FixedSize(4)"
    assert repr(boundary.chunk_policy_factory()) == "FixedSize(3)"
    assert (boundary.edge_name, boundary.consumer_walk) == ("think>talk", picker)
    assert topology.producer_triggered_partitions() == {"rank1"}
    assert topology.walk_drivers() == {"rank1": boundary}
    topology.check_walk_driving_connections()
    model = model_of(pipeline)
    assert model.partitions == {
        "rank0": PartitionDefinition(("rank0.walk",)),
        "rank1": PartitionDefinition(("loud", "quiet")),
    }
    assert model.walks["loud"] == GraphSection(
        {
            "loud.amp": ("think>talk",),
            "loud.shout": ("loud.amp>loud.shout",),
            "post": ("talk>post",),
            "out": ("post>out",),
        }
    )
    assert model.walks["quiet"] == GraphSection(
        {"quiet.whisper": ("think>talk",), "post": ("talk>post",), "out": ("post>out",)}
    )
    assert find_client_streams(model) == {"mouse": ClientStream("mouse", "rank0.walk", "rank0")}
    assert format_topology(model) == (
        "partitions: rank0, rank1\n"
        "walks:\n"
        "  rank0: rank0.walk\n"
        "  rank1: loud, quiet (the producer picks, over think>talk)\n"
        "connections:\n"
        "  think>talk: rank0 -> rank1, chunks FixedSize(3), drives the walk\n"
        "client streams:\n"
        "  mouse: client -> rank0, unbounded"
    )


def test_a_conductor_picked_partition_is_listed_with_its_walks(ctx: rxstream.Context) -> None:
    """Walks the conductor picks are listed as such; a default edge crosses item by item."""
    doc = ctx.doc("control", defaults={"walk": "a"})
    pipeline = (
        ctx.source(range(3))
        | ctx.walks({"a": ctx.pipe(abs), "b": ctx.pipe(abs)}, pick=doc.desired.walk, rank=1)
        | ctx.stream("out")
    )
    model = model_of(pipeline)
    [connection] = model.topology.connections
    assert connection.chunk_policy_factory is EveryItem
    assert connection.consumer_walk is None
    assert "  rank1: a, b (the conductor picks)\n" in format_topology(model)
    assert model.walks["a"] == GraphSection({"a.abs": ("source>walks",), "out": ("walks>out",)})


def test_a_flush_resets_the_stateful_stages_of_every_walk(ctx: rxstream.Context) -> None:
    """A flush reaches the reset() of the stages inside a walks stage, a doc.bind's too."""

    class Counter:
        def __init__(self) -> None:
            self.count = 0

        def __call__(self, payload: int) -> int:
            self.count += 1
            return self.count

        def reset(self) -> None:
            self.count = 0

    doc = ctx.doc("control", defaults={"walk": "count"})

    def frames() -> Iterator[int]:
        for index in range(5):
            if index == 3:
                ctx.control.flush()
            yield index

    counted = ctx.pipe(Counter(), name="n") | doc.bind(lambda _: Counter(), [], name="m")
    pipeline = (
        ctx.source(frames)
        | ctx.walks({"count": counted}, pick=doc.desired.walk)
        | ctx.stream("out")
    )
    assert pipeline.drive(frames=5) == [1, 2, 3, 1, 2]


# --- errors -------------------------------------------------------------------------------


def walk_builds(ctx: rxstream.Context) -> list[tuple[Callable[[], Any], str]]:
    """Each wrong ctx.walks call and the message it gets."""
    doc = ctx.doc("control", defaults={"walk": "a"})
    pick = doc.desired.walk
    reused = ctx.pipe(abs, name="reused")
    return [
        (
            lambda: ctx.walks({}, pick=pick),
            r"walks must be a non-empty mapping of walk name to stage or pipeline, got \{\} "
            r"for stage 'walks'",
        ),
        (
            lambda: ctx.walks({"a.b": ctx.pipe(abs)}, pick=pick, name="w"),
            r"walk names must be non-empty strs without '\.' or '>', got 'a\.b' for stage 'w'",
        ),
        (
            lambda: ctx.walks({"a": abs}, pick=pick),  # type: ignore[dict-item]
            r"walk 'a' of stage 'walks' must be a stage or a pipeline of stages, "
            r"got builtin_function_or_method",
        ),
        (
            lambda: ctx.walks({"a": ctx.source(range(3), name="s")}, pick=pick),
            r"walk 'a' of stage 'walks' is a chain of 1-input stages \(no source, sink, fan-in "
            r"or walks\), got <Stage source 's'>",
        ),
        (
            lambda: ctx.walks({"a": ctx.pipe(abs, name="p", rank=1)}, pick=pick),
            r"the stages of a walk run in the walks stage's partition, got rank=1 on stage 'p' "
            r"in walk 'a' of stage 'walks'",
        ),
        (
            lambda: ctx.walks({"a": ctx.pipe(abs, name="p", chunks=EveryItem)}, pick=pick),
            r"chunks= is declared on a connection's consuming stage, got it on stage 'p' "
            r"inside walk 'a' of stage 'walks'",
        ),
        (
            lambda: ctx.walks({"a": reused, "b": reused}, pick=pick),
            r"stage 'reused' is placed twice \(walks 'a' and 'b' of stage 'walks'\); a stage "
            r"object is one node: build another",
        ),
        (
            lambda: ctx.walks({"a": ctx.pipe(abs)}),
            r"walks needs pick= \(the conductor picks each pass's walk\) or consumer_walk= "
            r"\(the producer picks it\), got neither for stage 'walks'",
        ),
        (
            lambda: ctx.walks({"a": ctx.pipe(abs)}, pick=pick, consumer_walk=lambda c: "a"),
            r"walks needs pick= .*, got both for stage 'walks'",
        ),
        (
            lambda: ctx.walks({"a": ctx.pipe(abs)}, pick="a"),  # type: ignore[arg-type]
            r"pick must be a doc ref like doc\.desired\.walk or a function of the control "
            r"doc's snapshot, got 'a' for stage 'walks'",
        ),
        (
            lambda: ctx.walks({"a": ctx.pipe(abs)}, consumer_walk="a"),  # type: ignore[arg-type]
            r"consumer_walk must be a function of a ProducerWalkCtx that returns a walk name, "
            r"got 'a' for stage 'walks'",
        ),
        (
            lambda: ctx.walks({"a": ctx.pipe(abs)}, pick=pick, chunks=FixedSize(2)),  # type: ignore[arg-type]
            r"chunks must be a factory that makes a ChunkPolicy \(a class like EveryItem, or "
            r"lambda: FixedSize\(4\)\), got FixedSize\(2\) for stage 'walks'",
        ),
        (
            lambda: ctx.pipe(abs, chunks=lambda: 3),  # type: ignore[arg-type, return-value]
            r"chunks\(\) must return a ChunkPolicy \(with overlapping and ready\), got 3 "
            r"for stage 'abs'",
        ),
        (
            lambda: ctx.input("mic", chunks=3),  # type: ignore[arg-type]
            r"chunks must be a factory that makes a ChunkPolicy .*, got 3 for stage 'mic'",
        ),
        (
            lambda: ctx.walks(
                {"a": ctx.pipe(abs)}, consumer_walk=lambda c: "a", chunks=lambda: Sliding(3)
            ),
            r"chunks into a producer-triggered partition must not overlap \(a chunk runs under "
            r"one walk\), got Sliding\(3, 1\) for stage 'walks'",
        ),
    ]


def test_wrong_walks_and_chunks_arguments_are_refused(ctx: rxstream.Context) -> None:
    """Every wrong builder argument gets an error naming the field, the rule and the value."""
    for build, message in walk_builds(ctx):
        with pytest.raises(rxstream.StageBuildError, match=f"^{message}$"):
            build()


def test_a_pick_ref_to_a_missing_path_fails_at_build(ctx: rxstream.Context) -> None:
    """pick=doc.desired.<missing> fails when the stage is built, not on the first pass."""
    doc = ctx.doc("control", defaults={"walk": "a"})
    with pytest.raises(DocPathError, match="nope"):
        ctx.walks({"a": ctx.pipe(abs)}, pick=doc.desired.nope)


def placements(ctx: rxstream.Context) -> list[tuple[Callable[[], rxstream.Pipeline], str]]:
    """Each pipeline that places walks or chunks against the rules, and its message."""
    doc = ctx.doc("control", defaults={"walk": "a"})
    pick = doc.desired.walk

    def walks(name: str, walk: str, rank: int | None = None) -> rxstream.Stage:
        return ctx.walks({walk: ctx.pipe(abs)}, pick=pick, name=name, rank=rank)

    return [
        (
            lambda: ctx.source(range(3), name="src") | ctx.pipe(abs, name="p", chunks=EveryItem),
            r"chunks= is declared on a connection between partitions, but stage 'p' takes "
            r"'src' from its own rank 0: place it on another rank than its input",
        ),
        (
            lambda: (
                ctx.source(range(3), name="src")
                | ctx.walks({"a": ctx.pipe(abs)}, consumer_walk=lambda c: "a", name="w")
            ),
            r"consumer_walk= is declared on a connection between partitions, but stage 'w' "
            r"takes 'src' from its own rank 0: place it on another rank than its input",
        ),
        (
            lambda: ctx.source(range(3)) | walks("w1", "a") | walks("w2", "b"),
            r"a partition declares its walks once, got walks stages 'w1' and 'w2' on rank 0 "
            r"\(partition 'rank0'\)",
        ),
        (
            lambda: ctx.source(range(3)) | walks("w1", "a") | walks("w2", "a", rank=1),
            r"walk names must be unique in a pipeline, got 'a' in stages 'w1' and 'w2'",
        ),
        (
            lambda: (
                [
                    ctx.source(range(3), name="src")
                    | ctx.walks(
                        {"a": ctx.pipe(abs)}, consumer_walk=lambda c: "a", name="w", rank=1
                    ),
                    ctx.source(range(3), name="other") | ctx.pipe(abs, name="p", rank=1),
                ]
                | ctx.zip(name="pair")
            ),
            r"producer-triggered partition 'rank1' takes one connection, the one into its walks "
            r"stage 'w', got 'other>p' into stage 'p'",
        ),
        (
            lambda: ctx.graph(
                ctx.source(range(3), name="src")
                | ctx.walks({"a": ctx.pipe(abs)}, consumer_walk=lambda c: "a", name="w", rank=1)
                | ctx.stream("out"),
                ctx.input("mic", rank=1) | ctx.stream("echo"),
            ),
            r"producer-triggered partition 'rank1' takes one connection, the one into its walks "
            r"stage 'w', got client stream 'mic' into stage 'mic'",
        ),
    ]


def test_walks_and_chunks_placed_against_the_rules_are_refused(ctx: rxstream.Context) -> None:
    """The plan refuses every placement of walks and chunks against the partition rules."""
    for make, message in placements(ctx):
        with pytest.raises(rxstream.StageBuildError, match=f"^{message}$"):
            make().plan  # noqa: B018


def test_a_pick_that_names_no_walk_fails_the_walks_stage(ctx: rxstream.Context) -> None:
    """The conductor's pick naming no walk ends the run naming the stage, item and value."""
    doc = ctx.doc("control", defaults={"walk": "fast"})
    pipeline = (
        ctx.source(range(3))
        | ctx.walks({"slow": ctx.pipe(abs)}, pick=doc.desired.walk, name="w")
        | ctx.stream("out")
    )
    with pytest.raises(
        PipelineError,
        match=r"^stage 'w' failed on item pts=0 input_seq=0: TopologyError: the conductor's "
        r"pick must name one of the walks of stage 'w' \(slow\), got 'fast' from doc path walk$",
    ):
        pipeline.drive(frames=1)


def test_a_consumer_walk_that_names_no_walk_fails_the_producer(ctx: rxstream.Context) -> None:
    """A producer's consumer_walk naming no walk ends the run naming the producer."""
    pipeline = (
        ctx.source(range(3), name="think")
        | ctx.walks({"a": ctx.pipe(abs)}, consumer_walk=lambda c: "b", name="talk", rank=1)
        | ctx.stream("out")
    )
    message = (
        r"^stage 'think' failed on item pts=0 input_seq=0: TopologyError: consumer_walk must "
        r"return one of the walks of stage 'talk' \(a\), got 'b'$"
    )
    with pytest.raises(PipelineError, match=message):
        pipeline.drive(frames=1)
    with pytest.raises(PipelineError, match=message):
        run_threads(pipeline)


def test_a_failing_chunk_policy_fails_the_consuming_stage(ctx: rxstream.Context) -> None:
    """A chunk policy that raises (here a user's is_final) ends the run naming the consumer."""

    def is_final(word: str) -> bool:
        raise RuntimeError(f"cannot judge {word!r}")

    pipeline = (
        ctx.source(["a"], name="src")
        | ctx.pipe(abs, name="say", rank=1, chunks=lambda: UntilFinal(is_final))
        | ctx.stream("out")
    )
    with pytest.raises(
        PipelineError,
        match=r"^stage 'say' failed on item pts=0 input_seq=0: RuntimeError: cannot judge 'a'$",
    ):
        pipeline.drive(frames=1)


def test_a_walks_inner_stage_failure_names_the_inner_stage(ctx: rxstream.Context) -> None:
    """A stage inside a walk that raises ends the run under its name in the run."""
    doc = ctx.doc("control", defaults={"walk": "a"})

    def broken(payload: int) -> int:
        raise ValueError(f"bad {payload}")

    pipeline = (
        ctx.source(range(3))
        | ctx.walks({"a": ctx.pipe(broken)}, pick=doc.desired.walk)
        | ctx.stream("out")
    )
    with pytest.raises(
        PipelineError, match=r"^stage 'a\.broken' failed on item pts=0 input_seq=0: ValueError"
    ):
        pipeline.drive(frames=1)


def test_cuda_tensors_cross_a_walk_driving_edge_through_the_bridge() -> None:
    """A (walk, tensor) pair crosses with its CUDA tensor as a ref (mock CUDA), then chunks."""
    torch = pytest.importorskip("torch")
    from rxstream.ipc._cuda import FakeCudaApi

    api = FakeCudaApi()
    ctx = rxstream.Context(transport=MemoryTransport(), cuda_api=api)
    frames = [api.to_device(torch.full((4,), float(index))) for index in range(4)]
    pipeline = (
        ctx.source(frames, name="render")
        | ctx.walks(
            {
                "sum": ctx.pipe(lambda chunk: [float(t.sum()) for t in chunk], name="add"),
                "max": ctx.pipe(lambda chunk: [float(t.max()) for t in chunk], name="top"),
            },
            consumer_walk=lambda walk: "sum" if walk.loop_iters["render"] < 2 else "max",
            chunks=lambda: FixedSize(2),
            rank=1,
        )
        | ctx.stream("out")
    )
    assert [item.payload for item in run_threads(pipeline)] == [[0.0, 4.0], [2.0, 3.0]]
    calls = [call for call, _ in api.log]
    # through the boundary's slot pool: its 8 slots shared and opened once, each tensor copied in
    assert calls.count("share") == calls.count("open") == 8
    assert calls.count("copy") == calls.count("read") == 4


def test_rxstream_topology_prints_the_walks(capsys: pytest.CaptureFixture[str]) -> None:
    """``rxstream topology`` lists each partition's walks and who picks them."""
    from rxstream import cli

    app = str(Path(__file__).parent / "apps" / "walks_app.py")
    assert cli.main(["topology", app]) == 0
    out = capsys.readouterr().out
    assert "rank1: loud, quiet (the producer picks, over think>talk)" in out


@pytest.mark.parametrize(
    ("policy", "fed", "chunks"),
    [
        (lambda: FixedSize(3), 5, [[0, 1, 2]]),
        (lambda: Sliding(3, 2), 4, [[0, 1, 2]]),
    ],
)
def test_items_held_by_a_chunk_policy_at_stop_are_accounted_for(
    policy: Callable[[], Any], fed: int, chunks: list[list[int]]
) -> None:
    """Stopping a run flushes a stream buffer's rest as a last chunk, dropped as stopped."""
    ctx = rxstream.Context()
    pipeline = ctx.input("audio", chunks=policy) | ctx.stream("out")
    pipeline.start()
    for sample in range(fed):
        pipeline.feed("audio", sample)
    transport = ctx.transport
    assert isinstance(transport, MemoryTransport)
    pause = threading.Event()
    for _ in range(500):
        if transport.payloads("out") == chunks:
            break
        pause.wait(0.01)
    pipeline.stop()
    assert transport.payloads("out") == chunks
    stats = pipeline.statistics()
    assert stats["audio"].items_out == fed
    assert (stats["out"].items_in, dict(stats["out"].dropped)) == (1, {"stopped": 1})
