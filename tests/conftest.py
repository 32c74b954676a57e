"""Shared fixtures: a fresh context, and a check that no rxstream thread outlives its test."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import rxstream
from rxstream.testing import live_threads


@pytest.fixture
def ctx() -> rxstream.Context:
    """A context with an in-memory transport that keeps every item."""
    return rxstream.Context(transport=rxstream.transport.MemoryTransport())


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves an rxstream thread running (after a short grace period)."""
    yield
    deadline = time.monotonic() + 1.0
    while live_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    leaked = live_threads()
    assert not leaked, f"threads left running: {[t.name for t in leaked]}"
