"""Batched hand-offs: a stage thread works through its backlog back to back, with order,
stamps, statistics, slots and drops as if it had taken the items one at a time (issue 18
item 4). Two inboxes keep them: the C-queue one (``block``, ``drop_new``: items and free-slot
tokens, runtime/_handoff.py) and the deque one (``latest``; it takes a backlog in one lock
acquisition); the tests of behaviour run against both."""

from __future__ import annotations

import gc
import itertools
import signal
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import rxstream
from rxstream._kernel._inbox import InboxSpec
from rxstream._kernel._stats import StageCounters
from rxstream.runtime._handoff import TokenThread, stage_thread
from rxstream.runtime._thread import StageThread
from rxstream.runtime._threaded import ThreadedRun
from rxstream.transport import MemoryTransport
from rxstream.typing import InboxPolicy

WAIT_S = 10.0


def wait_until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` until it holds; raise (never hang) if it does not."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


KINDS = pytest.mark.parametrize("kind", [TokenThread, StageThread], ids=["tokens", "deque"])
"""Both inboxes: ``stage_thread`` picks the C-queue one for ``block`` and ``drop_new``."""


def blocked_in(thread: threading.Thread, *functions: str) -> bool:
    """Whether ``thread`` is inside one of ``functions`` now (a producer waiting for room)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name in functions:
            return True
        frame = frame.f_back
    return False


def waits_for_room(stage: Stage, producer: threading.Thread) -> bool:
    """Whether ``producer`` waits for room in ``stage``'s inbox (either kind)."""
    if isinstance(stage.thread, TokenThread):
        return blocked_in(producer, "_wait_for_room")
    return bool(stage.thread._waiting)


class Stage:
    """A bare :class:`StageThread` whose deliveries are recorded; item 0 waits for ``go``."""

    def __init__(
        self,
        capacity: int,
        policy: InboxPolicy = "block",
        kind: Callable[..., StageThread] = stage_thread,
    ) -> None:
        self.counters = StageCounters("t", "pipe")
        self.crashes: list[BaseException] = []
        self.thread = kind("t", InboxSpec(capacity, policy), self.counters, self.crashes.append)
        self.go = threading.Event()
        self.seen: list[Any] = []
        self.during: dict[Any, Callable[[], None]] = {}
        """Actions to run on the stage thread while delivering a given value."""
        self.started = threading.Event()

    def deliver(self, value: Any) -> None:
        """The stage's work: record ``value``; item 0 holds the thread until ``go``."""
        self.seen.append(value)
        if value == 0:
            self.started.set()
            assert self.go.wait(WAIT_S)
        action = self.during.get(value)
        if action is not None:
            action()

    def put(self, value: Any) -> None:
        """Hand ``value`` to the stage as data."""
        self.thread.put(self.deliver, value)

    def put_all(self, *values: Any) -> None:
        """Hand each of ``values`` to the stage, in order."""
        for value in values:
            self.put(value)

    def backlog(self, values: range) -> None:
        """Start the thread, park it on item 0, and queue ``values`` behind it."""
        self.thread.start()
        self.put(0)
        assert self.started.wait(WAIT_S)
        for value in values:
            self.put(value)

    def finish(self) -> None:
        """Complete the stage and wait for its thread to end."""
        done = threading.Event()
        self.thread.put_control(lambda _: done.set())
        assert done.wait(WAIT_S)
        self.thread.close()
        assert self.thread.join(WAIT_S)
        assert not self.crashes


def test_the_inbox_of_block_and_drop_new_is_the_c_queue_one() -> None:
    """``block`` and ``drop_new`` get the two C queues; ``latest`` and huge capacities the deque."""
    counters = StageCounters("t", "pipe")
    specs = [InboxSpec(2, "block"), InboxSpec(2, "drop_new"), InboxSpec(2, "latest")]
    specs.append(InboxSpec(1 << 17, "block"))
    kinds = [type(stage_thread("t", spec, counters, print)) for spec in specs]
    assert kinds == [TokenThread, TokenThread, StageThread, StageThread]


@KINDS
def test_a_waiting_item_holds_its_slot_until_its_delivery_starts(kind: type[StageThread]) -> None:
    """A backlog's items count as waiting (``depth``) until each one's delivery starts."""
    stage = Stage(capacity=8, kind=kind)
    views: list[int] = []
    for value in range(1, 6):
        stage.during[value] = lambda: views.append(stage.thread.depth)
    stage.backlog(range(1, 6))
    assert stage.thread.depth == 5
    stage.go.set()
    stage.finish()
    assert stage.seen == [0, 1, 2, 3, 4, 5]
    assert views == [4, 3, 2, 1, 0]
    assert stage.counters.snapshot().dropped == {}


def test_a_backlog_leaves_the_inbox_at_once_and_holds_its_slots() -> None:
    """The deque inbox empties at once; a batched item counts as waiting until it starts."""
    stage = Stage(capacity=8, kind=StageThread)
    views: list[tuple[int, int]] = []
    for value in range(1, 6):
        stage.during[value] = lambda: views.append((len(stage.thread._inbox), stage.thread.depth))
    stage.backlog(range(1, 6))
    assert stage.thread.depth == 5
    stage.go.set()
    stage.finish()
    assert stage.seen == [0, 1, 2, 3, 4, 5]
    # taken at once (the inbox is empty), the rest still counted: 4, 3, 2, 1, 0 waiting
    assert views == [(0, 4), (0, 3), (0, 2), (0, 1), (0, 0)]
    assert stage.counters.snapshot().dropped == {}


class Box:
    """A payload that a weak reference can watch."""

    def __init__(self, index: int) -> None:
        self.index = index


@KINDS
def test_a_batch_keeps_no_delivered_item_alive(kind: type[StageThread]) -> None:
    """Each batched item is let go once delivered, not when the batch ends (leases, memory)."""
    counters = StageCounters("t", "pipe")
    crashes: list[BaseException] = []
    thread = kind("t", InboxSpec(8, "block"), counters, crashes.append)
    started, go, done = threading.Event(), threading.Event(), threading.Event()
    refs: list[weakref.ref[Box]] = []
    alive: list[bool] = []

    def deliver(box: Box) -> None:
        if box.index == 0:
            started.set()
            assert go.wait(WAIT_S)
        else:
            gc.collect()
            alive.append(refs[box.index - 1]() is not None)  # the one delivered before
        if box.index == 4:
            done.set()

    thread.start()
    for index in range(5):
        box = Box(index)
        refs.append(weakref.ref(box))
        thread.put(deliver, box)
        del box
        if index == 0:
            assert started.wait(WAIT_S)
    go.set()
    assert done.wait(WAIT_S)
    thread.close()
    assert thread.join(WAIT_S)
    assert not crashes
    assert alive == [False, False, False, False]


@KINDS
def test_drop_new_counts_a_batch_as_full(kind: type[StageThread]) -> None:
    """Under ``drop_new`` an arrival while a batch holds every slot is dropped, not let in."""
    stage = Stage(capacity=4, policy="drop_new", kind=kind)
    stage.during[1] = lambda: stage.put_all(10, 11)  # room for one: 2, 3, 4 wait
    stage.backlog(range(1, 6))  # 1..4 fill the inbox, 5 is dropped
    stage.go.set()
    stage.finish()
    assert stage.seen == [0, 1, 2, 3, 4, 10]
    assert stage.counters.snapshot().dropped == {"drop_new": 2}


def test_latest_keeps_waiting_items_replaceable() -> None:
    """``latest`` takes no batch: a fresh arrival still replaces the oldest waiting item."""
    stage = Stage(capacity=2, policy="latest")
    stage.during[1] = lambda: stage.put_all(3, 4)  # 2 waits; 3 fits; 4 drops 2
    stage.backlog(range(1, 3))
    stage.go.set()
    stage.finish()
    assert stage.seen == [0, 1, 3, 4]
    assert stage.counters.snapshot().dropped == {"latest": 1}


@KINDS
def test_a_block_producer_waits_for_a_batched_slot_to_start(kind: type[StageThread]) -> None:
    """Under ``block`` a producer at a full inbox resumes when a batched item starts."""
    stage = Stage(capacity=3, kind=kind)
    resumed = threading.Event()

    def produce() -> None:
        stage.put(9)  # fits: 2 and 3 hold two slots
        stage.put(10)  # blocks until 2 starts
        resumed.set()

    producer = threading.Thread(target=produce)
    checked: list[bool] = []

    def start_producer() -> None:
        producer.start()
        wait_until(lambda: waits_for_room(stage, producer), "the producer to block")
        checked.append(resumed.is_set())

    stage.during[1] = start_producer
    stage.during[2] = lambda: checked.append(resumed.wait(WAIT_S))
    stage.backlog(range(1, 4))
    stage.go.set()
    wait_until(lambda: len(checked) == 2, "2 to start")
    producer.join(WAIT_S)
    stage.finish()
    assert checked == [False, True]
    assert stage.seen == [0, 1, 2, 3, 9, 10]
    assert stage.counters.snapshot().blocked_s > 0.0


@KINDS
def test_a_close_in_the_middle_of_a_batch_counts_the_rest_as_stopped(
    kind: type[StageThread],
) -> None:
    """A stop while a batch runs: what had started is delivered, the rest dropped as ``stopped``."""
    stage = Stage(capacity=8, kind=kind)
    stage.during[2] = stage.thread.close
    stage.backlog(range(1, 6))
    stage.go.set()
    assert stage.thread.join(WAIT_S)
    assert stage.seen == [0, 1, 2]
    assert stage.counters.snapshot().dropped == {"stopped": 3}
    assert stage.thread.depth == 0


@KINDS
def test_a_timer_due_in_a_batch_runs_before_the_rest(kind: type[StageThread]) -> None:
    """An action scheduled while a batch runs goes first, as with items taken one at a time."""
    stage = Stage(capacity=8, kind=kind)

    def schedule() -> None:
        stage.thread.schedule(lambda _scheduler, _state: stage.seen.append("timer"))

    stage.during[2] = schedule
    stage.backlog(range(1, 5))
    stage.go.set()
    stage.finish()
    assert stage.seen == [0, 1, 2, "timer", 3, 4]


def test_a_stage_that_stops_accepting_puts_the_rest_of_its_batch_back() -> None:
    """``set_accepting(False)`` in a batch: the rest returns, in order, to the inbox's front."""
    stage = Stage(capacity=8, kind=StageThread)
    views: list[list[Any]] = []
    stage.during[2] = lambda: stage.thread.set_accepting(False)
    stage.backlog(range(1, 5))
    stage.go.set()
    wait_until(lambda: stage.thread._idle, "the thread to wait")
    views.append([entry[1] for entry in stage.thread._inbox])
    assert stage.thread.depth == 2
    stage.put(5)
    stage.thread.set_accepting(True)
    stage.finish()
    assert views == [[3, 4]]
    assert stage.seen == [0, 1, 2, 3, 4, 5]


def test_a_stage_that_stops_accepting_keeps_its_slots_and_order() -> None:
    """C-queue inbox, ``set_accepting(False)``: nothing more starts, what waits keeps its slot
    (a producer at the full inbox blocks), a completion waits behind the items, order holds."""
    stage = Stage(capacity=3)
    stage.during[2] = lambda: stage.thread.set_accepting(False)
    stage.backlog(range(1, 4))
    stage.go.set()
    wait_until(lambda: stage.thread._idle, "the thread to wait")
    assert stage.seen == [0, 1, 2]
    assert stage.thread.depth == 1
    producer = threading.Thread(target=stage.put_all, args=(5, 6, 7))
    producer.start()  # 5 and 6 fit, 7 waits for room
    wait_until(lambda: blocked_in(producer, "_wait_for_room"), "the producer to block")
    done = threading.Event()
    stage.thread.put_control(lambda _: done.set())
    assert stage.seen == [0, 1, 2]
    stage.thread.set_accepting(True)  # from another thread: wakes it
    assert done.wait(WAIT_S)
    producer.join(WAIT_S)
    stage.finish()
    assert stage.seen == [0, 1, 2, 3, 5, 6, 7]
    assert stage.counters.snapshot().dropped == {}


def test_a_close_while_not_accepting_counts_what_the_thread_took() -> None:
    """C-queue inbox: entries the thread took while its stage did not accept are ``stopped``
    at a close, with what was still queued; none is delivered after."""
    stage = Stage(capacity=8)
    stage.during[1] = lambda: stage.thread.set_accepting(False)
    stage.backlog(range(1, 4))
    stage.go.set()
    wait_until(lambda: stage.thread._idle, "the thread to wait")
    stage.put(4)  # wakes nothing that starts: taken behind 2 and 3, or still queued
    stage.thread.close()
    assert stage.thread.join(WAIT_S)
    assert stage.seen == [0, 1]
    assert stage.counters.snapshot().dropped == {"stopped": 3}
    assert stage.thread.depth == 0


def test_one_item_at_a_time_takes_no_batch() -> None:
    """With one item waiting the deque thread takes it alone (the one-in-flight path)."""
    stage = Stage(capacity=8, kind=StageThread)
    batches: list[int] = []
    run_batch = stage.thread._run_batch

    def recorded(batch: deque[Any], started: float, stalled: float) -> None:
        batches.append(len(batch))
        run_batch(batch, started, stalled)

    stage.thread._run_batch = recorded  # type: ignore[method-assign]
    stage.backlog(range(1, 2))
    stage.go.set()
    wait_until(lambda: stage.seen == [0, 1], "item 1")
    stage.put(2)
    stage.finish()
    assert stage.seen == [0, 1, 2]
    assert batches == []


@pytest.mark.parametrize("policy", ["block", "drop_new"])
def test_a_batched_backlog_keeps_order_stamps_and_books(
    ctx: rxstream.Context, policy: InboxPolicy
) -> None:
    """Through a pipeline: order, ``.in``/``.out`` stamps back to back, slots held until each
    starts, statistics balanced."""
    holding = threading.Event()
    release = threading.Event()
    views: list[int] = []
    gate_thread: list[StageThread] = []

    def frames() -> Iterator[int]:
        yield 0
        assert holding.wait(WAIT_S)  # 1..8 arrive while 0 holds the gate
        yield from range(1, 9)

    def gate(x: int) -> int:
        if x == 0:
            holding.set()
            assert release.wait(WAIT_S)
        else:
            (thread,) = gate_thread
            views.append(thread.depth)  # data waiting: those behind this one
        return x

    pipeline = (
        ctx.source(frames, name="source")
        | ctx.pipe(gate, name="gate", capacity=8, policy=policy)
        | ctx.stream("out")
    )
    pipeline.start()
    run = pipeline._run
    assert isinstance(run, ThreadedRun)
    gate_thread.extend(t for t in run.threads.values() if t.name == "gate")
    wait_until(lambda: pipeline.statistics()["gate"].inbox_depth == 8, "a full inbox")
    release.set()
    assert pipeline.wait(timeout=WAIT_S)
    assert isinstance(ctx.transport, MemoryTransport)
    items = ctx.transport.items("out")
    assert [item.payload for item in items] == list(range(9))
    assert views == [7, 6, 5, 4, 3, 2, 1, 0]
    spans = []
    for item in items:
        stamps = dict(item.metadata.timeline)
        assert stamps["source.out"] <= stamps["gate.in"] <= stamps["gate.out"]
        spans.append((stamps["gate.in"], stamps["gate.out"]))
    assert all(done <= nxt for (_, done), (nxt, _) in itertools.pairwise(spans))
    stats = pipeline.statistics()["gate"]
    assert (stats.items_in, stats.items_out, dict(stats.dropped)) == (9, 9, {})


def test_a_stop_in_the_middle_of_a_batch_keeps_the_books(ctx: rxstream.Context) -> None:
    """A run halted while a stage works through a batch: what it had not started is ``stopped``."""
    holding = threading.Event()
    release = threading.Event()
    runs: list[ThreadedRun] = []

    def frames() -> Iterator[int]:
        yield 0
        assert holding.wait(WAIT_S)
        yield from range(1, 9)

    def gate(x: int) -> int:
        if x == 0:
            holding.set()
            assert release.wait(WAIT_S)
        elif x == 3:
            runs[0].halt()  # closes every inbox at once, from this stage's thread
        return x

    pipeline = (
        ctx.source(frames, name="source")
        | ctx.pipe(gate, name="gate", capacity=8)
        | ctx.stream("out")
    )
    pipeline.start()
    run = pipeline._run
    assert isinstance(run, ThreadedRun)
    runs.append(run)
    wait_until(lambda: pipeline.statistics()["gate"].inbox_depth == 8, "a full inbox")
    release.set()
    wait_until(lambda: all(thread.join(0) for thread in run.threads.values()), "the halt")
    pipeline.stop()
    stats = pipeline.statistics()["gate"]
    # 1, 2, 3 started from the batch; 4..8 had not: dropped, none waiting, none lost
    assert (stats.items_in, dict(stats.dropped), stats.inbox_depth) == (4, {"stopped": 5}, 0)


class Interrupted(BaseException):
    """Stands for a KeyboardInterrupt arriving while a producer waits for room."""


def test_a_producer_interrupted_while_waiting_for_room_leaves_no_waiter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deque inbox: a producer whose wait for room is interrupted leaves the queue of waiters:
    the slot freed next goes to the producer still waiting, not to the one that left."""
    from rxstream.runtime import _thread

    real = threading.Lock
    made = [0]

    class InterruptedLock:
        """The first waiter's lock: its blocking acquire raises, as a signal would."""

        def __init__(self) -> None:
            self.lock = real()
            self.calls = 0

        def acquire(self, *args: Any) -> bool:
            self.calls += 1
            if self.calls == 2:  # the first call takes it; the second is the wait
                raise Interrupted
            return self.lock.acquire(*args)

        def release(self) -> None:
            self.lock.release()

    def new_lock() -> Any:
        made[0] += 1
        return InterruptedLock() if made[0] == 1 else real()

    monkeypatch.setattr(_thread, "_new_lock", new_lock)
    stage = Stage(capacity=1, kind=StageThread)
    stage.backlog(range(1, 2))  # item 0 parks the thread, item 1 fills the inbox
    left: list[BaseException] = []

    def interrupted_put() -> None:
        try:
            stage.put(2)
        except Interrupted as exc:
            left.append(exc)

    first = threading.Thread(target=interrupted_put)
    first.start()
    first.join(WAIT_S)
    assert len(left) == 1
    assert not stage.thread._waiting
    second = threading.Thread(target=stage.put, args=(3,))
    second.start()
    wait_until(lambda: len(stage.thread._waiting) == 1, "the second producer to wait")
    stage.go.set()
    second.join(WAIT_S)
    assert not second.is_alive()  # the freed slot went to it
    stage.finish()
    assert stage.seen == [0, 1, 3]


def test_ctrl_c_while_waiting_for_room_takes_no_slot() -> None:
    """C-queue inbox: a Ctrl-C in the main thread's wait for room raises there and takes no
    slot: the slot freed next goes to the producer still waiting."""
    stage = Stage(capacity=1)
    stage.backlog(range(1, 2))  # item 0 parks the thread, item 1 fills the inbox
    main = threading.main_thread()

    def interrupt() -> None:
        wait_until(lambda: blocked_in(main, "_wait_for_room"), "the main thread to block")
        signal.pthread_kill(main.ident or 0, signal.SIGINT)

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        stage.put(2)
    interrupter.join(WAIT_S)
    second = threading.Thread(target=stage.put, args=(3,))
    second.start()
    wait_until(lambda: blocked_in(second, "_wait_for_room"), "the second producer to wait")
    stage.go.set()
    second.join(WAIT_S)
    assert not second.is_alive()  # the freed slot went to it
    stage.finish()
    assert stage.seen == [0, 1, 3]
    assert stage.counters.snapshot().dropped == {}


@KINDS
def test_idle_only_while_nothing_waits_or_runs(kind: type[StageThread]) -> None:
    """``idle`` holds while the thread waits with nothing queued, never while an item waits
    or is being delivered, nor while a timer is due."""
    stage = Stage(capacity=2, kind=kind)
    stage.thread.start()
    wait_until(lambda: stage.thread.idle, "the thread to wait")
    stage.put(0)  # parks the thread in its delivery until ``go``
    assert stage.started.wait(WAIT_S)
    assert not stage.thread.idle
    stage.put(1)
    assert not stage.thread.idle
    stage.go.set()
    wait_until(lambda: stage.seen == [0, 1], "1 to be delivered")
    wait_until(lambda: stage.thread.idle, "the thread to wait again")
    stage.finish()
    assert stage.counters.snapshot().dropped == {}


class Watched:
    """A C queue of a :class:`TokenThread`, wrapped: a blocking ``get`` first waits for
    ``gate`` (``at_gate`` says it came), ``qsize`` runs a one-shot ``hook`` (a close landing
    just after a put's closed check), ``put`` a one-shot ``before_put``, and wake-ups are
    held back while ``held`` is a list, until the next other entry is queued."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.gate = threading.Event()
        self.gate.set()
        self.at_gate = threading.Event()
        self.hook: Callable[[], None] | None = None
        self.before_put: Callable[[Any], None] | None = None
        self.held: list[Any] | None = None

    def qsize(self) -> int:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return int(self.real.qsize())

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block:
            self.at_gate.set()
            assert self.gate.wait(WAIT_S)
        return self.real.get(block, timeout)

    def get_nowait(self) -> Any:
        return self.real.get_nowait()

    def put(self, item: Any) -> None:
        before, self.before_put = self.before_put, None
        if before is not None:
            before(item)
        if self.held is not None and len(item) == 1:
            self.held.append(item)
            return
        self.real.put(item)
        if self.held is not None:
            for wake in self.held:
                self.real.put(wake)
            self.held = None


def watched(stage: Stage) -> tuple[Watched, Watched]:
    """Wrap ``stage``'s two C queues (before its thread starts); the items', the tokens'."""
    thread = stage.thread
    assert isinstance(thread, TokenThread)
    items, tokens = Watched(thread._items), Watched(thread._tokens)
    thread._items, thread._tokens = items, tokens  # type: ignore[assignment]
    thread.put = thread._putter(thread.policy == "block")  # its closure binds the queues
    return items, tokens


def on(where: str, action: Callable[[], None]) -> None:
    """Run ``action`` on the main thread or on a thread of its own, to its end."""
    if where == "main":
        action()
        return
    worker = threading.Thread(target=action)
    worker.start()
    worker.join(WAIT_S)
    assert not worker.is_alive()


PRODUCERS = pytest.mark.parametrize("where", ["main", "worker"])
"""Both puts: the main thread's (interruptible) and any other thread's."""


@PRODUCERS
def test_a_put_racing_a_close_leaves_the_idle_thread_its_wake_up(where: str) -> None:
    """A put that queues as a close comes sweeps the queue again, and with it the wake-up
    close queued: the idle thread is still woken and ends, and the item is ``stopped``."""
    stage = Stage(capacity=2)
    items, tokens = watched(stage)
    items.gate.clear()  # the thread's wait for work holds until the put is done
    stage.thread.start()
    assert items.at_gate.wait(WAIT_S)
    tokens.hook = stage.thread.close  # lands just after the put's closed check
    on(where, lambda: stage.put("x"))
    items.gate.set()
    assert stage.thread.join(WAIT_S)
    assert stage.seen == []
    assert stage.counters.snapshot().dropped == {"stopped": 1}


@PRODUCERS
def test_a_put_racing_a_close_hands_on_the_wake_up_of_waiting_producers(where: str) -> None:
    """A put that takes the token close left for the producers waiting for room gives one
    back: the waiting producer wakes, its item counted ``stopped``."""
    stage = Stage(capacity=1)
    _, tokens = watched(stage)
    stage.backlog(range(1, 2))  # item 0 parks the thread, item 1 fills the inbox
    tokens.gate.clear()  # the waiting producer's wait for a token holds until the put is done
    tokens.at_gate.clear()
    waiting = threading.Thread(target=stage.put, args=(2,))
    waiting.start()
    assert tokens.at_gate.wait(WAIT_S)
    tokens.hook = stage.thread.close  # close's token is there for the put to take
    on(where, lambda: stage.put(3))
    tokens.gate.set()
    waiting.join(WAIT_S)
    assert not waiting.is_alive()
    stage.go.set()
    assert stage.thread.join(WAIT_S)
    assert stage.seen == [0]
    assert stage.counters.snapshot().dropped == {"stopped": 3}  # 1, 2 and 3


def test_a_completion_queued_as_a_close_comes_is_not_delivered() -> None:
    """C-queue inbox: a completion whose closed check passed before a close but queued
    after close's sweep (ahead of its wake-up) is not delivered after the close, as with the
    deque inbox."""
    stage = Stage(capacity=2)
    items, _ = watched(stage)
    items.gate.clear()
    stage.thread.start()
    assert items.at_gate.wait(WAIT_S)
    done = threading.Event()

    def close_first(_: Any) -> None:  # close sweeps; its wake-up lands behind the completion
        items.held = []
        stage.thread.close()

    items.before_put = close_first
    stage.thread.put_control(lambda _: done.set())
    assert items.real.qsize() == 2  # the completion, then the wake-up
    items.gate.set()
    assert stage.thread.join(WAIT_S)
    assert not done.is_set()


def test_entries_queued_again_as_the_thread_ends_are_counted_by_a_close_meanwhile() -> None:
    """C-queue inbox: a thread that ends (its stage failed) while a close sweeps puts what it
    took back and counts it (``stopped``): nothing the close's sweep missed goes uncounted."""
    stage = Stage(capacity=4)
    items, _ = watched(stage)
    stage.during[1] = lambda: stage.thread.set_accepting(False)
    stage.backlog(range(1, 4))
    stage.go.set()
    thread = stage.thread
    assert isinstance(thread, TokenThread)
    wait_until(lambda: len(thread._taken) == 2, "2 and 3 to be taken, not started")

    def close_at_requeue(entry: Any) -> None:  # the first entry queued again meets a close
        if len(entry) == 1:  # the timer's wake-up
            items.before_put = close_at_requeue
        else:
            stage.thread.close()

    items.before_put = close_at_requeue

    def fail(*_: Any) -> None:
        raise Interrupted

    stage.thread.schedule(fail)  # a timer runs though the stage does not accept: it fails
    assert stage.thread.join(WAIT_S)
    assert [type(exc) for exc in stage.crashes] == [Interrupted]
    assert stage.seen == [0, 1]
    assert stage.counters.snapshot().dropped == {"stopped": 2}


def interrupt_at(count: int) -> Callable[..., Any]:
    """A tracer raising ``KeyboardInterrupt`` at the ``count``-th line run in the C-queue
    inbox's code, as a Ctrl-C's handler would there (a signal is handled between any two
    bytecodes, one just after a C call returned included); counts the lines in ``lines``."""
    lines = [0]
    code = TokenThread._putter.__code__.co_filename

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            lines[0] += 1
            if lines[0] == count:
                raise KeyboardInterrupt
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == code else None

    tracer.lines = lines  # type: ignore[attr-defined]
    return tracer


def free_a_slot(thread: TokenThread, done: threading.Event, fed: threading.Event) -> None:
    """Free a slot of ``thread``, as its thread would, once the main thread waits for room
    (``fed`` then); nothing when its put ends (``done``) first."""
    wait_until(
        lambda: done.is_set() or blocked_in(threading.main_thread(), "_wait_for_room"),
        "the main thread to wait or finish",
    )
    if not done.is_set():
        fed.set()
        thread._tokens.put(None)


@pytest.mark.parametrize("full", [False, True], ids=["free-slot", "waits-for-room"])
def test_ctrl_c_anywhere_in_a_put_keeps_every_slot(full: bool) -> None:
    """C-queue inbox: a Ctrl-C landing at any line of the main thread's put, from the token
    taken (at once, or after a wait for room) to the entry queued, leaves no slot taken:
    each token is free or held by a queued entry."""
    assert threading.current_thread() is threading.main_thread()
    for count in itertools.count(1):
        stage = Stage(capacity=1)  # its thread never starts: the queues stay as the put left
        thread = stage.thread
        assert isinstance(thread, TokenThread)
        fed = threading.Event()
        done = threading.Event()
        if full:
            stage.put(1)  # takes the one token: the next put waits for room

            helper = threading.Thread(target=free_a_slot, args=(thread, done, fed))
            helper.start()
        tracer = interrupt_at(count)
        interrupted = False
        sys.settrace(tracer)
        try:
            stage.put(2)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
            done.set()
        if full:
            helper.join(WAIT_S)
            assert not helper.is_alive()
        slots = 1 + fed.is_set()
        assert thread._tokens.qsize() + thread._items.qsize() == slots, count
        thread.close()
        if not interrupted:
            assert tracer.lines[0] < count  # type: ignore[attr-defined]
            break
