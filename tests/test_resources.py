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
from typing import Any

import pytest
from apps.model_app import run_command

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
        run_command(folder, way, load_s),
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


# --- the review's findings --------------------------------------------------------------------


def test_the_same_loader_over_another_value_is_refused_naming_it(
    made: list[Resource[object]],
) -> None:
    """A build run again whose loader closes over another path (a notebook re-run, a session
    with its own settings) is refused, naming the resource, the loader and the value."""

    def build(ctx: rxstream.Context, path: str) -> Resource[object]:
        return ctx.resource("resources.vae_path", lambda: f"weights from {path}")

    first = build(rxstream.Context(), "old.pt")
    made.append(first)
    assert build(rxstream.Context(), "old.pt") is first  # the same build again: the same
    with pytest.raises(
        ArgumentError,
        match=r"^resource 'resources\.vae_path' is made by .*build\.<lambda> "
        r"\(test_resources\.py:\d+\) in this process; a second loader .*build\.<lambda> "
        r"\(test_resources\.py:\d+\) over path='new\.pt' \(was 'old\.pt'\) cannot take the "
        r"name: give it a name of its own \(the value in it: a name per path\) or release\(\) "
        r"the first handle$",
    ):
        build(rxstream.Context(), "new.pt")
    assert first.get() == "weights from old.pt"


def test_a_default_that_differs_is_refused_and_a_context_held_is_not_compared(
    made: list[Resource[object]],
) -> None:
    """A loader's defaults are compared too; a value without an == of its own (each build's
    own context) does not make two builds' loaders differ."""

    def build(ctx: rxstream.Context, path: str) -> Resource[object]:
        def load(where: str = path) -> object:
            return (ctx, where)

        return ctx.resource("resources.vae_default", load)

    first = build(rxstream.Context(), "a.pt")
    made.append(first)
    assert build(rxstream.Context(), "a.pt") is first
    with pytest.raises(ArgumentError, match=r"over where='b\.pt' \(was 'a\.pt'\)"):
        build(rxstream.Context(), "b.pt")


def test_a_released_handle_refuses_get(made: list[Resource[object]]) -> None:
    """After release(), the old handle's get() raises naming the resource instead of loading a
    second live copy beside the next handle's."""
    calls: list[int] = []

    def load() -> object:
        calls.append(1)
        return object()

    old = rxstream.Context().resource("resources.released", load)
    old.get()
    old.release()
    with pytest.raises(
        rxstream.PipelineStateError,
        match=r"^resource 'resources\.released' was released: its handle is done with",
    ):
        old.get()
    new = declared(rxstream.Context(), made, "resources.released", load)
    new.get()
    assert (len(calls), old.loaded, new.loaded) == (2, False, True)


def test_a_self_test_reads_the_stand_in_and_loads_nothing(made: list[Resource[object]]) -> None:
    """Under ctx.self_test() a resource with a stand_in gives the stand-in's value (made once)
    and never calls its loader; after the block the real value loads."""
    ctx = rxstream.Context(transport=MemoryTransport())
    loads: list[str] = []

    def load() -> int:
        loads.append("real")
        return 10

    def stand_in() -> int:
        loads.append("stand-in")
        return 1

    model: Resource[object] = ctx.resource("resources.stand_in", load, stand_in=stand_in)
    made.append(model)
    pipeline = ctx.source(range(3)) | ctx.pipe(lambda x: x * model.get()) | ctx.stream("out")
    with ctx.self_test():
        assert pipeline.drive(frames=3) == [0, 1, 2]
    assert (loads, model.loaded) == (["stand-in"], False)
    assert model.get() == 10
    assert loads == ["stand-in", "real"]


class _Dec:
    model: object = None

    def __call__(self, x: int) -> object:
        return x


class _Slotted:
    __slots__ = ("model",)

    def __init__(self, model: object) -> None:
        self.model = model

    def __call__(self, x: int) -> object:
        return x


class _Models:
    def __init__(self, vae: object, unet: object) -> None:
        self.vae, self.unet = vae, unet


def test_the_scan_finds_class_attributes_slots_and_classmethods(
    made: list[Resource[object]],
) -> None:
    """A resource set as a class attribute (read as self.model), read by a classmethod
    (cls.model), or held in a slots object or a dataclass(slots=True) is found."""
    from dataclasses import dataclass

    from rxstream._kernel._resources import resources_in

    vae = declared(rxstream.Context(), made, "resources.class_attr", lambda: 1)
    _Dec.model = vae

    class Cls:
        model = vae

        @classmethod
        def run(cls, x: int) -> object:
            return cls.model

    @dataclass(slots=True)
    class Data:
        model: object

        def __call__(self, x: int) -> object:
            return x

    try:
        assert resources_in(_Dec()) == (vae,)
        assert resources_in(Cls.run) == (vae,)
        assert resources_in(_Slotted(vae)) == (vae,)
        assert resources_in(Data(vae)) == (vae,)
    finally:
        _Dec.model = None


def test_the_scan_follows_what_a_function_reads_not_every_name_it_holds(
    made: list[Resource[object]],
) -> None:
    """A stage reading ``models.vae`` reaches the vae only, not the unet beside it; ``x.a``
    (an attribute) does not pull a global named ``a``."""
    from rxstream._kernel._resources import resources_in

    ctx = rxstream.Context()
    vae = declared(ctx, made, "resources.vae_only", lambda: 1)
    unet = declared(ctx, made, "resources.unet", lambda: 2)
    models = _Models(vae, unet)
    only_vae: Callable[[int], object] = lambda x: models.vae.get()  # type: ignore[attr-defined]  # noqa: E731
    attribute = eval("lambda x: x.a", {"a": vae})  # reads x's attribute a, no global a
    assert resources_in(only_vae) == (vae,)
    assert resources_in(lambda x: models) == (vae, unet)  # the whole holder: both
    assert resources_in(attribute) == ()


def test_uses_names_what_a_stage_reads_instead_of_the_scan(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """``uses=`` on a builder is what the stage reads, whatever the scan would find; it must
    hold Resource handles."""
    vae = declared(ctx, made, "resources.uses_vae", lambda: 1)
    unet = declared(ctx, made, "resources.uses_unet", lambda: 2)
    lookup = {"vae": vae, "unet": unet}
    doc = ctx.doc("control", defaults={"scale": 1})
    hidden = lambda x: x  # noqa: E731
    assert ctx.pipe(lambda x: lookup["vae"].get(), uses=vae).uses == (vae,)
    assert ctx.tap(hidden, uses=[unet, vae]).uses == (unet, vae)
    assert ctx.source(range(2), uses=[vae]).uses == (vae,)
    assert doc.bind(lambda d: ctx.pipe(hidden), [doc.desired.scale], uses=[vae]).uses == (vae,)
    with pytest.raises(
        rxstream.ArgumentTypeError,
        match=r"^stage 'plain': uses must hold Resource handles \(ctx\.resource\), got str 'vae'$",
    ):
        ctx.pipe(hidden, name="plain", uses=["vae"])  # type: ignore[list-item]


def test_the_scan_looks_at_a_bounded_number_of_items(
    made: list[Resource[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage whose global holds a big nested table costs the scan a bounded number of items
    (every stage and bind rebuild is scanned), and what the stage holds itself is still found
    first."""
    from rxstream._kernel import _resources

    vae = declared(rxstream.Context(), made, "resources.bounded", lambda: 1)
    table = {i: {j: {k: k for k in range(256)} for j in range(256)} for i in range(8)}
    looked: list[int] = []
    opaque = _resources._opaque

    def counted(value: object) -> bool:
        looked.append(1)
        return opaque(value)

    monkeypatch.setattr(_resources, "_opaque", counted)

    def stage(x: int) -> object:
        return table[x], vae

    assert _resources.resources_in(stage) == (vae,)
    assert len(looked) <= _resources._BUDGET


def test_a_bind_construct_reading_a_loading_resource_does_not_hold_start_or_stop(
    made: list[Resource[object]],
) -> None:
    """A doc.bind construct that reads a resource still loading leaves start() and stop()
    free: both return while the load goes on (it ends in the background)."""
    ctx = rxstream.Context(transport=MemoryTransport())
    doc = ctx.doc("control", defaults={"scale": 1})
    inside, go = threading.Event(), threading.Event()

    def load() -> int:
        inside.set()
        go.wait(30)
        return 2

    model = declared(ctx, made, "resources.slow_bind", load)

    def frames() -> Iterator[int]:
        yield from range(1000)

    def construct(d: object) -> rxstream.Stage:
        factor = model.get()
        return ctx.pipe(lambda x: x * factor, name="infer")

    pipeline = (
        ctx.source(frames) | doc.bind(construct, [doc.desired.scale], name="infer")
    ) | ctx.stream("out")
    try:
        for call in (pipeline.start, pipeline.stop):
            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            caller.join(20)
            assert inside.is_set()
            assert not caller.is_alive(), f"{call.__name__}() waited for the load"
    finally:
        go.set()
    assert not model.loaded or model.get() == 2


def test_a_loading_thread_runs_on_the_cuda_device_current_where_loading_began(
    made: list[Resource[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where CUDA is initialised, each loader thread is set to the device current on the
    thread that began the loading (set_device is per thread)."""
    import torch

    from rxstream._kernel._resources import load_for

    current = {"device": 0}
    set_on: list[tuple[str, int]] = []

    def set_device(device: int) -> None:
        set_on.append((threading.current_thread().name, device))
        current["device"] = device

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    seen: list[int] = []

    def load() -> int:
        seen.append(current["device"])
        return 1

    model = declared(rxstream.Context(), made, "resources.cuda", load)
    loading = load_for([("decode", [model])], rank=1)
    assert loading.wait(10)
    assert set_on == [("rxstream:load:resources.cuda", 3)]
    assert seen == [3]


def test_a_run_logs_the_stages_that_pulled_a_resource(
    ctx: rxstream.Context, made: list[Resource[object]]
) -> None:
    """``resource_loaded`` names the stage(s) whose reads made the run load it."""
    import structlog

    model = declared(ctx, made, "resources.logged", lambda: 1)
    pipeline = (
        ctx.source(range(2))
        | ctx.pipe(lambda x: x + model.get(), name="a")
        | ctx.pipe(lambda x: x * model.get(), name="b")
        | ctx.stream("out")
    )
    with structlog.testing.capture_logs() as logs:
        pipeline.start()
        pipeline.wait(10)
    (loaded,) = [log for log in logs if log["event"] == "resource_loaded"]
    assert (loaded["resource"], loaded["stages"]) == ("resources.logged", ["a", "b"])


def _controller(rank: int) -> tuple[Any, Any]:
    """A launch controller waiting on one rank, and the rank's end of its pipe (the process
    is a stand-in whose sentinel never fires)."""
    import multiprocessing
    import os
    import types

    from rxstream.ranks._launch import Ranks

    ours, theirs = multiprocessing.Pipe()
    never, _write = os.pipe()
    controller: Any = object.__new__(Ranks)
    controller.conns = {rank: ours}
    controller.procs = {rank: types.SimpleNamespace(sentinel=never)}
    controller.rings = {}
    return controller, theirs


def test_a_rank_still_loading_is_given_time_past_the_ready_limit() -> None:
    """A rank that keeps saying it is loading is not cut by the readiness limit: the
    controller waits past it for the rank's ready."""
    controller, rank = _controller(1)
    beats = 0

    def loading_then_ready() -> None:
        nonlocal beats
        rank.send(("attached", 1))
        deadline = time.monotonic() + 3.0  # three limits' worth of loading
        while time.monotonic() < deadline:
            rank.send(("loading", 1, ("vae",)))
            beats += 1
            time.sleep(0.05)  # a rank's beat (1 s in the product; faster here)
        rank.send(("ready", 1))

    worker = threading.Thread(target=loading_then_ready, daemon=True)
    worker.start()
    assert controller.wait_ready(timeout=1.0) is True
    worker.join(10)
    assert beats > 1


def test_a_rank_that_went_quiet_while_loading_times_out_naming_the_resource() -> None:
    """A rank that said it was loading and then nothing more fails the launch at the limit,
    the error naming the resource it was loading."""
    controller, rank = _controller(1)
    rank.send(("loading", 1, ("vae", "unet")))
    with pytest.raises(
        PipelineError,
        match=r"^stage 'rank 1' failed: TimeoutError: not ready after 0\.3 s \(ranks \[1\]\); "
        r"rank 1 still loading 'vae', 'unet'$",
    ):
        controller.wait_ready(timeout=0.3)


def test_a_run_waiting_for_its_loads_says_which_are_loading(
    made: list[Resource[object]],
) -> None:
    """wait_loaded tells its caller the resources still loading (a rank's word to the
    controller), then returns once they are loaded."""
    from rxstream.runtime._threaded import ThreadedRun

    ctx = rxstream.Context(transport=MemoryTransport())
    go = threading.Event()
    model = declared(ctx, made, "resources.told", lambda: go.wait(30))
    pipeline = ctx.source(range(1)) | ctx.pipe(lambda x: model.get()) | ctx.stream("out")
    told: list[tuple[str, ...]] = []

    def loading(names: tuple[str, ...]) -> None:
        told.append(names)
        go.set()

    run = ThreadedRun(
        pipeline.plan, bridge=rxstream.runtime._aio.AsyncBridge(None), generations=ctx.generations
    )
    try:
        assert run.wait_loaded(loading, every_s=0.0) is True
    finally:
        go.set()
        run.stop(1.0)
    assert told[0] == ("resources.told",)


@pytest.mark.slow
def test_the_demo_on_two_ranks_loads_its_kernels_once_on_rank_1(tmp_path: Path) -> None:
    """``rxstream run examples/demo.py --ranks 2`` (its main's self test drives decode in the
    launcher) loads demo.kernels exactly once, on rank 1, never in the launcher."""
    import json

    log = tmp_path / "x.jsonl"
    command = [sys.executable, "-m", "rxstream", "run", str(ROOT / "examples" / "demo.py")]
    launcher = subprocess.Popen(
        [*command, "--ranks", "2", "--frames", "10", "--log", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    _out, err = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    loaded = [record for record in records if record.get("event") == "resource_loaded"]
    assert [record["resource"] for record in loaded] == ["demo.kernels"]  # once, not twice
    assert [(r["resource"], r["rank"], r["stages"]) for r in loaded] == [
        ("demo.kernels", 1, ["decode"])
    ]
    assert loaded[0]["pid"] != launcher.pid
