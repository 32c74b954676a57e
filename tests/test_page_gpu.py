"""The page shows a CUDA stage's ``gpu_ms`` beside its hop's times (the ``timing`` message).

The page runs in Chromium against a mocked socket (Playwright's WebSocket routing), so the
test pins the page's side of the record alone. Skips, saying so, without chromium.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _serving import photon_bench

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

PAGE = Path(__file__).resolve().parent.parent / "rxstream" / "transport" / "static" / "index.html"
ORIGIN = "http://rxstream.test"

RECORD = {
    "stream": "video",
    "input_seq": 3,
    "total_ms": 12.5,
    "origin": "pointer",
    "cutover": False,
    "prompt_generation": 0,
    "hops": "render,decode",
    "render.wait_ms": 0.5,
    "render.compute_ms": 0.2,
    "render.gpu_ms": 7.3,
    "decode.wait_ms": 0.1,
    "decode.compute_ms": 1.0,
}
"""A record whose ``render`` ran on CUDA (``gpu_ms``) and whose ``decode`` ran on the CPU."""


@pytest.fixture
def page() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=photon_bench().CHROMIUM_ARGS
        )
        try:
            yield browser.new_page()
        finally:
            browser.close()


def _hops(page: Any, record: dict[str, Any]) -> list[str]:
    """The page's hop lines after a ``timing`` message carrying ``record``."""
    page.route(f"{ORIGIN}/", lambda route: route.fulfill(body=PAGE.read_text(), status=200))
    page.route_web_socket(
        "ws://rxstream.test/ws*",
        lambda socket: socket.send(json.dumps({"type": "timing", "record": record})),
    )
    page.goto(f"{ORIGIN}/")
    page.wait_for_function("() => document.querySelectorAll('#hops div').length > 0")
    lines: list[str] = page.eval_on_selector_all(
        "#hops div", "(rows) => rows.map(r => r.textContent)"
    )
    return lines


def test_a_cuda_hop_shows_its_gpu_ms_and_a_cpu_hop_shows_none(page: Any) -> None:
    """The hop of a stage placed on CUDA shows ``gpu 7.3 ms`` beside its wait and compute; a
    CPU hop's line has no gpu part."""
    render, decode = _hops(page, RECORD)
    assert render.endswith("0.7 ms gpu 7.3 ms"), render
    assert "gpu" not in decode, decode


def test_an_unresolved_gpu_ms_shows_a_dash(page: Any) -> None:
    """A CUDA hop whose events were not done when the record was folded (``null``) shows
    ``gpu — ms``, not a number."""
    render, _ = _hops(page, {**RECORD, "render.gpu_ms": None})
    assert render.endswith("gpu — ms"), render
