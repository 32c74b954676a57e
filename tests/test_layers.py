"""The layers hold at run time: every function-level import hoisted to its module's top at once
leaves a package that imports (docs/architecture.md, "Layers"). import-linter (``make test``)
holds the picture; this holds that no lazy import hides a circle."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import rxstream

PACKAGE = Path(rxstream.__file__).parent
EXCEPTIONS = {"stage.py"}
"""Modules whose lazy imports point up on purpose: ``stage | x`` builds a ``Pipeline``."""


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


def test_every_lazy_import_hoisted_the_package_still_imports(tmp_path: Path) -> None:
    copy = tmp_path / "rxstream"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    hoisted = 0
    for module in sorted(copy.rglob("*.py")):
        if str(module.relative_to(copy)) in EXCEPTIONS:
            continue
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
