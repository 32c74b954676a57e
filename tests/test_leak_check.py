"""The suite's thread check (tests/conftest.py): a test that leaks a running pipeline fails,
the check stops what it left, and the tests after it pass."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

LEAKY = '''
import threading
import rxstream

def test_leaks_a_running_pipeline():
    """Starts a pipeline whose source never ends and never stops it."""
    gate = threading.Event()
    ctx = rxstream.Context()
    def forever():
        while not gate.wait(0.01):
            yield 1
    (ctx.source(forever, name="forever") | ctx.pipe(lambda x: x, name="work")).start()

def test_after_the_leak():
    """A test after the leaky one."""
    assert True

def test_a_run_after_the_leak():
    """A threaded run after the leaky one: its own threads are checked, nothing else."""
    ctx = rxstream.Context()
    pipeline = ctx.source(range(3)) | ctx.pipe(lambda x: x)
    pipeline.start()
    assert pipeline.wait(timeout=10)
    pipeline.stop()
'''


@pytest.mark.slow
def test_one_leak_fails_one_test(pytester: pytest.Pytester) -> None:
    """The leaking test errors naming the threads and saying they were stopped; the two after
    it pass."""
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_leaky=LEAKY)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*threads left running: *rxstream:forever*the check stopped the test's 1 threaded "
            "runs: all ended*"
        ]
    )
