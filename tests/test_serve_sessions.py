"""The front's books of visitors: the queue's order and bound, tickets given up, sessions
kept once ended, and the per-address rate of ``--public``."""

from __future__ import annotations

from rxstream.serve._sessions import ENDED_KEPT, TICKET_S, AddressRate, Sessions


def test_the_queue_keeps_its_order_and_its_bound() -> None:
    """Tickets are served first come, first served; past the bound none is given."""
    sessions = Sessions(queue_max=2)
    first, second = sessions.wait(), sessions.wait()
    assert first is not None
    assert second is not None
    assert sessions.wait() is None
    assert [sessions.place(first), sessions.place(second)] == [1, 2]
    assert sessions.next_ticket() is first
    assert [sessions.place(first), sessions.place(second)] == [0, 1]


def test_a_ticket_no_page_asks_for_is_given_up() -> None:
    """A ticket whose page stopped asking for its place for TICKET_S leaves the queue; one
    that asks stays."""
    sessions = Sessions(queue_max=4)
    gone, kept = sessions.wait(), sessions.wait()
    assert gone is not None
    assert kept is not None
    kept.polled_at = gone.polled_at + TICKET_S
    sessions.expire(gone.polled_at + TICKET_S + 0.1)
    assert list(sessions.queue) == [kept]
    assert gone.id not in sessions.tickets


def test_ended_sessions_are_kept_for_their_visitors_up_to_a_bound() -> None:
    """An ended session stays findable (its why) and leaves the live ones; only the newest
    ENDED_KEPT are kept."""
    sessions = Sessions(queue_max=0)
    made = [sessions.open(0) for _ in range(ENDED_KEPT + 1)]
    for session in made:
        sessions.end(session, "the page left")
    assert not sessions.live
    assert sessions.find(made[0].id) is None
    last = sessions.find(made[-1].id)
    assert last is not None
    assert last.why == "the page left"
    assert sessions.by_token(made[-1].token) is None  # an ended session's token opens nothing


def test_an_address_gets_a_burst_then_one_session_every_period() -> None:
    """AddressRate allows ``burst`` at once, then one per ``every_s``, each address alone."""
    rate = AddressRate(burst=2, every_s=5.0)
    assert [rate.take("a", 0.0), rate.take("a", 0.0)] == [0.0, 0.0]
    assert rate.take("a", 0.0) == 5.0
    assert rate.take("b", 0.0) == 0.0
    assert rate.take("a", 5.0) == 0.0
