"""The partition topology: its declarations, walk-driving rules, client streams, deployments."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

import rxstream
from rxstream.cli import main
from rxstream.topology import (
    CLIENT,
    ClientStream,
    ClientStreamLimits,
    Connection,
    DeploymentError,
    EveryItem,
    FixedSize,
    GraphEdge,
    GraphSection,
    PartitionDefinition,
    PartitionTopology,
    ProducerWalkCtx,
    Sliding,
    StreamingGraphEdge,
    TopologyError,
    TopologyModel,
    client_stream_limits,
    find_client_stream,
    find_client_streams,
    model_of,
    validate_deployment,
)

APPS = Path(__file__).parent / "apps"


def pick_walk(ctx: ProducerWalkCtx) -> str:
    """A consumer_walk: the talker's walk follows the producer's loop count."""
    return "speak" if ctx.loop_iters.get("decode", 0) else "warmup"


def other_walk(ctx: ProducerWalkCtx) -> str:
    """A second, different consumer_walk."""
    return "speak"


def model_topology() -> PartitionTopology:
    """A thinker -> talker model with two client streams."""
    return PartitionTopology(
        ["thinker", "talker"],
        [
            Connection(CLIENT, "thinker", "mouse", EveryItem, limits=ClientStreamLimits(100)),
            Connection(CLIENT, "thinker", "audio", lambda: FixedSize(4)),
            Connection("thinker", "talker", "hidden", EveryItem, consumer_walk=pick_walk),
        ],
    )


def test_client_connections_and_producer_triggered_partitions() -> None:
    """The client's streams are listed in order; the talker's walk is driven by its stream."""
    topology = model_topology()
    assert [c.edge_name for c in topology.client_connections()] == ["mouse", "audio"]
    assert topology.producer_triggered_partitions() == {"talker"}
    assert topology.walk_drivers() == {"talker": topology.connections[2]}
    topology.check_walk_driving_connections()
    assert PartitionTopology(["a"]).connections == []


def test_walk_drivers_picks_one_driver_per_partition() -> None:
    """Two connections sharing a consumer_walk into one partition: one driver, no violation."""
    topology = PartitionTopology(
        ["a", "b"],
        [
            Connection("a", "b", "x", EveryItem, consumer_walk=pick_walk),
            Connection("a", "b", "y", EveryItem, consumer_walk=pick_walk),
        ],
    )
    assert topology.walk_drivers() == {"b": topology.connections[0]}
    topology.check_walk_driving_connections()


def test_walk_driving_violations_are_all_named() -> None:
    """Two producers, a second consumer_walk and overlapping chunks are each named."""
    topology = PartitionTopology(
        ["a", "b", "c"],
        [
            Connection("a", "c", "x", EveryItem, consumer_walk=pick_walk),
            Connection("b", "c", "y", EveryItem, consumer_walk=pick_walk),
            Connection("a", "c", "z", EveryItem, consumer_walk=other_walk),
            Connection("a", "c", "w", lambda: Sliding(4, 2), consumer_walk=pick_walk),
        ],
    )
    with pytest.raises(
        TopologyError,
        match=r"^producer-triggered partition 'c' takes connections from one producer "
        r"\('a', by 'x'\), got 'b' for connection 'y'; "
        r"the connections into producer-triggered partition 'c' share one consumer_walk "
        r"\(that of 'x'\), got other_walk for connection 'z'; "
        r"chunks into producer-triggered partition 'c' must not overlap \(a chunk runs under "
        r"one walk\), got Sliding\(4, 2\) for connection 'w'$",
    ):
        topology.check_walk_driving_connections()


def test_a_connection_without_the_shared_walk_is_a_violation() -> None:
    """A connection into a producer-triggered partition without consumer_walk is named."""
    topology = PartitionTopology(
        ["a", "b"],
        [
            Connection("a", "b", "x", EveryItem, consumer_walk=pick_walk),
            Connection("a", "b", "y", EveryItem),
        ],
    )
    with pytest.raises(
        TopologyError,
        match=r"^the connections into producer-triggered partition 'b' share one "
        r"consumer_walk \(that of 'x'\), got None for connection 'y'$",
    ):
        topology.check_walk_driving_connections()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: Connection("a", "b", "x", EveryItem, limits=ClientStreamLimits(5)),
            r"^limits are for client streams only, got ClientStreamLimits\(max_items=5, "
            r"item_size=None, unit='items'\) for connection 'x' from partition 'a': "
            r"a partition's output is bounded by the model itself$",
        ),
        (
            lambda: Connection(CLIENT, "b", "x", EveryItem, limits=(5,)),  # type: ignore[arg-type]
            r"^limits must be a ClientStreamLimits, got \(5,\) for client stream 'x'$",
        ),
        (
            lambda: Connection(CLIENT, "b", "x", EveryItem, limits=ClientStreamLimits(0)),
            r"^max_items must be > 0, got 0 for client stream 'x'$",
        ),
        (
            lambda: Connection(CLIENT, "b", "x", EveryItem, limits=ClientStreamLimits(2.5)),  # type: ignore[arg-type]
            r"^max_items must be an int or None, got 2\.5 for client stream 'x'$",
        ),
        (
            lambda: Connection("a", "b", "", EveryItem),
            r"^edge_name must be a non-empty str, got ''$",
        ),
        (
            lambda: Connection("", "b", "x", EveryItem),
            r"^from_partition must be a non-empty str, got '' for connection 'x'$",
        ),
        (
            lambda: Connection("a", CLIENT, "x", EveryItem),
            r"^to_partition must be a partition, got CLIENT \('client'\) for connection 'x': "
            r"the client only feeds streams$",
        ),
        (
            lambda: Connection("a", "a", "x", EveryItem),
            r"^a connection joins two partitions, got 'a' twice for connection 'x'$",
        ),
        (
            lambda: Connection("a", "b", "x", 3),  # type: ignore[arg-type]
            r"^chunk_policy_factory must be callable, got 3 for connection 'x'$",
        ),
        (
            lambda: Connection("a", "b", "x", EveryItem, consumer_walk="w"),  # type: ignore[arg-type]
            r"^consumer_walk must be callable or None, got 'w' for connection 'x'$",
        ),
    ],
)
def test_connection_rules(make: Any, message: str) -> None:
    """A connection declared against a rule names the field, the rule and the value."""
    with pytest.raises(TopologyError, match=message):
        make()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: PartitionTopology(["a", "a"]),
            r"^partition names must be unique, got 'a' twice$",
        ),
        (
            lambda: PartitionTopology([CLIENT]),
            r"^a partition name must be a non-empty str other than 'client', got 'client'$",
        ),
        (
            lambda: PartitionTopology(["a"], [Connection(CLIENT, "b", "x", EveryItem)]),
            r"^to_partition must be a declared partition \(a\), got 'b' for connection 'x'$",
        ),
        (
            lambda: PartitionTopology(
                ["a", "b"],
                [Connection("a", "b", "x", EveryItem), Connection(CLIENT, "b", "x", EveryItem)],
            ),
            r"^edge names must be unique, got 'x' twice$",
        ),
        (
            lambda: PartitionTopology(["a"], ["x"]),  # type: ignore[list-item]
            r"^connections must be Connection objects, got 'x'$",
        ),
    ],
)
def test_topology_rules(make: Any, message: str) -> None:
    """A topology declared against a rule is refused with a message naming it."""
    with pytest.raises(TopologyError, match=message):
        make()


def test_producer_walk_ctx_is_refilled_per_call() -> None:
    """One ProducerWalkCtx is refilled for every call; consumer_walk reads the current state."""
    ctx = ProducerWalkCtx()
    assert (ctx.producer_walk, ctx.node, dict(ctx.loop_iters), ctx.fwd_info) == ("", "", {}, None)
    assert pick_walk(ctx.refill("main", "lm_head", {"decode": 0})) == "warmup"
    assert ctx.refill("main", "lm_head", {"decode": 3}, fwd_info="pass") is ctx
    assert pick_walk(ctx) == "speak"
    assert ctx.fwd_info == "pass"
    fresh = ctx.refill("other", "n")
    assert (fresh.producer_walk, fresh.node, dict(fresh.loop_iters), fresh.fwd_info) == (
        "other",
        "n",
        {},
        None,
    )


def test_graph_edges_have_the_seed_fields() -> None:
    """GraphEdge and StreamingGraphEdge take every listed field, with the listed defaults."""
    edge = StreamingGraphEdge("talker_in", "hidden", target_partition="talker")
    assert isinstance(edge, GraphEdge)
    assert (edge.next_node, edge.name, edge.tensor_info, edge.target_partition) == (
        "talker_in",
        "hidden",
        [],
        "talker",
    )
    assert (edge.persist, edge.conductor_new_token, edge.is_streaming, edge.output_modality) == (
        False,
        False,
        False,
        "",
    )
    assert (
        edge._persist_for_loop,
        edge._final_stream_chunk,
        edge._total_fanin,
        edge._shard_dim,
    ) == (False, False, 1, None)
    plain = GraphEdge("n", "e", _total_fanin=2, _shard_dim=0, is_streaming=True)
    assert (plain._total_fanin, plain._shard_dim, plain.is_streaming) == (2, 0, True)


WALKS = {
    "prefill": GraphSection({"embed": ["mouse", "tokens"], "lm": ["embed>lm"]}),
    "decode": GraphSection({"embed": ["mouse"], "lm": ["embed>lm"]}),
    "speak": GraphSection({"vocoder": ["hidden"]}),
}
PARTITIONS = {
    "thinker": PartitionDefinition(["prefill", "decode"]),
    "talker": PartitionDefinition(["speak"]),
}


def test_find_client_stream_is_the_one_consumer_over_every_walk() -> None:
    """A client stream's consumer is its one node; the first walk it runs in routes it."""
    conn = model_topology().connections[0]
    assert find_client_stream(conn, WALKS, PARTITIONS) == ClientStream(
        "embed", "prefill", "thinker"
    )


def test_find_client_streams_maps_every_client_stream() -> None:
    """find_client_streams names each client stream's consumer; one without fails by name."""
    model = TopologyModel(model_topology(), WALKS, PARTITIONS)
    with pytest.raises(
        ValueError,
        match=r"^client stream 'audio' has no consumer: no node in the walks of partition "
        r"'thinker' \(prefill, decode\) takes it$",
    ):
        find_client_streams(model)
    walks = {**WALKS, "decode": GraphSection({"embed": ["mouse"], "ears": ["audio"]})}
    assert find_client_streams(TopologyModel(model_topology(), walks, PARTITIONS)) == {
        "mouse": ClientStream("embed", "prefill", "thinker"),
        "audio": ClientStream("ears", "decode", "thinker"),
    }


@pytest.mark.parametrize(
    ("conn", "walks", "partitions", "message"),
    [
        (
            Connection(CLIENT, "thinker", "mouse", EveryItem),
            {**WALKS, "decode": GraphSection({"other": ["mouse"]})},
            PARTITIONS,
            r"^client stream 'mouse' must have one consumer, got 2 in partition 'thinker': "
            r"embed, other$",
        ),
        (
            Connection(CLIENT, "speaker", "mouse", EveryItem),
            WALKS,
            PARTITIONS,
            r"^client stream 'mouse' flows into partition 'speaker', which has no definition "
            r"\(partitions: thinker, talker\)$",
        ),
        (
            Connection(CLIENT, "thinker", "mouse", EveryItem),
            WALKS,
            {"thinker": PartitionDefinition(["prefill", "verify"])},
            r"^partition 'thinker' names walk 'verify', which has no definition "
            r"\(walks: prefill, decode, speak\)$",
        ),
        (
            Connection("thinker", "talker", "hidden", EveryItem),
            WALKS,
            PARTITIONS,
            r"^connection 'hidden' is not a client stream \(it comes from partition "
            r"'thinker'\)$",
        ),
    ],
)
def test_find_client_stream_errors(
    conn: Connection,
    walks: dict[str, GraphSection],
    partitions: dict[str, PartitionDefinition],
    message: str,
) -> None:
    """More than one consumer, an undefined partition or walk, a non-client edge: a ValueError."""
    with pytest.raises(ValueError, match=message):
        find_client_stream(conn, walks, partitions)


def test_a_serving_config_lowers_a_declared_bound() -> None:
    """client_streams lowers a declared bound and bounds an undeclared one; others stay; no
    other section is taken."""
    limits = client_stream_limits(
        model_topology(), {"client_streams": {"mouse": {"max_items": 50}, "audio": {}}}
    )
    assert limits == {"mouse": ClientStreamLimits(50), "audio": ClientStreamLimits()}
    limits = client_stream_limits(model_topology(), {"client_streams": {"audio": {"max_items": 9}}})
    assert limits == {"mouse": ClientStreamLimits(100), "audio": ClientStreamLimits(9)}
    assert client_stream_limits(model_topology(), None)["mouse"] == ClientStreamLimits(100)
    with pytest.raises(DeploymentError, match="other is not a section"):
        client_stream_limits(model_topology(), {"other": 1})  # a misspelt section applies nothing


def test_a_serving_config_that_raises_a_bound_is_rejected() -> None:
    """Raising a declared bound is refused with the field and both numbers."""
    with pytest.raises(
        DeploymentError,
        match=r"^the deployment has 1 problem:\n- max_items must be <= 100 \(declared by the "
        r"model\), got 500 for client stream 'mouse'$",
    ):
        client_stream_limits(model_topology(), {"client_streams": {"mouse": {"max_items": 500}}})


def test_validate_deployment_lists_every_problem() -> None:
    """Every problem of a config is listed in one error, in order, and kept in .problems."""
    topology = PartitionTopology(
        ["a", "b"],
        [
            Connection(CLIENT, "a", "mouse", EveryItem, limits=ClientStreamLimits(100)),
            Connection(CLIENT, "a", "keys", EveryItem),
            Connection("a", "b", "x", EveryItem, consumer_walk=pick_walk),
            Connection("a", "b", "y", lambda: Sliding(2, 1), consumer_walk=pick_walk),
        ],
    )
    config = {
        "client_streams": {
            "mouse": {"max_items": 500},
            "keys": {"max_items": 0},
            "nope": {"max_items": 3},
            "x": {"max_items": 3},
            "audio": 5,
        }
    }
    config["client_streams"]["keys2"] = {}
    with pytest.raises(DeploymentError) as caught:
        validate_deployment(topology, config)
    assert caught.value.problems == (
        "chunks into producer-triggered partition 'b' must not overlap (a chunk runs under one "
        "walk), got Sliding(2, 1) for connection 'y'",
        "max_items must be <= 100 (declared by the model), got 500 for client stream 'mouse'",
        "max_items must be > 0, got 0 for client stream 'keys'",
        "client_streams.nope is not a client stream of the model (client streams: mouse, keys)",
        "client_streams.x is a connection from partition 'a' to 'b': only a client stream "
        "takes limits (client streams: mouse, keys)",
        "client_streams.audio is not a client stream of the model (client streams: mouse, keys)",
        "client_streams.keys2 is not a client stream of the model (client streams: mouse, keys)",
    )
    assert str(caught.value).startswith("the deployment has 7 problems:\n- chunks into")
    assert isinstance(caught.value, ValueError)
    again = pickle.loads(pickle.dumps(caught.value))
    assert again.problems == caught.value.problems


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (["a"], "the serving config must be a mapping, got list"),
        (
            {"client_streams": [1]},
            "client_streams must be a mapping of edge name -> {max_items: N}, got list",
        ),
        (
            {"clientstreams": {"mouse": {"max_items": 3}}},
            "clientstreams is not a section of the serving config (sections: client_streams)",
        ),
        (
            {"client_streams": {"mouse": 5}},
            "client_streams.mouse must be a mapping like {max_items: N}, got 5",
        ),
        (
            {"client_streams": {"mouse": {"max_item": 5}}},
            "client_streams.mouse.max_item is not a setting (settings: max_items)",
        ),
        (
            {"client_streams": {"mouse": {"max_items": "ten"}}},
            "max_items must be an int, got 'ten' for client stream 'mouse'",
        ),
        (
            {"client_streams": {"mouse": {"max_items": True}}},
            "max_items must be an int, got True for client stream 'mouse'",
        ),
        (
            {"client_streams": {"mouse": {"max_items": -1}}},
            "max_items must be > 0, got -1 for client stream 'mouse'",
        ),
    ],
)
def test_validate_deployment_config_shapes(config: Any, problem: str) -> None:
    """A config of the wrong shape, an unknown section or setting, or a bad bound is named."""
    with pytest.raises(DeploymentError) as caught:
        validate_deployment(model_topology(), config)
    assert caught.value.problems == (problem,)


def test_validate_deployment_accepts_an_equal_or_lower_bound() -> None:
    """A bound equal to the declared one, or on an undeclared stream, is accepted."""
    validate_deployment(
        model_topology(),
        {"client_streams": {"mouse": {"max_items": 100}, "audio": {"max_items": 10**9}}},
    )
    validate_deployment(model_topology(), {})


def build_two_ranks(ctx: rxstream.Context) -> rxstream.Pipeline:
    """mouse (an input) -> prepare on rank 0 -> work on rank 1 -> out."""
    return (
        ctx.input("mouse", ClientStreamLimits(100))
        | ctx.pipe(lambda x: x, name="prepare")
        | ctx.pipe(lambda x: x, name="work", rank=1)
        | ctx.stream("out")
    )


def test_pipeline_topology_of_two_ranks_with_an_input(ctx: rxstream.Context) -> None:
    """Ranks are partitions, the boundary a connection, the input a limited client stream."""
    pipeline = build_two_ranks(ctx)
    topology = pipeline.topology()
    assert topology.partitions == ["rank0", "rank1"]
    client, boundary = topology.connections
    assert (client.from_partition, client.to_partition, client.edge_name) == (
        CLIENT,
        "rank0",
        "mouse",
    )
    assert client.limits == ClientStreamLimits(100)
    assert (boundary.from_partition, boundary.to_partition, boundary.edge_name) == (
        "rank0",
        "rank1",
        pipeline.plan.edge_name(*pipeline.plan.boundaries[0]),
    )
    assert boundary.edge_name == "prepare>work"
    assert boundary.limits is None
    assert isinstance(boundary.chunk_policy_factory(), EveryItem)
    assert topology.producer_triggered_partitions() == set()
    topology.check_walk_driving_connections()
    model = model_of(pipeline)
    assert find_client_streams(model) == {"mouse": ClientStream("mouse", "rank0.walk", "rank0")}
    assert client_stream_limits(topology, {"client_streams": {"mouse": {"max_items": 10}}}) == {
        "mouse": ClientStreamLimits(10)
    }


def test_pipeline_topology_of_one_rank(ctx: rxstream.Context) -> None:
    """A one-rank pipeline without inputs is one partition and no connections."""
    pipeline = ctx.source([1, 2]) | ctx.stream("out")
    assert pipeline.topology() == PartitionTopology(["rank0"], [])


def test_cli_prints_the_partitions_of_the_ranks_app(capsys: pytest.CaptureFixture[str]) -> None:
    """``rxstream topology`` prints an app's partitions, walks and connections, and the checks."""
    assert main(["topology", str(APPS / "ranks_app.py")]) == 0
    assert capsys.readouterr().out == (
        "partitions: rank0, rank1\n"
        "walks:\n"
        "  rank0: rank0.walk\n"
        "  rank1: rank1.walk\n"
        "connections:\n"
        "  prepare>work: rank0 -> rank1, chunks EveryItem()\n"
        "client streams:\n"
        "  none\n"
        "layout on 2 rank(s):\n"
        "  rank 0: frames, prepare\n"
        "  rank 1: work, record, video\n"
        "checks: ok\n"
    )


def test_cli_validates_a_serving_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --config, every problem of the serving config is listed and the exit is 1."""
    config = tmp_path / "serving.yaml"
    config.write_text("client_streams:\n  prepare>work: {max_items: 3}\n", encoding="utf-8")
    assert main(["topology", str(APPS / "ranks_app.py"), "--config", str(config)]) == 1
    captured = capsys.readouterr()
    assert "partitions: rank0, rank1" in captured.out
    assert captured.err == (
        "rxstream topology: the deployment has 1 problem:\n"
        "- client_streams.prepare>work is a connection from partition 'rank0' to 'rank1': "
        "only a client stream takes limits (client streams: none)\n"
    )
    config.write_text("client_streams: {}\n", encoding="utf-8")
    assert main(["topology", str(APPS / "ranks_app.py"), "--config", str(config)]) == 0
    assert capsys.readouterr().out.endswith(f"checks: ok (serving config {config})\n")


def test_cli_reports_bad_yaml_and_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config that is not a YAML mapping exits 1; one that cannot be read exits 2."""
    config = tmp_path / "serving.yaml"
    config.write_text("- a\n", encoding="utf-8")
    assert main(["topology", str(APPS / "ranks_app.py"), "--config", str(config)]) == 1
    assert capsys.readouterr().err == (
        "rxstream topology: the deployment has 1 problem:\n"
        f"- the serving config must be a mapping, got list in {config}\n"
    )
    missing = tmp_path / "missing.yaml"
    assert main(["topology", str(APPS / "ranks_app.py"), "--config", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"rxstream topology: cannot read {missing}: No such file or directory\n"
    )


def test_cli_prints_client_streams_with_their_consumer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A client stream is printed with its bound and consuming node."""
    assert main(["topology", f"{__file__}:build_two_ranks"]) == 0
    out = capsys.readouterr().out
    assert "  mouse: client -> rank0, max 100 items, consumed by 'mouse' (walk rank0.walk)\n" in out


@pytest.mark.parametrize("heading", ["## A worked example", "## Worked example: walks and chunks"])
def test_the_docs_examples_print_what_the_docs_say(heading: str) -> None:
    """Each worked example of docs/topology.md runs and prints the output shown under it."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "topology.md").read_text("utf-8")
    section = text[text.index(heading) :]
    found = re.search(r"```python\n(.*?)```\n\nprints\n\n```\n(.*?)```", section, re.S)
    assert found is not None
    done = subprocess.run(
        [sys.executable, "-c", found.group(1)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == found.group(2)


def test_topology_exports_are_sorted_and_their_annotations_resolve() -> None:
    """rxstream.topology's __all__ is sorted and get_type_hints works on its classes."""
    import rxstream.topology

    assert list(rxstream.topology.__all__) == sorted(rxstream.topology.__all__)
    for name in rxstream.topology.__all__:
        value = getattr(rxstream.topology, name)
        if isinstance(value, type):
            typing.get_type_hints(value)
