"""What the front keeps of each visitor: sessions, queue tickets, per-address rates."""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ENDED_KEPT", "AddressRate", "Session", "Sessions", "Ticket"]

ENDED_KEPT = 256
"""Ended sessions whose end (and why) the front still tells their visitor about."""
TICKET_S = 10.0
"""A queue ticket whose page has not asked for its place this long is given up (it left)."""


def new_secret() -> str:
    """A fresh URL-safe secret (a session's token, a ticket's id)."""
    return secrets.token_urlsafe(24)


def same(given: str | None, secret: str) -> bool:
    """Whether ``given`` is ``secret``, compared in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), secret.encode())


@dataclass(eq=False)
class Session:
    """One visitor's session on one worker."""

    id: str
    token: str
    worker: int
    """The index of its worker."""
    started_at: float = field(default_factory=time.monotonic)
    port: int | None = None
    """The worker's private port of its WebTransport, once open."""
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""
    """Why it ended (``""`` while it runs)."""
    fps: float = 0.0
    """Frames a second its transport was handed (the worker's last status)."""
    last_input: float = field(default_factory=time.monotonic)
    """When its page last sent an input or a doc write (or it started)."""
    stopping: str = ""
    """Why the front asked its worker to end it (idle, its maximum, the server stopping)."""
    delivered: int = 0
    """Frames the front relayed to its page."""
    books: dict[str, int] = field(default_factory=dict)
    """The worker's books when it ended (produced, offered, unattached, dropped)."""

    def describe(self, now: float) -> dict[str, Any]:
        """The session as ``/sessions`` lists it."""
        return {
            "id": self.id,
            "worker": self.worker,
            "state": "ended" if self.ended.is_set() else "open" if self.port else "starting",
            "age_s": round(now - self.started_at, 1),
            "idle_s": round(now - self.last_input, 1),
            "fps": round(self.fps, 1),
            "delivered": self.delivered,
            "port": self.port,
        }


@dataclass(eq=False)
class Ticket:
    """A visitor waiting for a free worker."""

    id: str = field(default_factory=new_secret)
    polled_at: float = field(default_factory=time.monotonic)
    session: Session | None = None
    """The session it was given, once a worker was free."""


class Sessions:
    """Every live session (by id and by token), the newest ended ones, and the queue."""

    def __init__(self, queue_max: int, route: str = "") -> None:
        self.route = f"{route}-" if route else ""
        """Put before every session id, session token and ticket id given out (``NAME-``,
        then hex digits only), so a load balancer sends a visitor's later requests here."""
        self.live: dict[str, Session] = {}
        self.ended: OrderedDict[str, Session] = OrderedDict()
        self.queue: deque[Ticket] = deque()
        self.tickets: dict[str, Ticket] = {}
        self.queue_max = queue_max
        self.on_end: Callable[[str], None] | None = None
        """Called with each ended session's ``why`` (the front's metrics count them)."""

    def open(self, worker: int) -> Session:
        """A new session on ``worker``."""
        sid = self.route + secrets.token_hex(6)
        while sid in self.live or sid in self.ended:
            sid = self.route + secrets.token_hex(6)
        token = self.route + secrets.token_hex(24) if self.route else new_secret()
        session = Session(sid, token, worker)
        self.live[sid] = session
        return session

    def end(self, session: Session, why: str) -> None:
        """``session`` is over: kept among the ended for its visitor to read why."""
        if session.ended.is_set():
            return
        session.why = why
        session.ended.set()
        self.live.pop(session.id, None)
        self.ended[session.id] = session
        if self.on_end is not None:
            self.on_end(why)
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)

    def find(self, sid: str) -> Session | None:
        """The session ``sid``, live or among the ended kept."""
        return self.live.get(sid) or self.ended.get(sid)

    def by_token(self, token: str | None) -> Session | None:
        """The live session whose token is ``token``."""
        for session in self.live.values():
            if same(token, session.token):
                return session
        return None

    def wait(self) -> Ticket | None:
        """A ticket at the end of the queue; ``None`` when the queue is full."""
        if len(self.queue) >= self.queue_max:
            return None
        ticket = Ticket(id=self.route + secrets.token_hex(24)) if self.route else Ticket()
        self.queue.append(ticket)
        self.tickets[ticket.id] = ticket
        return ticket

    def place(self, ticket: Ticket) -> int:
        """``ticket``'s place in the queue (1: next); 0 once it has a session."""
        try:
            return self.queue.index(ticket) + 1
        except ValueError:
            return 0

    def next_ticket(self) -> Ticket | None:
        """The first ticket of the queue, taken off it."""
        return self.queue.popleft() if self.queue else None

    def expire(self, now: float) -> None:
        """Give up the tickets whose page stopped asking (its visitor left)."""
        for ticket in [t for t in self.tickets.values() if now - t.polled_at > TICKET_S]:
            del self.tickets[ticket.id]
            if ticket in self.queue:
                self.queue.remove(ticket)


class AddressRate:
    """New sessions per client address for ``--public``: ``burst`` at once, then one every
    ``every_s`` seconds (a token bucket per address)."""

    def __init__(self, burst: int = 4, every_s: float = 5.0) -> None:
        self.burst = burst
        self.every_s = every_s
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, address: str, now: float) -> float:
        """Take one for ``address``: 0 when allowed, else the seconds until one is."""
        level, at = self._buckets.get(address, (float(self.burst), now))
        level = min(float(self.burst), level + (now - at) / self.every_s)
        if level < 1.0:
            self._buckets[address] = (level, now)
            return (1.0 - level) * self.every_s
        self._buckets[address] = (level - 1.0, now)
        if len(self._buckets) > 10_000:  # forget the full buckets: they are the default
            full = [
                a
                for a, (lv, t) in self._buckets.items()
                if lv + (now - t) / self.every_s >= self.burst
            ]
            for key in full:
                del self._buckets[key]
        return 0.0
