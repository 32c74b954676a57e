"""Every notebook under notebooks/ runs headless in a fresh kernel, and asserts what it shows.

The kernel is ipykernel on this interpreter (so this venv's rxstream), whatever kernelspecs
are installed, started in the notebook's folder. A cell that raises fails the test with its
traceback.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 120
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# nbformat has no annotations: its functions, typed once here.
read_notebook: Callable[..., Any] = nbformat.read
new_code_cell: Callable[..., Any] = nbformat.v4.new_code_cell
new_notebook: Callable[..., Any] = nbformat.v4.new_notebook


class ThisInterpreterKernel(AsyncKernelManager):
    """ipykernel on ``sys.executable``: the kernel imports the rxstream the tests import."""

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            name="python3",
            display_name=f"Python 3 ({sys.prefix})",
            language="python",
            interrupt_mode="signal",
        )


def client(notebook: Any, folder: Path) -> NotebookClient:
    """A client that runs ``notebook`` in a fresh kernel whose working directory is ``folder``."""
    return NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        kernel_manager_class=ThisInterpreterKernel,
        resources={"metadata": {"path": str(folder)}},
    )


def same_rxstream_cell() -> Any:
    """A first cell: the kernel runs this interpreter and imports this checkout's rxstream."""
    return new_code_cell(
        "import pathlib, sys, rxstream\n"
        f"assert sys.prefix == {sys.prefix!r}, sys.prefix\n"
        f"assert pathlib.Path(rxstream.__file__).resolve().is_relative_to({str(REPO)!r}), "
        "rxstream.__file__"
    )


def test_there_are_notebooks_stored_without_outputs() -> None:
    """At least three notebooks, valid, on the python3 kernel, stored with no outputs."""
    assert len(NOTEBOOKS) >= 3, NOTEBOOKS
    for path in NOTEBOOKS:
        notebook = read_notebook(path, as_version=4)
        nbformat.validate(notebook)
        assert notebook.metadata.kernelspec.name == "python3", path.name
        for cell in notebook.cells:
            if cell.cell_type == "code":
                assert (cell.outputs, cell.execution_count) == ([], None), (path.name, cell.id)


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    """The notebook runs top to bottom without an error, its own assertions included."""
    notebook = read_notebook(path, as_version=4)
    notebook.cells.insert(0, same_rxstream_cell())
    try:
        client(notebook, path.parent).execute()
    except CellExecutionError as exc:  # the failing cell, its source and traceback
        pytest.fail(f"{path.name}: {ANSI.sub('', str(exc))}", pytrace=False)
    errors = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.output_type == "error"
    ]
    assert not errors
    # a saved or exported copy keeps no live widget: each notebook leaves a still picture
    images = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert images, f"{path.name} leaves no still image (image/png) in its outputs"


def run_and_interrupt(nb_client: NotebookClient, index: int, marker: Path) -> list[str]:
    """Run cell ``index``, interrupt the kernel once the cell has created ``marker``; the
    names of the errors the cell reported."""
    km = nb_client.km
    assert isinstance(km, ThisInterpreterKernel)

    async def send_interrupt() -> None:
        await km.interrupt_kernel()  # SIGINT to the kernel, as Kernel > Interrupt does

    def interrupt() -> None:
        deadline = time.monotonic() + CELL_TIMEOUT
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the cell goes on from the marker to its wait
        asyncio.run(send_interrupt())

    interrupter = threading.Thread(target=interrupt, daemon=True)
    interrupter.start()
    cell = nb_client.nb.cells[index]
    nb_client.execute_cell(cell, index)
    interrupter.join()
    marker.unlink()
    return [output.ename for output in cell.outputs if output.output_type == "error"]


@pytest.mark.notebook
@pytest.mark.slow
def test_interrupting_a_cell_stops_background_pipelines(tmp_path: Path) -> None:
    """A kernel interrupt during bg.hold(), or during any other cell, stops background runs."""
    marker = tmp_path / "started"
    sources = [
        f"""
import itertools, pathlib, time
import rxstream
from rxstream.notebook import background

marker = pathlib.Path({str(marker)!r})
ctx = rxstream.Context()
first = background(ctx.source(itertools.count()) | ctx.pace(fps=100) | ctx.stream("a"))
""",
        "marker.touch()\nfirst.hold(60)",
        "assert not first.running, first\n"
        "second = background(ctx.source(itertools.count()) | ctx.pace(fps=100) | ctx.stream('b'))",
        "marker.touch()\ntime.sleep(60)",
        "assert not second.running, second",
    ]
    cells = [new_code_cell(source) for source in sources]
    for index in (1, 3):
        cells[index].metadata["tags"] = ["raises-exception"]
    nb_client = client(new_notebook(cells=cells), tmp_path)
    with nb_client.setup_kernel():
        for index, cell in enumerate(cells):
            if index in (1, 3):
                assert run_and_interrupt(nb_client, index, marker) == ["KeyboardInterrupt"]
            else:
                nb_client.execute_cell(cell, index)
