"""``ctx.resource(name, loader)``: what is expensive to make, made once per process, only in
the process whose stages read it, before their first item; kept across contexts."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import rxstream
from rxstream import ArgumentError, PipelineError, Resource, ResourceError
from rxstream.transport import MemoryTransport

ROOT = Path(__file__).resolve().parent.parent
MODEL_APP = str(ROOT / "tests" / "apps" / "model_app.py")


@pytest.fixture
def made() -> Iterator[list[Resource[object]]]:
    """The resources a test declares, released after it (the registry is the process's)."""
    handles: list[Resource[object]] = []
    yield handles
    for handle in handles:
        handle.release()


def declared(
    ctx: rxstream.Context, made: list[Resource[object]], name: str, loader: Callable[[], object]
) -> Resource[object]:
    """``ctx.resource(name, loader)``, released after the test."""
    handle = ctx.resource(name, loader)
    made.append(handle)
    return handle


# --- the handle -------------------------------------------------------------------------------


def test_declaring_loads_nothing_and_the_first_get_loads_once(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """A declared resource is not loaded until read; every later read is the same value."""
    calls: list[int] = []

    def load() -> dict[str, int]:
        calls.append(1)
        return {"weights": 3}

    model = declared(ctx, made, "resources.once", load)
    assert (model.loaded, calls) == (False, [])
    first = model.get()
    assert model() is first
    assert (first, len(calls), model.loads, model.loaded) == ({"weights": 3}, 1, 1, True)


def test_two_threads_asking_at_once_load_once(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """A second reader arriving while the first loads waits for that load instead of loading."""
    inside, go = threading.Event(), threading.Event()
    calls: list[int] = []

    def load() -> object:
        calls.append(1)
        inside.set()
        go.wait(10)
        return object()

    model = declared(ctx, made, "resources.threads", load)
    got: list[object] = []
    first = threading.Thread(target=lambda: got.append(model.get()))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=lambda: got.append(model.get()))
    second.start()
    deadline = time.monotonic() + 10
    while not _waiting_in_get(second) and time.monotonic() < deadline:
        time.sleep(0.001)  # polls a condition: the second reader blocked in get()
    assert _waiting_in_get(second)
    go.set()
    first.join(10)
    second.join(10)
    assert len(calls) == 1
    assert len(got) == 2
    assert got[0] is got[1]


def _waiting_in_get(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code is Resource.get.__code__:
            return True
        frame = frame.f_back
    return False


def test_the_same_name_with_another_loader_is_refused(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """A name is one resource: a second loader for it is refused, naming both loaders."""

    def load_a() -> int:
        return 1

    def load_b() -> int:
        return 2

    declared(ctx, made, "resources.conflict", load_a)
    with pytest.raises(
        ArgumentError,
        match=r"^resource 'resources\.conflict' is made by "
        r".*load_a \(test_resources\.py:\d+\) in this process; a second loader "
        r".*load_b \(test_resources\.py:\d+\) cannot take the name: give it a name of its own$",
    ):
        ctx.resource("resources.conflict", load_b)


def test_a_resource_is_kept_across_contexts_and_builds(made: list[Resource[object]]) -> None:
    """The same build run again, in a new context (a worker's next session), reads the value
    loaded by the first: one load for the process."""
    calls: list[int] = []

    def build(ctx: rxstream.Context) -> Resource[object]:
        def load() -> object:  # a new function each build, as an app's own
            calls.append(1)
            return object()

        return declared(ctx, made, "resources.kept", load)

    first = build(rxstream.Context()).get()
    handle = build(rxstream.Context())
    assert handle.get() is first
    assert len(calls) == 1


def test_release_closes_the_value_and_frees_the_name(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """``release()`` calls the value's ``close()`` and lets the name be declared anew."""
    closed: list[bool] = []

    class Weights:
        def close(self) -> None:
            closed.append(True)

    model = ctx.resource("resources.release", Weights)
    model.get()
    model.release()
    assert (closed, model.loaded) == ([True], False)
    again = declared(ctx, made, "resources.release", lambda: 5)
    assert again is not model
    assert again.get() == 5


def test_a_failing_loader_names_the_resource_and_keeps_nothing(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """A loader that raises raises ResourceError naming the resource, its loader and the cause;
    the next read tries again."""
    fails = [True]

    def load_weights() -> str:
        if fails[0]:
            raise OSError("no file weights.pt")
        return "weights"

    model = declared(ctx, made, "resources.fails", load_weights)
    with pytest.raises(
        ResourceError,
        match=r"^resource 'resources\.fails': its loader .*load_weights "
        r"\(test_resources\.py:\d+\) raised OSError: no file weights\.pt$",
    ):
        model.get()
    fails[0] = False
    assert model.get() == "weights"


# --- which stages read it, and when it loads ---------------------------------------------------


def test_a_stage_reading_a_resource_declares_it(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """The resources a stage reads are found in its function, a bind's construct, a callable
    object's attributes and a partial's arguments."""
    vae = declared(ctx, made, "resources.vae", lambda: 2)
    doc = ctx.doc("control", defaults={"scale": 1})

    def decode(x: int) -> object:
        return vae.get()

    class Decoder:
        def __init__(self) -> None:
            self.model = vae

        def __call__(self, x: int) -> int:
            return x

    def scale(model: Resource[object], x: int) -> object:
        return model.get()

    bound = doc.bind(lambda d: ctx.pipe(decode), [doc.desired.scale], name="bound")
    assert ctx.pipe(decode).uses == (vae,)
    assert bound.uses == (vae,)
    assert ctx.pipe(Decoder(), name="obj").uses == (vae,)
    assert ctx.pipe(functools.partial(scale, vae), name="partial").uses == (vae,)
    assert ctx.pipe(lambda x: x, name="plain").uses == ()


def test_a_run_loads_its_stages_resources_before_the_first_item(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """A threaded run loads what its stages read before its source's first pull: the load is
    not part of a stage's first item."""
    order: list[str] = []

    def load() -> int:
        order.append("load")
        return 10

    model = declared(ctx, made, "resources.first", load)

    def frames() -> Iterator[int]:
        order.append("pull")
        yield from range(3)

    pipeline = (
        ctx.source(frames) | ctx.pipe(lambda x: x + model.get(), name="add") | ctx.stream("out")
    )
    pipeline.start()
    pipeline.wait(10)
    assert order == ["load", "pull"]
    assert [item.payload for item in ctx.transport.items("out")] == [10, 11, 12]  # type: ignore[attr-defined]


def test_a_run_whose_loader_fails_names_the_stage_the_resource_and_the_error(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """A loader that raises at a run's start fails the run with a PipelineError naming the
    stage that needed it, the resource and the error; no item is pulled."""
    pulled: list[int] = []

    def missing() -> int:
        raise FileNotFoundError("weights.pt")

    model = declared(ctx, made, "resources.broken", missing)

    def frames() -> Iterator[int]:
        pulled.append(1)
        yield 1

    pipeline = (
        ctx.source(frames) | ctx.pipe(lambda x: model.get(), name="infer") | ctx.stream("out")
    )
    pipeline.start()
    with pytest.raises(
        PipelineError,
        match=r"^stage 'infer' failed: ResourceError: resource 'resources\.broken': its loader "
        r".*missing \(test_resources\.py:\d+\) raised FileNotFoundError: weights\.pt$",
    ):
        pipeline.wait(10)
    assert pulled == []


def test_a_driven_stage_loads_its_resource_at_first_use(
    made: list[Resource[object]],
) -> None:
    """Under drive() (a self test) a stage's resource loads when the stage first reads it."""
    ctx = rxstream.Context(transport=MemoryTransport())
    calls: list[int] = []

    def load() -> int:
        calls.append(1)
        return 7

    model = declared(ctx, made, "resources.drive", load)
    pipeline = ctx.source(range(2)) | ctx.pipe(lambda x: x * model.get()) | ctx.stream("out")
    assert calls == []
    assert pipeline.drive(frames=2) == [0, 7]
    assert calls == [1]


# --- across ranks: rxstream run --ranks 2 ------------------------------------------------------


def run_model_app(folder: Path, way: str, load_s: float = 0.5) -> subprocess.CompletedProcess[str]:
    """``rxstream run tests/apps/model_app.py --ranks 2 --frames 5`` with the app's model made
    ``way``, each load counted in ``folder``."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rxstream",
            "run",
            MODEL_APP,
            "--ranks",
            "2",
            "--frames",
            "5",
            "--set",
            f"loads={folder}",
            "--set",
            f"load_s={load_s}",
            "--set",
            f"way={way}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def loads_by_process(folder: Path) -> dict[int, int]:
    """How many times each process (pid) made the model."""
    counts: dict[int, int] = {}
    for path in folder.glob("load-*"):
        pid = int(path.name.split("-")[1])
        counts[pid] = counts.get(pid, 0) + 1
    return counts


def pid_of(folder: Path, mark: str) -> int:
    """The pid of the process that wrote ``mark-<pid>`` (``infer``: rank 1; ``first``: rank 0)."""
    (path,) = folder.glob(f"{mark}-*")
    return int(path.name.split("-")[1])


@pytest.mark.slow
def test_a_model_made_in_build_is_made_three_times_for_two_ranks(tmp_path: Path) -> None:
    """Without a resource, a two-rank app's model is made by every build: the launcher's check
    of the app and rank 0's (one process), and rank 1's."""
    result = run_model_app(tmp_path, "build")
    assert result.returncode == 0, result.stderr
    launcher, rank1 = pid_of(tmp_path, "first"), pid_of(tmp_path, "infer")
    assert loads_by_process(tmp_path) == {launcher: 2, rank1: 1}


@pytest.mark.slow
def test_a_resource_is_loaded_once_in_the_rank_whose_stage_reads_it(tmp_path: Path) -> None:
    """With ``ctx.resource`` the model is made exactly once, in rank 1 (whose stage reads it),
    before rank 0's first frame: never in the launcher's build nor on rank 0."""
    result = run_model_app(tmp_path, "resource")
    assert result.returncode == 0, result.stderr
    rank1 = pid_of(tmp_path, "infer")
    assert pid_of(tmp_path, "first") != rank1
    assert loads_by_process(tmp_path) == {rank1: 1}
    (load,) = tmp_path.glob("load-*")
    first = next(tmp_path.glob("first-*"))
    assert float(load.read_text()) < float(first.read_text())


@pytest.mark.slow
def test_a_rank_whose_loader_fails_ends_the_run_naming_it(tmp_path: Path) -> None:
    """A loader that raises on rank 1 ends ``rxstream run`` with exit 1 and a line naming the
    rank, the stage, the resource and the error."""
    result = run_model_app(tmp_path, "fails")
    assert result.returncode == 1
    assert (
        "stage 'infer' failed: ResourceError: resource 'model': its loader broken "
        "(model_app.py:" in result.stderr
    )
    assert "raised OSError: no weights at /nowhere/model.pt" in result.stderr
    assert loads_by_process(tmp_path) == {}


def test_the_app_module_imported_again_declares_the_same_resource(
    made: list[Resource[object]],
) -> None:
    """A loader from the same place in the same file (the app's module imported anew, as a
    worker may for its next session) is the same loader: the value loaded first is kept."""
    source = "def load():\n    return object()\n"
    loaders: list[Callable[[], object]] = []
    for _ in range(2):
        scope: dict[str, Callable[[], object]] = {}
        exec(compile(source, "/apps/app.py", "exec"), scope)
        loaders.append(scope["load"])
    first = declared(rxstream.Context(), made, "resources.reimported", loaders[0])
    again = rxstream.Context().resource("resources.reimported", loaders[1])
    assert loaders[0] is not loaders[1]
    assert again is first
