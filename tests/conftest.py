"""Shared fixtures: a fresh context, a check that no rxstream thread outlives its test, the
books of every threaded run balanced (``rxstream.runtime._books``), and structlog's global
configuration put back after every test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import structlog

import rxstream
from rxstream.runtime._books import settled, unbalanced
from rxstream.runtime._threaded import ThreadedRun
from rxstream.testing import live_threads


@pytest.fixture
def ctx() -> rxstream.Context:
    """A context with an in-memory transport that keeps every item."""
    return rxstream.Context(transport=rxstream.transport.MemoryTransport())


@pytest.fixture(autouse=True)
def structlog_as_it_was() -> Iterator[None]:
    """Put structlog's global configuration back after each test: ``configure_logging``, the
    CLI and ``structlog.testing.capture_logs`` (which leaves structlog configured) set it, and
    rxstream's library logger stays quiet only while it is unconfigured."""
    configured, config = structlog.is_configured(), structlog.get_config()
    config["processors"] = list(config["processors"])
    yield
    structlog.reset_defaults()
    if configured:
        structlog.configure(**config)


LEAK_GRACE_S = 1.0
"""How long a test's threads may take to end after it returns before they count as leaked."""

CLEANUP_S = 5.0
"""How long the leak check waits for the runs it stops to end."""


@pytest.fixture(autouse=True)
def no_leaked_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ThreadedRun]]:
    """Fail a test that leaves an rxstream thread running (after a short grace period), and
    clean up after it: every threaded run the test started is stopped and its threads
    joined, so that one leak fails one test, not every test after it. Only threads the test
    started count (one that outlives the cleanup is reported by its own test alone).

    Yields the threaded runs the test started, as they start (the books below read them).
    """
    before = set(live_threads())
    runs: list[ThreadedRun] = []
    start = ThreadedRun.start

    def recorded(run: ThreadedRun) -> None:
        runs.append(run)
        start(run)

    monkeypatch.setattr(ThreadedRun, "start", recorded)
    yield runs
    deadline = time.monotonic() + LEAK_GRACE_S
    while _new_threads(before) and time.monotonic() < deadline:
        time.sleep(0.01)
    leaked = _new_threads(before)
    if not leaked:
        return
    stuck = [name for run in runs for name in run.stop(CLEANUP_S)]
    for thread in leaked:
        thread.join(max(0.0, deadline + CLEANUP_S - time.monotonic()))
    left = [thread.name for thread in _new_threads(before)]
    pytest.fail(
        f"threads left running: {[t.name for t in leaked]}; the check stopped the test's "
        f"{len(runs)} threaded runs: "
        + (f"still running: {sorted(set(left) | set(stuck))}" if left or stuck else "all ended")
    )


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """The live rxstream threads that were not running before the test."""
    return [thread for thread in live_threads() if thread not in before]


@pytest.fixture(autouse=True)
def balanced_books(no_leaked_threads: list[ThreadedRun]) -> Iterator[list[ThreadedRun]]:
    """Fail a test whose threaded runs (started in this process) end with unbalanced books.

    Runs are recorded as they start (by the thread check above), and checked once the test is
    over and their threads have ended (a run still going is the thread check's to report); a
    test may read partial statistics while it runs. Costs one list append per ``start()``.
    """
    runs = no_leaked_threads
    yield runs
    problems = [
        f"run {index}: {problem}"
        for index, run in enumerate(runs)
        if settled(run)
        for problem in unbalanced(run)
    ]
    assert not problems, "the books do not balance:\n" + "\n".join(problems)
