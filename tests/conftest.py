"""Shared fixtures: a fresh context, a check that no rxstream thread outlives its test, the
books of every threaded run balanced (``rxstream.runtime._books``), and structlog's global
configuration put back after every test."""

from __future__ import annotations

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


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves an rxstream thread running (after a short grace period)."""
    yield
    deadline = time.monotonic() + 1.0
    while live_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    leaked = live_threads()
    assert not leaked, f"threads left running: {[t.name for t in leaked]}"


@pytest.fixture(autouse=True)
def balanced_books(
    monkeypatch: pytest.MonkeyPatch, no_leaked_threads: None
) -> Iterator[list[ThreadedRun]]:
    """Fail a test whose threaded runs (started in this process) end with unbalanced books.

    Runs are recorded as they start, and checked once the test is over and their threads
    have ended (a run still going is the thread check's to report); a test may read partial
    statistics while it runs. Costs one list append per ``start()``.
    """
    runs: list[ThreadedRun] = []
    start = ThreadedRun.start

    def recorded(run: ThreadedRun) -> None:
        runs.append(run)
        start(run)

    monkeypatch.setattr(ThreadedRun, "start", recorded)
    yield runs
    problems = [
        f"run {index}: {problem}"
        for index, run in enumerate(runs)
        if settled(run)
        for problem in unbalanced(run)
    ]
    assert not problems, "the books do not balance:\n" + "\n".join(problems)
