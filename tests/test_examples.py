"""The examples run as documented: the demo, headless through ``rxstream run`` as make demo."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import pytest

import rxstream
from rxstream.timing import load

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_demo_headless_writes_the_mp4_and_the_timing_log(tmp_path: Path) -> None:
    """make demo's command (2 ranks): self test, autopilot steer and swap, MP4, timing log."""
    video, log = tmp_path / "demo.mp4", tmp_path / "timing.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rxstream",
            "run",
            str(ROOT / "examples" / "demo.py"),
            "--ranks",
            "2",
            "--frames",
            "120",
            "--set",
            "autopilot=true",
            "--out",
            str(video),
            "--log",
            str(log),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "self test passed: one (144, 256, 3) frame" in out
    assert "steer prompt -> 'a storm over the mountains'" in out
    assert "decoder 'smooth' closed" in out
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        frames = list(container.decode(stream))
    assert len(frames) == 120
    assert (frames[0].width, frames[0].height) == (256, 144)
    timing = load(log)
    assert timing.records
    assert not timing.malformed
    inputs = [r for r in timing.records if r.origin == "input.recv"]
    seqs = [r.input_seq for r in inputs]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert [h.name for h in inputs[-1].hops][-6:] == [
        "window",
        "window>render",
        "render",
        "decode",
        "pace",
        "video",
    ]
    assert "rank 1" in out
    steered = [r for r in timing.records if r.cutover and r.prompt_generation == 1]
    assert steered, "the autopilot's steer made no cutover record"


@pytest.mark.slow
def test_demo_self_test_passes_under_rxstream_test() -> None:
    """``rxstream test examples/demo.py`` runs the demo's self test and exits 0."""
    done = subprocess.run(
        [sys.executable, "-m", "rxstream", "test", str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_two_ranks_stops_making_frames_once_its_downstream_rank_ends() -> None:
    """Rank 0's source stops once rank 1 egressed ``--frames``: it makes about what was used."""
    from rxstream.launch import launch

    result = launch(str(ROOT / "examples" / "two_ranks.py"), 2, frames=24, quiet=True)
    assert result.egressed == 24
    made = result.statistics[0]["frames"].items_out
    dropped = result.statistics[0]["denoise"].dropped.get("stopped", 0)
    # what is in flight at the end: a few inbox places and ring slots, never a stream of frames
    assert made <= 24 + 20, (made, dropped)
    assert dropped <= 8, (made, dropped)


def load_demo(monkeypatch: pytest.MonkeyPatch) -> Any:
    """examples/demo.py as a module (it is not on the import path), registered for the test."""
    spec = importlib.util.spec_from_file_location("demo_under_test", ROOT / "examples" / "demo.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_demo_autopilot_follows_the_doc_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """The autopilot moves the mouse only while the doc's autopilot is on, read every step."""
    demo = load_demo(monkeypatch)
    ctx = rxstream.Context()
    demo.build(ctx)
    fed: list[tuple[float, float]] = []
    steps = [0]
    real_sleep = asyncio.sleep

    async def step(_seconds: float) -> None:  # one autopilot step per loop turn, no waiting
        steps[0] += 1
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", step)
    pipeline = SimpleNamespace(feed=lambda _name, sample: fed.append(sample), update=print)

    async def after(turns: int) -> None:
        """Let the autopilot take ``turns`` more steps."""
        until = steps[0] + turns
        while steps[0] < until:
            await real_sleep(0)

    async def scenario() -> None:
        pilot = asyncio.ensure_future(demo.autopilot(pipeline, ctx))
        await after(20)
        assert fed == []  # off (the default): it feeds nothing
        ctx.control.set(autopilot=True)  # as the page's checkbox does
        await after(20)
        assert len(fed) >= 15
        ctx.control.set(autopilot=False)
        await after(2)
        count = len(fed)
        await after(20)
        assert len(fed) == count  # unticked: it stops
        pilot.cancel()

    asyncio.run(scenario())


def test_demo_autopilot_feeds_120_samples_a_second_though_each_sleep_overshoots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The autopilot keeps 120 Hz on a virtual clock whose every sleep runs 2 ms long."""
    demo = load_demo(monkeypatch)
    ctx = rxstream.Context()
    demo.build(ctx)
    ctx.control.set(autopilot=True)
    clock = [100.0]
    monkeypatch.setattr(demo, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    real_sleep = asyncio.sleep

    async def late_sleep(seconds: float) -> None:  # as asyncio's timers do here: ~2 ms late
        clock[0] += max(seconds, 0.0) + 0.002
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", late_sleep)
    fed: list[float] = []
    pipeline = SimpleNamespace(feed=lambda _name, _sample: fed.append(clock[0]), update=print)

    async def scenario() -> None:
        pilot = asyncio.ensure_future(demo.autopilot(pipeline, ctx))
        while clock[0] < 102.0:
            await real_sleep(0)
        pilot.cancel()

    asyncio.run(scenario())
    in_second = [t for t in fed if 101.0 <= t < 102.0]
    assert 119 <= len(in_second) <= 121, len(in_second)
