"""The ring's wake path: a bounded spin on the items word before the consumer sleeps."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator

import pytest

from rxstream.ipc import ShmRing, _ring
from rxstream.ipc._ringlayout import W_SENT
from rxstream.ipc._wake import DEFAULT_SPIN_US, MAX_SPIN_US, spin, spin_budget

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
    # the first wait has no gap to go by; the second may stretch to the gap between the two
    assert calls[0] == (0, spin_us * 1000)
    assert calls[1][0] == 1
    if spin_us:
        assert spin_us * 1000 <= calls[1][1] <= MAX_SPIN_US * 1000
    else:
        assert calls[1][1] == 0


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


@pytest.mark.parametrize(
    ("base_ns", "gap_ns", "budget_ns"),
    [
        (50_000, 0, 50_000),  # no gap known yet: the ring's own budget
        (50_000, 20_000, 50_000),  # a gap shorter than the budget: the budget
        (50_000, 300_000, 450_000),  # a backlog of frames: 1.5x the gap
        (50_000, 900_000, 1_000_000),  # up to MAX_SPIN_US
        (50_000, 1_000_001, 50_000),  # sparse items: the ring's own budget, no more
        (50_000, 41_666_667, 50_000),  # 24 fps
        (0, 300_000, 0),  # spin_us=0: the consumer sleeps at once, whatever the gap
    ],
)
def test_spin_budget_stretches_to_short_gaps_only(
    base_ns: int, gap_ns: int, budget_ns: int
) -> None:
    """The budget is 1.5x a short gap between items, bounded, and the base for sparse ones."""
    assert spin_budget(base_ns, gap_ns) == budget_ns


def test_consumer_budget_follows_the_gaps_between_items(monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumer's spin stretches to 1.5x the last gap between items, back to the base
    after a long one (a fake clock sets the gaps)."""
    budgets: list[int] = []
    now = [0]

    def recording(w: memoryview, at: int, seen: int, closed: int, budget_ns: int) -> bool:
        budgets.append(budget_ns)
        return spin(w, at, seen, closed, budget_ns)

    monkeypatch.setattr(_ring, "spin", recording)
    monkeypatch.setattr(_ring, "_ns", lambda: now[0])
    owner = ShmRing.create(slots=2, slot_bytes=4096, name=f"{PREFIX}c", spin_us=DEFAULT_SPIN_US)
    with owner, ShmRing.attach(owner.handle()) as other:
        for at_us in (5_000, 5_200, 5_400, 13_400, 13_500):
            now[0] = at_us * 1000
            owner.put(b"x")
            assert other.get() == b"x"
    base = DEFAULT_SPIN_US * 1000
    # gaps: none yet, 5 ms since the clock's 0 (long), 200 µs, 200 µs, 8 ms (long)
    assert budgets == [base, base, 300_000, 300_000, base]


def test_a_wait_that_times_out_drops_the_backlogs_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """After items 200 µs apart, a ``get`` that times out ends the stretched budget: the
    waits that follow spin the ring's ``spin_us`` alone (an idle ring polled with a timeout
    does not keep spinning as if a backlog were coming)."""
    budgets: list[int] = []
    now = [0]

    def recording(w: memoryview, at: int, seen: int, closed: int, budget_ns: int) -> bool:
        budgets.append(budget_ns)
        return spin(w, at, seen, closed, budget_ns)

    monkeypatch.setattr(_ring, "spin", recording)
    monkeypatch.setattr(_ring, "_ns", lambda: now[0])
    owner = ShmRing.create(slots=2, slot_bytes=4096, name=f"{PREFIX}t", spin_us=DEFAULT_SPIN_US)
    with owner, ShmRing.attach(owner.handle()) as other:
        for at_us in (5_000, 5_200, 5_400):
            now[0] = at_us * 1000
            owner.put(b"x")
            assert other.get() == b"x"
        for _ in range(2):
            with pytest.raises(TimeoutError):
                other.get(timeout=0.001)
    base = DEFAULT_SPIN_US * 1000
    assert budgets == [base, base, 300_000, 300_000, base]


def test_the_sent_word_moves_only_once_the_index_is_in_the_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The word the consumer's spin watches moves after the ready pipe's write, so a consumer
    that saw it finds the index there without sleeping."""
    owner = ShmRing.create(slots=2, slot_bytes=4096, name=f"{PREFIX}d")
    seen_at_write: list[int] = []
    write = os.write

    class Os:
        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: bytes) -> int:
            if fd == owner._ready_w:
                seen_at_write.append(owner._words[W_SENT])
            return write(fd, data)

    monkeypatch.setattr(_ring, "os", Os())
    with owner, ShmRing.attach(owner.handle()) as other:
        for i in range(3):
            owner.put(bytes([i]))
            assert owner._words[W_SENT] == i + 1
            assert other.get() == bytes([i])
    assert seen_at_write[:3] == [0, 1, 2]
