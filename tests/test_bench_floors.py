"""bench/_floors.py's items floors: rxstream's items through bare threads; the verdict line."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from rxstream._kernel._generations import Generations
from rxstream.item import PipelineItem, _sourced, now

ROOT = Path(__file__).resolve().parent.parent


def _load_floors() -> ModuleType:
    """bench/_floors.py as a module (it imports bench/_report.py from its own folder)."""
    bench = str(ROOT / "bench")
    if bench not in sys.path:
        sys.path.append(bench)
    spec = importlib.util.spec_from_file_location(
        "rxstream_bench_floors", ROOT / "bench/_floors.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FLOORS = _load_floors()


def _source_item(value: Any, generations: Generations) -> PipelineItem:
    """An item as the engine's source makes it (and as the floor's source does)."""
    started = now()
    return _sourced(
        value, generations.prompt, generations.flush, False, generations.drop,
        3, 0, 0, (), "src.in", started, "src.out", now(),
    )  # fmt: skip


def test_an_items_floor_stage_makes_the_engines_item_with_its_stamps() -> None:
    """A stage of the items floor passes on an rxstream item: same metadata, its two stamps."""
    generations = Generations()
    inbox, outbox = FLOORS._HandOff(2), FLOORS._HandOff(2)
    body = FLOORS._items_stage(("p1",), [lambda x: x + 1], inbox, outbox, generations)
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    inbox.tokens.get()
    inbox.items.put(_source_item(41, generations))
    inbox.tokens.get()
    inbox.items.put(FLOORS.STOP)
    got = outbox.items.get(timeout=10)
    thread.join(10)
    assert isinstance(got, PipelineItem)
    assert got.payload == 42
    assert got.metadata.pts == 3
    assert [hop for hop, _ in got.metadata.timeline] == ["src.in", "src.out", "p1.in", "p1.out"]
    assert outbox.items.get(timeout=10) is FLOORS.STOP


def test_the_items_floor_chains_deliver_every_value_in_order() -> None:
    """Every items floor (5 threads, fused, inline, plain) hands every value on, in order."""
    chains = (
        FLOORS.FloorItemsChain,
        FLOORS.FusedFloorItemsChain,
        FLOORS.FloorItemsInlineChain,
        FLOORS.FloorPlainItemsChain,
    )
    for chain in chains:
        values = iter(range(200))
        seen: list[int] = []
        done = threading.Event()

        def last(payload: int, seen: list[int] = seen, done: threading.Event = done) -> int:
            seen.append(payload)
            if len(seen) == 200:
                done.set()
            return payload

        run = chain(lambda values=values: next(values, FLOORS.STOP), last, 2)
        run.start()
        assert done.wait(30)
        run.wait()
        assert seen == list(range(200))


def test_items_line_says_whether_a_floor_carrying_items_reaches_the_target() -> None:
    """The verdict line: below the target on every shape says the items bound it, else not."""
    below = FLOORS.items_line(2, [("the items floor", [120.0, 130.0])], [100.0, 100.0], "x", 1.5)
    assert "1.25x" in below
    assert "below it" in below
    assert "past what the items allow" in below
    reached = FLOORS.items_line(
        256, [("a", [120.0]), ("b", [200.0])], [100.0], "the hand-written chain", 1.5
    )
    assert "a 1.20x" in reached
    assert "b 2.00x" in reached
    assert "reaches it" in reached
    assert "the engine's layers above the items decide" in reached
