"""Ranks over torch.distributed: the cross-host channel, and torchrun launches over loopback.

The channel tests run both sides in this process over two gloo groups on 127.0.0.1; the launch
tests run ``tests/apps/wire_app.py`` on three ranks under torchrun, with ``render>work``
forced onto the cross-host transport and ``work>finish`` left a shared-memory ring.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch

import rxstream
import rxstream.distributed as distributed
from rxstream import PipelineError, PipelineItem, PipelineMetadata
from rxstream.distributed import (
    DistChannel,
    RankLost,
    estimate_offset,
    launch_torchrun,
    loopback_groups,
    open_group,
    torchrun_env,
)
from rxstream.ipc import FramingError, RingClosed
from rxstream.ranks._boundary import decode, encode
from rxstream.ranks._distcontrol import LOST_S, Control
from rxstream.ranks._distlaunch import Peer, cross_edges, use_nccl
from rxstream.testing import assert_same

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "tests" / "apps" / "wire_app.py")
STAGES = ["frames", "render", "render>work", "work", "work>finish", "finish", "video"]
HOPS = [
    "frames.in",
    "frames.out",
    "render.in",
    "render.out",
    "render>work.in",
    "render>work.out",
    "work.in",
    "work.out",
    "work>finish.in",
    "work>finish.out",
]


# --- the channel ------------------------------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[DistChannel, DistChannel]]:
    """A writer and a reader of one boundary, over two gloo groups of this process."""
    groups = loopback_groups(2)
    writer = DistChannel("a>b", groups[0], 1, side="writer")
    reader = DistChannel("a>b", groups[1], 0, side="reader")
    yield writer, reader
    writer.close()
    reader.close()
    reader.statistics()  # waits for the reader's thread to take the close mark


def _nested() -> Any:
    frame = np.arange(40_000, dtype=np.int32)
    return {"twice": [frame, frame], "pair": (torch.ones(9000), "x"), "none": None}


PAYLOADS: dict[str, Callable[[], Any]] = {
    "float32 array": lambda: np.linspace(0, 1, 64 * 64 * 4, dtype=np.float32).reshape(64, 64, 4),
    "transposed uint16": lambda: np.arange(60_000, dtype=np.uint16).reshape(200, 300).T,
    "read-only array": lambda: np.frombuffer(bytes(range(256)) * 300, dtype=np.uint8),
    "structured array": lambda: np.zeros(5000, dtype=[("x", "f4"), ("y", "i8")]),
    "small array": lambda: np.arange(5),
    "empty array": lambda: np.empty((0, 3), dtype=np.float32),
    "bfloat16 tensor": lambda: torch.linspace(0, 1, 128 * 128).reshape(128, 128).bfloat16(),
    "transposed tensor": lambda: torch.arange(100_000).reshape(100, 1000).t(),
    "0-d tensor": lambda: torch.tensor(3.5),
    "small tensor with grad": lambda: torch.ones(3, requires_grad=True),
    "large tensor with grad": lambda: torch.ones(10_000, requires_grad=True),
    "empty tensor": lambda: torch.empty(0, 5),
    "nested": _nested,
    "long pickle": lambda: bytes(100_000),
    "item": lambda: PipelineItem(np.ones(8), PipelineMetadata(pts=3, input_seq=1)),
}


@pytest.mark.parametrize("make", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_payloads_round_trip(
    pair: tuple[DistChannel, DistChannel], make: Callable[[], Any]
) -> None:
    """Arrays come back as numpy, tensors as tensors (dtype, shape, grad), the rest as is."""
    writer, reader = pair
    sent = make()
    writer.put(sent)
    assert_same(reader.get(timeout=10), sent)


def test_a_large_array_arrives_as_memory_of_its_own(pair: tuple[DistChannel, DistChannel]) -> None:
    """What the reader gets is writable memory that the writer's later changes do not touch."""
    writer, reader = pair
    frame = np.zeros((256, 256), dtype=np.float32)
    writer.put(frame)
    frame[:] = 7  # put has returned: the bytes went out already
    got = reader.get(timeout=10)
    assert got.flags.writeable
    assert not got.any()


def test_an_unframable_payload_raises_and_the_channel_goes_on(
    pair: tuple[DistChannel, DistChannel],
) -> None:
    """A payload that does not pickle names its type; the next item crosses as usual."""
    writer, reader = pair
    with pytest.raises(FramingError, match=r"^cannot send a payload of type 'lock' across a"):
        writer.put(threading.Lock())
    writer.put(5)
    assert reader.get(timeout=10) == 5


def test_the_writers_close_ends_the_reader_after_what_was_sent(
    pair: tuple[DistChannel, DistChannel],
) -> None:
    """Items put before the writer's close arrive, then get raises RingClosed."""
    writer, reader = pair
    writer.put(1)
    writer.put(2)
    writer.close()
    assert [reader.get(timeout=10), reader.get(timeout=10)] == [1, 2]
    with pytest.raises(RingClosed):
        reader.get(timeout=10)
    assert reader.statistics().items == 2


def test_a_closed_reader_drains_its_writer_and_counts_every_item(
    pair: tuple[DistChannel, DistChannel],
) -> None:
    """After the reader closes, a writer never blocks, and every item sent is counted."""
    writer, reader = pair
    frame = np.ones(100_000, dtype=np.uint8)
    writer.put(frame)
    assert reader.get(timeout=10).sum() == 100_000

    def send() -> None:
        for _ in range(9):
            writer.put(frame)

    sender = threading.Thread(target=send)
    sender.start()
    reader.close()
    sender.join(10)
    assert not sender.is_alive()
    writer.close()
    assert reader.statistics().items == 10


def test_get_times_out_and_wakes_on_close(pair: tuple[DistChannel, DistChannel]) -> None:
    """get waits at most its timeout; a close from another thread wakes it with RingClosed."""
    _, reader = pair
    with pytest.raises(TimeoutError, match=r"^no item came through channel 'a>b'$"):
        reader.get(timeout=0.05)
    threading.Timer(0.05, reader.close).start()
    with pytest.raises(RingClosed):
        reader.get()


def test_put_takes_no_timeout(pair: tuple[DistChannel, DistChannel]) -> None:
    """A gloo wait that times out breaks the connection: put refuses a timeout."""
    writer, _ = pair
    with pytest.raises(ValueError, match=r"^timeout must be None on a DistChannel, got 1.0$"):
        writer.put(1, timeout=1.0)


def test_the_reader_moves_stamps_into_its_hosts_clock() -> None:
    """A reader with a clock shift adds it to every stamp of an encoded item, nothing else."""
    groups = loopback_groups(2)
    writer = DistChannel("a>b", groups[0], 1, side="writer")
    reader = DistChannel("a>b", groups[1], 0, side="reader", shift=5.0)
    try:
        item = PipelineItem(
            "x", PipelineMetadata(pts=4, input_seq=2, timeline=(("a.in", 1.0), ("a.out", 2.5)))
        )
        writer.put(encode(item))
        got = decode(reader.get(timeout=10))
        assert got.metadata.timeline == (("a.in", 6.0), ("a.out", 7.5))
        assert (got.payload, got.metadata.pts, got.metadata.input_seq) == ("x", 4, 2)
    finally:
        writer.close()
        reader.close()
        reader.statistics()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _writer_then_die(port: int) -> None:
    """Rank 1 of a gloo group on ``port``: send one frame, then exit without a word."""
    channel = DistChannel("a>b", open_group(1, 2, port=port), 0, side="writer")
    channel.put(np.ones(100_000, dtype=np.uint8))  # returns once taken (a head might not)
    os._exit(3)


@pytest.mark.slow
def test_a_peer_that_dies_fails_the_reader_naming_its_rank() -> None:
    """A writer process that exits breaks the connection: on_lost gets RankLost naming it."""
    port = _free_port()
    child = multiprocessing.get_context("spawn").Process(target=_writer_then_die, args=(port,))
    child.start()
    lost: list[BaseException] = []
    came = threading.Event()

    def on_lost(error: BaseException) -> None:
        lost.append(error)
        came.set()

    reader = DistChannel("a>b", open_group(0, 2, port=port), 1, side="reader", on_lost=on_lost)
    try:
        assert reader.get(timeout=60).sum() == 100_000
        assert came.wait(30)
    finally:
        reader.close()
        child.join(10)
    (error,) = lost
    assert isinstance(error, PipelineError)
    assert error.stage == "rank 1"
    assert isinstance(error.cause, RankLost)
    assert error.cause.ranks == (1,)
    assert str(error).startswith("stage 'rank 1' failed: RankLost: rank 1 went away: boundary")


# --- pieces of the launch ---------------------------------------------------------------------


def test_estimate_offset_takes_the_shortest_round_trip() -> None:
    """The other clock is read halfway through the quickest trip: skewed trips do not count."""
    now = [100.0]
    trips = iter([(0.010, 0.030), (0.001, 0.001), (0.020, 0.0)])

    def exchange() -> float:
        there, back = next(trips)
        now[0] += there
        theirs = now[0] + 5.0  # the other host's clock runs 5 s ahead
        now[0] += back
        return theirs

    assert estimate_offset(exchange, lambda: now[0], 3) == pytest.approx(-5.0)


def _control(hosts: list[str], heard: dict[int, float], broken: set[int]) -> Control:
    """The controller's side of the control plane, with only what ``lost`` reads."""
    control = Control.__new__(Control)
    control.heard, control.broken, control.rank = heard, broken, 0
    cast(Any, control).launch = SimpleNamespace(hosts=hosts)
    return control


def test_a_quiet_host_is_named_with_all_its_ranks() -> None:
    """Past LOST_S of silence a rank is lost, with the ranks going quiet alongside it."""
    hosts = ["a/1", "b/2", "b/2", "a/1"]
    now = 100.0
    assert _control(hosts, {1: now - 1.5, 2: now - 1.4, 3: now}, set()).lost(now) is None
    error = _control(hosts, {1: now - 2.5, 2: now - 2.4, 3: now}, set()).lost(now)
    assert error is not None
    assert error.stage == "ranks 1, 2"
    assert isinstance(error.cause, RankLost)
    assert error.cause.ranks == (1, 2)
    assert str(error.cause) == f"ranks 1, 2 on host 'b' went away: not heard from for {LOST_S} s"
    error = _control(hosts, {1: now, 2: now, 3: now}, {3}).lost(now)
    assert error is not None
    assert str(error.cause) == "rank 3 on host 'a' went away: its connection broke"


def test_torchrun_env_reads_all_five_variables_or_none() -> None:
    """Without every torchrun variable there is no torchrun; with them, their values."""
    env = {
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "9",
    }
    assert torchrun_env({k: v for k, v in env.items() if k != "MASTER_PORT"}) is None
    got = torchrun_env(env)
    assert got is not None
    assert (got.rank, got.world, got.local_rank, got.master_addr, got.master_port) == (
        2,
        3,
        0,
        "h",
        9,
    )
    with pytest.raises(ValueError, match=r"^RANK must be an int in \[0, 3\), got '3'$"):
        torchrun_env({**env, "RANK": "3"})
    with pytest.raises(ValueError, match=r"^WORLD_SIZE must be an int >= 1, got 'x'$"):
        torchrun_env({**env, "WORLD_SIZE": "x"})


def _plan() -> Any:
    ctx = rxstream.Context()
    pipeline = (
        ctx.source(range(3), name="a")
        | ctx.pipe(lambda x: x, name="b", rank=1)
        | ctx.pipe(lambda x: x, name="c", rank=2)
        | ctx.stream("out")
    )
    return pipeline.plan


def test_cross_host_edges_follow_hosts_and_the_override() -> None:
    """Boundaries between hosts cross; RXSTREAM_CROSS_HOST adds named ones, or all."""
    plan = _plan()
    one_host = ["h/1", "h/1", "h/1"]
    assert cross_edges(plan, one_host, "") == frozenset()
    assert cross_edges(plan, ["h/1", "h/1", "g/2"], "") == {"b>c"}
    assert cross_edges(plan, one_host, " a>b ") == {"a>b"}
    assert cross_edges(plan, one_host, "all") == {"a>b", "b>c"}
    with pytest.raises(
        ValueError,
        match=r"^RXSTREAM_CROSS_HOST must be 'all' or boundaries of the app \(its boundaries: "
        r"'a>b', 'b>c'\), got 'a>c'$",
    ):
        cross_edges(plan, one_host, "a>b,a>c")


def test_the_backend_choice_is_checked() -> None:
    """auto takes NCCL only when every rank has it; nccl without it, or a typo, is refused."""
    without = [Peer("h", 1, None, nccl=False), Peer("h", 2, None, True)]
    assert use_nccl(without, "") is False
    assert use_nccl([Peer("h", 1, None, True)], "auto") is True
    assert use_nccl([Peer("h", 1, None, True)], "gloo") is False
    with pytest.raises(ValueError, match=r"needs CUDA and NCCL on every rank; ranks \[0\] have"):
        use_nccl(without, "nccl")
    with pytest.raises(
        ValueError, match=r"^RXSTREAM_DIST_BACKEND must be one of auto, gloo, nccl, got 'mpi'$"
    ):
        use_nccl(without, "mpi")


def test_launch_torchrun_needs_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside torchrun the torchrun launch refuses, saying what it needs."""
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(rxstream.PipelineStateError, match=r"^launch_torchrun runs under torchrun"):
        launch_torchrun(APP)


def test_under_torchrun_launch_takes_the_world_from_torchrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rxstream.launch hands over to the torchrun launch, which refuses another rank count."""
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(
        ValueError, match=r"^ranks must be 1 or torchrun's WORLD_SIZE \(3\) under torchrun, got 2$"
    ):
        rxstream.launch(APP, 2)


def test_public_names_are_sorted_and_say_rxstream_distributed() -> None:
    """rxstream.distributed declares a sorted __all__ whose classes name the module."""
    assert list(distributed.__all__) == sorted(distributed.__all__)
    for name in distributed.__all__:
        value = getattr(distributed, name)
        if isinstance(value, type):
            assert value.__module__ == "rxstream.distributed", name


# --- torchrun ---------------------------------------------------------------------------------


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _mapped() -> set[str]:
    """The shared-memory segments some live process maps (others' tests run meanwhile)."""
    names: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                lines = [line for line in maps if "/dev/shm/" in line]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        names.update(line.rsplit("/dev/shm/", 1)[1].split()[0] for line in lines)
    return names


def _left_behind(before: set[str]) -> set[str]:
    """Segments made since ``before`` that nobody maps any more and nobody removed (5 s)."""
    deadline = time.monotonic() + 5
    while True:
        orphans = _shm() - before - _mapped()
        if not orphans or time.monotonic() > deadline:
            return orphans
        time.sleep(0.1)


def _torchrun(out: Path, *args: str) -> list[str]:
    """The torchrun command for wire_app on 3 ranks of this host."""
    out.mkdir(exist_ok=True)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",  # what the torchrun script runs
        "--nproc-per-node",
        "3",
        "--standalone",
        "-m",
        "rxstream",
        "run",
        APP,
        *args,
    ]


def _env(out: Path) -> dict[str, str]:
    return {**os.environ, "RXSTREAM_WIRE_OUT": str(out), "RXSTREAM_CROSS_HOST": "render>work"}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_torchrun_runs_three_ranks_across_a_forced_host_boundary(tmp_path: Path) -> None:
    """Payloads, metadata, steers and the timing hops cross gloo and a ring, end to end."""
    before = _shm()
    done = subprocess.run(
        _torchrun(tmp_path, "--frames", "30"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # --frames is exact, and rank 0 alone prints the summary of every rank, in rank order
    assert done.stdout.count("items egressed on 3 rank(s)") == 1
    assert done.stdout.startswith("30 items egressed on 3 rank(s)\n")
    headers = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert headers == ["rank 0", "rank 1", "rank 2"]

    rows = _rows(tmp_path / "egress.jsonl")
    assert len(rows) >= 30
    indices = [row["index"] for row in rows]
    assert indices == sorted(indices)
    for row in rows:
        i = row["index"]
        assert (row["frame_ok"], row["tensor_ok"]) == (True, True)
        assert (row["label"], row["small"], row["frame_sum"]) == (
            f"frame {i}",
            [i, i + 1, i + 2, i + 3],
            float(i * 128 * 128),
        )
        assert (row["pts"], row["input_seq"], row["input_at_ms"]) == (10 * i, i + 1, 1000 + i)
        assert row["hops"] == HOPS
        assert row["stamps"] == sorted(row["stamps"])
        assert row["big_sum"] == (9 << 20 if i == 2 else None)  # 9 MiB crossed: not a ring
    # the steer at frame 10 on rank 0 reached rank 1's inline reads and rank 2's admission
    new = [row for row in rows if row["generation"] == 1]
    assert [row["generation"] for row in rows] == sorted(row["generation"] for row in rows)
    assert rows[0]["prompt"] == "a"  # (a frame already past its hop may read the new one)
    assert {row["prompt"] for row in new} == {"b"}
    assert new[0]["index"] == 10
    assert [row["cutover"] for row in new[:2]] == [True, False]

    # one record per input that egressed; the sink drops as stale a few frames of the old
    # generation that `finish` had written already
    records = _rows(tmp_path / "timing.jsonl")
    seqs = [record["input_seq"] for record in records]
    assert len(seqs) >= 20
    assert seqs == sorted(seqs)
    assert set(seqs) <= {row["input_seq"] for row in rows}
    for record in records:
        assert [hop[0] for hop in record["hops"]] == STAGES
        assert all(wait >= 0 and compute >= 0 for _, wait, compute in record["hops"])
        total = sum(wait + compute for _, wait, compute in record["hops"])
        assert record["total_ms"] == pytest.approx(total, abs=1e-3)
    assert _left_behind(before) == set()


@pytest.mark.slow
def test_a_rank_that_raises_fails_every_rank_naming_it(tmp_path: Path) -> None:
    """A stage failing on rank 1 ends the job; ranks 0 and 2 raise an error naming rank 1."""
    before = _shm()
    done = subprocess.run(
        _torchrun(tmp_path, "--set", "mode=raise"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=_env(tmp_path),
    )
    assert done.returncode != 0
    cause = "stage 'work' failed on item pts=50 input_seq=6: RuntimeError: rank 1 broke on frame 5"
    expected = f"rxstream run: stage 'rank 1' failed: RuntimeError: {cause}"
    # (count in the whole text: lines of two processes can interleave)
    assert done.stderr.count(expected) == 2, done.stderr[-3000:]
    assert done.stderr.count(f"rxstream run: {cause}") == 1  # rank 1 itself
    assert _left_behind(before) == set()


def _failed_lines(stderr: str) -> dict[int, str]:
    """The errors of the ``rank_failed`` log lines, by the rank that logged them."""
    found = re.findall(r'rank_failed\s+error="([^"]*)" rank=(\d+)', stderr)
    return {int(rank): error for error, rank in found}


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "dead"), [("die", 1), ("die0", 0)], ids=["rank 1", "rank 0"])
def test_a_rank_that_dies_is_named_on_every_survivor(tmp_path: Path, mode: str, dead: int) -> None:
    """A rank's process exits (the controller too): every survivor reports RankLost naming it."""
    before = _shm()
    done = subprocess.run(
        _torchrun(tmp_path, "--set", f"mode={mode}"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=_env(tmp_path),
    )
    assert done.returncode != 0
    failed = _failed_lines(done.stderr)
    assert sorted(failed) == sorted({0, 1, 2} - {dead}), done.stderr[-3000:]
    for line in failed.values():
        assert f"stage 'rank {dead}' failed: RankLost: rank {dead}" in line
    assert _left_behind(before) == set()


@pytest.mark.slow
def test_a_silent_rank_is_named_once_its_heartbeats_stop(tmp_path: Path) -> None:
    """Rank 1 stops (SIGSTOP, sockets open): the others name it after LOST_S of silence."""
    before = _shm()
    job = subprocess.Popen(
        _torchrun(tmp_path, "--set", "mode=freeze"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=_env(tmp_path),
    )
    assert job.stderr is not None
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(job.stderr or ()), daemon=True)
    reader.start()
    frozen: int | None = None
    try:
        deadline = time.monotonic() + 90
        while len(_failed_lines("".join(stderr))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        frozen = json.loads((tmp_path / "rank1.txt").read_text())["pid"]
    finally:
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGKILL)
        try:
            job.wait(60)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        reader.join(10)
        job.stderr.close()
    failed = _failed_lines("".join(stderr))
    assert sorted(failed) == [0, 2], "".join(stderr)[-3000:]
    for line in failed.values():
        assert "rank 1 on host" in line
        assert f"went away: not heard from for {LOST_S} s" in line
    assert _left_behind(before) == set()
