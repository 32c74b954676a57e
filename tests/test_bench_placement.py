"""bench/_report.py's ``--placement`` helpers: every thread of a process pinned, then restored."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_report() -> ModuleType:
    """bench/_report.py as a module (the bench scripts import it from their own folder)."""
    spec = importlib.util.spec_from_file_location(
        "rxstream_bench_report", ROOT / "bench/_report.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPORT = _load_report()

linux_two_cpus = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or not hasattr(os, "sched_getaffinity")
    or len(os.sched_getaffinity(0)) < 2,
    reason="pinning needs Linux and 2 allowed CPUs",
)


def _masks(pid: int) -> dict[int, set[int]]:
    """Each live thread of ``pid``: its CPU mask."""
    masks = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            masks[int(task)] = os.sched_getaffinity(int(task))
        except OSError:  # ended meanwhile
            continue
    return masks


@linux_two_cpus
def test_on_cpus_pins_every_thread_of_this_process_and_restores_each_mask() -> None:
    """A thread already running and one started inside are on the CPU; afterwards each is back."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    release, up = threading.Event(), threading.Event()
    seen: list[set[int]] = []

    def waiting() -> None:
        up.set()
        release.wait(10)

    early = threading.Thread(target=waiting)
    early.start()
    assert up.wait(10)
    assert early.native_id is not None
    try:
        with REPORT.on_cpus({cpu}):
            assert os.sched_getaffinity(early.native_id) == {cpu}
            assert os.sched_getaffinity(0) == {cpu}
            inside = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
            inside.start()
            inside.join(10)
        assert seen == [{cpu}]
        assert os.sched_getaffinity(early.native_id) == before
        assert os.sched_getaffinity(0) == before
    finally:
        release.set()
        early.join(10)


@linux_two_cpus
def test_on_cpus_pins_a_child_process_threads_started_inside_too() -> None:
    """Another process's threads, and one it starts while pinned, get the mask; then restored."""
    before = os.sched_getaffinity(0)
    cpu = max(before)
    script = (
        "import sys, threading\n"
        "hold = threading.Event()\n"
        "threading.Thread(target=hold.wait, daemon=True).start()\n"
        "print('up', flush=True)\n"
        "sys.stdin.readline()\n"
        "threading.Thread(target=hold.wait, daemon=True).start()\n"
        "print('started', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "up\n"
        with REPORT.on_cpus({cpu}, child.pid):
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "started\n"
            inside = _masks(child.pid)
        after = _masks(child.pid)
        assert len(inside) >= 3  # main, the early thread, the one started while pinned
        assert all(mask == {cpu} for mask in inside.values()), inside
        assert all(mask == before for mask in after.values()), after
    finally:
        child.stdin.write("end\n")
        child.stdin.close()
        child.wait(10)
        child.stdout.close()


def test_placements_fall_back_to_os_where_one_cpu_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``one``/``both`` with one allowed CPU: the os rows only, and the reason names the CPU."""
    monkeypatch.setattr(REPORT.sys, "platform", "linux")
    monkeypatch.setattr(REPORT.os, "sched_getaffinity", lambda _pid: {3}, raising=False)
    monkeypatch.setattr(REPORT.os, "sched_setaffinity", lambda _pid, _mask: None, raising=False)
    for wanted in ("one", "both"):
        sets, cpu, why = REPORT.placements(wanted)
        assert (sets, cpu) == ([REPORT.OS], None)
        assert f"--placement {wanted}" in why
        assert "CPU [3] only" in why
    assert REPORT.placements("os") == ([REPORT.OS], None, "")


def test_placements_with_two_cpus_run_the_one_cpu_set_on_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``both``: the os set then the one-CPU set, on the lowest allowed CPU; ``one`` alone."""
    monkeypatch.setattr(REPORT.sys, "platform", "linux")
    monkeypatch.setattr(REPORT.os, "sched_getaffinity", lambda _pid: {5, 2}, raising=False)
    monkeypatch.setattr(REPORT.os, "sched_setaffinity", lambda _pid, _mask: None, raising=False)
    assert REPORT.placements("both") == ([REPORT.OS, REPORT.ONE_CPU], 2, "")
    assert REPORT.placements("one") == ([REPORT.ONE_CPU], 2, "")
