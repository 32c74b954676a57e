"""A two-rank app whose model takes ``load_s`` seconds to load, every load counted.

Rank 0's source feeds rank 1's ``infer``, which runs the model; rank 0's ``seen`` writes the
first frame's wall-clock time (``first-<pid>``) and the sink egresses. Every construction of
the model writes a file ``load-<pid>-<n>`` (its start time) in the folder ``loads``; ``infer``
writes ``infer-<pid>`` on its first item. ``way`` picks how the app makes its model:

- ``resource``: ``ctx.resource("model", Model)``, read by ``infer`` (``model.get()``);
- ``build``: ``Model()`` called in ``build``, as an app would without a resource;
- ``fails``: a resource whose loader raises.

:func:`run_command` is the launch the tests and ``bench/resource_load.py`` run.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import rxstream

APP = Path(__file__).resolve()


def run_command(folder: str | Path, way: str, load_s: float) -> list[str]:
    """``rxstream run`` of this app on two ranks for 5 frames, its model made ``way`` taking
    ``load_s`` seconds, each load counted in ``folder``."""
    return [
        *(sys.executable, "-m", "rxstream", "run", str(APP), "--ranks", "2", "--frames", "5"),
        *("--set", f"loads={folder}", "--set", f"load_s={load_s}", "--set", f"way={way}"),
    ]


class Model:
    """A stand-in for weights: sleeps ``load_s`` to load, doubles what it is given."""

    def __init__(self, loads: str, load_s: float) -> None:
        folder = Path(loads)
        mine = len(list(folder.glob(f"load-{os.getpid()}-*")))
        (folder / f"load-{os.getpid()}-{mine}").write_text(repr(time.time()))
        time.sleep(load_s)

    def __call__(self, value: int) -> int:
        return 2 * value


def broken() -> Model:
    """A loader that fails."""
    raise OSError("no weights at /nowhere/model.pt")


def build(ctx: rxstream.Context) -> rxstream.Pipeline:
    """The same graph on every rank."""
    doc = ctx.doc("control", defaults={"loads": "", "load_s": 0.0, "way": "resource"})
    loads, load_s, way = doc.desired.loads.value, doc.desired.load_s.value, doc.desired.way.value
    folder = Path(loads)

    def frames() -> Iterator[int]:
        for index in itertools.count():
            time.sleep(0.01)
            yield index

    model: Callable[[], Model]
    if way == "build":
        made = Model(loads, load_s)
        model = lambda: made  # noqa: E731
    else:
        model = ctx.resource(
            "model", broken if way == "fails" else lambda: Model(loads, load_s)
        ).get

    def infer(value: int) -> int:
        mark = folder / f"infer-{os.getpid()}"
        if not mark.exists():
            mark.write_text(repr(time.time()))
        return model()(value)

    def seen(value: int) -> None:
        mark = folder / f"first-{os.getpid()}"
        if not mark.exists():
            mark.write_text(repr(time.time()))

    return (
        ctx.source(frames, rank=0)
        | ctx.pipe(infer, rank=1)
        | ctx.tap(seen, rank=0)
        | ctx.stream("out")
    )
