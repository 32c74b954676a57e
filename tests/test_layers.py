"""The layers hold at run time: every function-level import hoisted to its module's top at once
leaves a package that imports (docs/architecture.md, "Layers"). import-linter (``make test``)
holds the picture; this holds that no lazy import hides a circle."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import rxstream
from rxstream import PipelineStateError
from rxstream.ranks._factory import RingBoundaries
from rxstream.runtime import _crossings
from rxstream.stage import Stage

PACKAGE = Path(rxstream.__file__).parent


def _hoisted(source: str) -> tuple[str, int]:
    """``source`` with each function-level rxstream import also at the end of its imports."""
    tree = ast.parse(source)
    tops = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    lazy = [
        ast.unparse(node)
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
        if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rxstream"))
        or (isinstance(node, ast.Import) and any(a.name.startswith("rxstream") for a in node.names))
    ]
    if not lazy:
        return source, 0
    lines = source.split("\n")
    at = max(node.end_lineno or node.lineno for node in tops) if tops else 0
    return "\n".join([*lines[:at], *lazy, *lines[at:]]), len(lazy)


@pytest.mark.slow
def test_every_lazy_import_hoisted_the_package_still_imports(tmp_path: Path) -> None:
    """Every function-level rxstream import, hoisted to its module's top, still imports."""
    copy = tmp_path / "rxstream"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    hoisted = 0
    for module in sorted(copy.rglob("*.py")):
        text, count = _hoisted(module.read_text())
        if count:
            module.write_text(text)
            hoisted += count
    assert hoisted > 0
    code = (
        "import importlib, pkgutil, rxstream\n"
        "for m in pkgutil.walk_packages(rxstream.__path__, 'rxstream.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "assert rxstream.__file__.startswith(" + repr(str(tmp_path)) + ")\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_stage_composes_with_its_contexts_pipeline_class() -> None:
    """``stage | x`` builds through the Pipeline class of the stage's context, which stage.py
    (a layer below) never imports."""
    seen: list[str] = []

    class Traced(rxstream.Pipeline):
        @classmethod
        def of(cls, stage: Stage) -> rxstream.Pipeline:
            seen.append(f"of {stage.name}")
            return super().of(stage)

        @classmethod
        def fan_in(
            cls, heads: Sequence[Stage | rxstream.Pipeline], stage: Stage | rxstream.Pipeline
        ) -> rxstream.Pipeline:
            seen.append(f"fan_in {len(heads)}")
            return super().fan_in(heads, stage)

    class TracedContext(rxstream.Context):
        _composes = Traced

    traced = TracedContext()
    a, b = traced.source(range(2), name="a"), traced.pipe(lambda x: x, name="b")
    assert (a | b).drive(2) == [0, 1]
    [a] | b
    assert seen[0] == "of a"
    assert "fan_in 1" in seen


def test_a_started_run_gets_its_boundaries_from_what_ranks_provided(
    ctx: rxstream.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipeline.start() makes its boundaries with the factory rxstream.ranks provided."""
    made: list[RingBoundaries] = []
    provided = _crossings._Provided.boundaries
    assert provided is not None

    def recording(*, cuda_api: object, spec: object) -> _crossings.BoundaryFactory:
        factory = provided(cuda_api=cuda_api, spec=spec)
        assert isinstance(factory, RingBoundaries)
        made.append(factory)
        return factory

    monkeypatch.setattr(_crossings._Provided, "boundaries", recording)
    pipeline = ctx.source(range(3), name="src") | ctx.pipe(lambda x: x, name="b", rank=1)
    pipeline.start()
    assert pipeline.wait(timeout=30)
    assert len(made) == 1


def test_lease_and_boundaries_before_ranks_provided_them_say_so(
    ctx: rxstream.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing provided, ctx.lease and a run's boundaries name rxstream.ranks."""
    monkeypatch.setattr(_crossings._Provided, "lease", None)
    monkeypatch.setattr(_crossings._Provided, "boundaries", None)
    with pytest.raises(
        PipelineStateError, match=r"^no ctx\.lease was provided: rxstream\.ranks provides"
    ):
        ctx.lease((2,), "float32")
    with pytest.raises(PipelineStateError, match=r"^no boundary factory for a run was provided"):
        (ctx.source(range(2)) | ctx.pipe(lambda x: x)).start()
