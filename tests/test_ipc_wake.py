"""The ring's wake path: a bounded spin on the items word before the consumer sleeps."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator

import pytest

from rxstream.ipc import ShmRing, _ring
from rxstream.ipc._wake import DEFAULT_SPIN_US, spin

PREFIX = f"rxs_wake{os.getpid()}_"


@pytest.fixture(autouse=True)
def no_leaked_segments() -> Iterator[None]:
    """Fail a test that leaves a /dev/shm segment of this module behind."""
    yield
    gc.collect()
    assert [n for n in os.listdir("/dev/shm") if n.startswith(PREFIX)] == []


def words() -> memoryview:
    """Four int64 words: the watched one at 0, the closed flag at 1."""
    return memoryview(bytearray(32)).cast("q")


def test_spin_returns_at_once_when_the_word_already_moved() -> None:
    """A word other than the one seen (or a close) ends the spin before any budget."""
    w = words()
    w[0] = 3
    assert spin(w, 0, 2, 1, 0) is True
    w[0] = 2
    w[1] = 1
    assert spin(w, 0, 2, 1, 0) is True


def test_spin_gives_up_when_nothing_comes() -> None:
    """With the word unchanged the spin ends after its budget and says nothing came."""
    w = words()
    assert spin(w, 0, 0, 1, 0) is False
    assert spin(w, 0, 0, 1, 200_000) is False


def test_spin_sees_a_store_from_another_thread() -> None:
    """A store by another thread during the spin ends it (it yields the GIL each turn)."""
    w = words()
    started = threading.Event()

    def store() -> None:
        started.wait()
        w[0] = 1

    writer = threading.Thread(target=store)
    writer.start()
    started.set()
    try:
        assert spin(w, 0, 0, 1, 60 * 10**9) is True
    finally:
        writer.join()


@pytest.mark.parametrize("spin_us", [-1, 1001])
def test_create_refuses_a_spin_out_of_range(spin_us: int) -> None:
    """spin_us outside 0..1000 raises ValueError naming the field, the rule and the value."""
    with pytest.raises(ValueError, match=rf"^spin_us must be between 0 and 1000, got {spin_us}$"):
        ShmRing.create(name=f"{PREFIX}bad", spin_us=spin_us)


def test_create_refuses_a_spin_that_is_no_number() -> None:
    """A spin_us that is not a number raises TypeError naming the field and the type."""
    with pytest.raises(
        TypeError, match=r"^spin_us must be a number of microseconds, got '5' \(str\)$"
    ):
        ShmRing.create(name=f"{PREFIX}bad", spin_us="5")  # type: ignore[arg-type]


@pytest.mark.parametrize("spin_us", [0, 7, DEFAULT_SPIN_US])
def test_attached_consumer_spins_with_the_creators_budget(
    monkeypatch: pytest.MonkeyPatch, spin_us: int
) -> None:
    """The consumer's get spins on the items word for the budget the ring was created with."""
    calls: list[tuple[int, int]] = []

    def recording(w: memoryview, at: int, seen: int, closed: int, budget_ns: int) -> bool:
        calls.append((seen, budget_ns))
        return spin(w, at, seen, closed, budget_ns)

    monkeypatch.setattr(_ring, "spin", recording)
    owner = ShmRing.create(slots=2, slot_bytes=4096, name=f"{PREFIX}a", spin_us=spin_us)
    with owner, ShmRing.attach(owner.handle()) as other:
        owner.put(b"one")
        assert other.get() == b"one"
        owner.put(b"two")
        assert other.get() == b"two"
    assert calls == [(0, spin_us * 1000), (1, spin_us * 1000)]


@pytest.mark.parametrize("spin_us", [0, DEFAULT_SPIN_US])
def test_items_cross_threads_in_order_with_or_without_the_spin(spin_us: int) -> None:
    """A producer thread's items all reach the consumer in order, spinning or sleeping."""
    count = 500
    owner = ShmRing.create(slots=2, slot_bytes=4096, name=f"{PREFIX}b", spin_us=spin_us)
    with owner, ShmRing.attach(owner.handle()) as other:

        def produce() -> None:
            for i in range(count):
                owner.put(i.to_bytes(4, "little"))

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            got = [int.from_bytes(other.get(timeout=30), "little") for _ in range(count)]
        finally:
            producer.join()
    assert got == list(range(count))
