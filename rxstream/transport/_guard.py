"""What guards the web session: who may attach, what a message may hold, how fast, and what
the server may say.

- :class:`Gate` checks a handshake (the page and ``/ws``): the ``Host`` must be the bound
  address, an IP literal the bind allows, or ``localhost`` (DNS rebinding); a browser's
  ``Origin`` must be the page's own; the per-run token must match, compared in constant time.
- :func:`parse_message` reads one JSON message within :class:`SessionLimits`: nesting depth,
  digits per number, characters per string, finite numbers only, valid Unicode only.
- :class:`TokenBucket`, :class:`ClientGuard`: per-connection rates (steers, sets, inputs,
  refused messages, all messages) and a :class:`SampledLog` of refusals, one line a second.
- :func:`wire`: JSON for the page that never holds a bare ``NaN`` or ``Infinity``.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rxstream._exceptions import ArgumentError, shown
from rxstream._util import finite_only, library_logger, lone_surrogate

__all__ = [
    "MAX_ID_INT",
    "ClientGuard",
    "Gate",
    "Rate",
    "Refused",
    "SampledLog",
    "SessionLimits",
    "TokenBucket",
    "check_token",
    "is_loopback",
    "new_token",
    "parse_message",
    "shown",
    "wire",
]

_log = library_logger("rxstream.web")

Clock = Callable[[], float]

_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,256}")


class Refused(Exception):
    """A message the session answers with ``{"type": "error", "code": code, …}``."""

    def __init__(self, code: str, message: str, ident: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.ident = ident
        """The refused message's ``id``, when it could be read before the refusal."""


# --- limits -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """A token bucket: ``per_s`` tokens a second, at most ``burst`` saved up."""

    per_s: float
    burst: int

    def __post_init__(self) -> None:
        if isinstance(self.per_s, bool) or not isinstance(self.per_s, int | float):
            raise ArgumentError(f"per_s must be a number > 0, got {self.per_s!r}")
        if not (math.isfinite(self.per_s) and self.per_s > 0):
            raise ArgumentError(f"per_s must be a finite number > 0, got {self.per_s!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ArgumentError(f"burst must be an int >= 1, got {self.burst!r}")

    def __str__(self) -> str:
        return f"{self.per_s:g} a second (burst {self.burst})"


@dataclass(frozen=True)
class SessionLimits:
    """What one connection to a ``WebTransport`` may send, and how many may attach.

    Rates are per connection. A ``steer``, ``set`` or ``input`` over its rate is refused
    (``rate_limited``) and answered. Every message spends a ``messages`` token and every refused
    one a ``refusals`` token; when either bucket is empty the server stops reading that
    connection until it refills (TCP backpressure slows the sender; nothing is dropped).
    """

    max_connections: int = 64
    """Connections (pages and other clients) attached at once; the next is refused (503)."""
    max_depth: int = 32
    """Nesting of arrays and objects in one message."""
    max_number_digits: int = 40
    """Characters in one JSON number literal (a 5000-digit int is refused, never parsed)."""
    max_string_chars: int = 8192
    """Characters in one string (a key or a value)."""
    steers: Rate = field(default_factory=lambda: Rate(5.0, 10))
    """``steer`` messages: each starts a generation, so they are the dearest."""
    sets: Rate = field(default_factory=lambda: Rate(60.0, 120))
    """``set`` messages (a slider drag sends one per change)."""
    inputs: Rate = field(default_factory=lambda: Rate(240.0, 480))
    """``input`` samples (the page sends pointer moves at most ~120 a second)."""
    keyframes: Rate = field(default_factory=lambda: Rate(1.0, 3))
    """``keyframe`` requests: each makes the stream's shared encoder send an IDR to every page."""
    doc_writes: Rate = field(default_factory=lambda: Rate(120.0, 240))
    """``set`` and ``steer`` messages of all connections together (each connection also has
    its own ``sets`` and ``steers``): many connections within their own rates still cannot
    make the session write its docs faster than this."""
    requested_keyframes: Rate = field(default_factory=lambda: Rate(1.0, 2))
    """Keyframes a stream's shared encoder makes on request, all pages together (besides its
    own, one a second): a page that loses frames or asks for one past it waits for the next."""
    reports: Rate = field(default_factory=lambda: Rate(120.0, 240))
    """``shown`` and ``pong`` messages (the page reports a frame per new input, answers pings)."""
    acks: Rate = field(default_factory=lambda: Rate(480.0, 960))
    """``got`` messages (the page acknowledges each frame it receives, of every stream)."""
    offers: Rate = field(default_factory=lambda: Rate(1.0, 3))
    """``rtc-offer`` messages (each makes a WebRTC peer connection: DTLS, SCTP)."""
    refusals: Rate = field(default_factory=lambda: Rate(20.0, 100))
    """Refused messages of any kind: past it the server reads the connection at this pace."""
    messages: Rate = field(default_factory=lambda: Rate(1000.0, 2000))
    """All messages: past it the server reads the connection at this pace."""
    queued_texts: int = 256
    """Text messages (acks, errors, doc states, timing) waiting for a slow page; past it they
    are dropped, counted, and reported to the page in a ``dropped`` message."""
    queued_text_bytes: int = 1 << 20
    """Bytes of those texts waiting for a slow page (1 MiB); past it, the same as past
    ``queued_texts`` (a text alone in the queue is always kept)."""
    idle_connection_s: float = 10.0
    """A connection that has not sent a whole request (or sits idle between requests) this
    long is closed (aiohttp's keep-alive timeout, armed from the connection's start): a
    partial request and then silence holds no socket for longer."""
    log_every_s: float = 1.0
    """At most one refusal log line per connection in this many seconds (with a count of the
    lines it stands for)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "log_every_s":
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise ArgumentError(f"log_every_s must be a number >= 0, got {value!r}")
            elif f.name == "idle_connection_s":
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int | float)
                    or not (math.isfinite(value) and value > 0)
                ):
                    raise ArgumentError(
                        f"idle_connection_s must be a finite number > 0, got {shown(value)}"
                    )
            elif f.type == "Rate" or isinstance(value, Rate):
                if not isinstance(value, Rate):
                    raise ArgumentError(f"{f.name} must be a Rate(per_s, burst), got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(f"{f.name} must be an int >= 1, got {value!r}")


# --- the handshake ------------------------------------------------------------------------


def new_token() -> str:
    """A fresh per-run secret (URL-safe, 256 bits)."""
    return secrets.token_urlsafe(32)


def check_token(token: str) -> str:
    """``token`` if it is a usable secret, else a ValueError naming the rule."""
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise ArgumentError(
            "token must be 16..256 URL-safe characters (A-Z a-z 0-9 _ -), "
            f"got {'a ' + type(token).__name__ if not isinstance(token, str) else shown(token)}"
        )
    return token


def _split_host(header: str) -> str | None:
    """The host part of a ``Host`` header (``[::1]:8765`` → ``::1``); None if malformed."""
    if header.startswith("["):
        end = header.find("]")
        if end < 0 or (header[end + 1 :] and not re.fullmatch(r":\d{1,5}", header[end + 1 :])):
            return None
        return header[1:end]
    host, colon, port = header.rpartition(":")
    if not colon:
        return header
    return host if port.isdigit() else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only: ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Gate:
    """The checks every handshake passes: Host, Origin and the token.

    ``host`` is the bound address. A ``Host`` header is accepted when it names ``localhost``,
    the bound address, one of ``allowed_hosts``, or an IP literal (a loopback one unless
    ``allow_remote``): a DNS-rebinding page reaches the port under its own name, which is
    none of these. An ``Origin``, when present, must be the origin the page was served from
    (``http://`` + the ``Host`` header): browsers always send one on a WebSocket, so another
    site's page is refused; a client without one (a script, curl) needs the token like anyone.
    """

    def __init__(
        self,
        *,
        host: str,
        token: str | None,
        allow_remote: bool = False,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.host = host.lower()
        self.token = token
        self.allow_remote = allow_remote
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)

    def refuse(
        self,
        *,
        host: str | None,
        origin: str | None,
        token: str | None,
        scheme: str = "http",
    ) -> str | None:
        """Why this handshake is refused (one line), or None when it passes."""
        if not host:
            return "the request has no Host header"
        name = _split_host(host.lower())
        if name is None or not self._host_allowed(name):
            return (
                f"Host {shown(host)} is not this server's address: use {self.host} or "
                "localhost (a rebound DNS name is refused)"
            )
        if origin is not None and origin.lower() != f"{scheme}://{host.lower()}":
            return (
                f"Origin {shown(origin)} is not this page's origin {scheme}://{host}: another "
                "site's page may not attach"
            )
        if self.token is None:
            return None
        if not token:
            return "the session token is missing: open the URL that rxstream printed (?token=…)"
        if not hmac.compare_digest(token.encode("utf-8", "replace"), self.token.encode()):
            return "the session token is wrong: open the URL that rxstream printed (?token=…)"
        return None

    def _host_allowed(self, name: str) -> bool:
        if name == self.host or name in self.allowed_hosts or is_loopback(name):
            return True
        return self.allow_remote and _is_address(name)


# --- one message --------------------------------------------------------------------------


class _TooLarge(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_message(text: str, limits: SessionLimits) -> Any:
    """The JSON value of ``text`` within ``limits``, else :class:`Refused` naming the rule."""
    digits = limits.max_number_digits

    def number(literal: str, kind: type) -> int | float:
        if len(literal) > digits:
            raise _TooLarge(
                "oversized",
                f"a number must be at most {digits} characters, got one of {len(literal)} "
                f"({literal[:12]}…)",
            )
        value = kind(literal)
        if kind is float and not math.isfinite(value):
            raise _TooLarge("malformed", f"numbers must be finite, got {literal!r}")
        return value  # type: ignore[no-any-return]

    def constant(literal: str) -> Any:
        raise _TooLarge("malformed", f"numbers must be finite, got {literal}")

    try:
        value = json.loads(
            text,
            parse_int=lambda s: number(s, int),
            parse_float=lambda s: number(s, float),
            parse_constant=constant,
        )
    except _TooLarge as exc:
        raise Refused(exc.code, str(exc), _leading_id(text)) from None
    except RecursionError:
        raise Refused(
            "oversized",
            f"nesting must be at most {limits.max_depth} deep, got far deeper",
            _leading_id(text),
        ) from None
    except ValueError as exc:  # json.JSONDecodeError among them
        raise Refused("malformed", f"a message must be JSON: {exc}", _leading_id(text)) from None
    try:
        _check_tree(value, limits)
    except Refused as refused:  # answer with the id if the id itself is fit to echo
        ident = value.get("id") if isinstance(value, dict) else None
        if fit_id(ident):
            with contextlib.suppress(Refused):
                _check_string(ident, "$.id", limits) if isinstance(ident, str) else None
                refused.ident = ident
        raise
    if isinstance(value, dict) and not fit_id(value.get("id")):
        raise Refused(
            "malformed",
            f"id must be an int within ±2^53 (a JavaScript number holds it exactly) or a "
            f"string of at most {MAX_ID_CHARS} characters, got {shown(value.get('id'))}",
        )
    return value


MAX_ID_CHARS = 64
"""The longest string ``id`` the session echoes (in an ack, an error, a ``dropped`` report)."""

MAX_ID_INT = 2**53
"""The largest int ``id`` (in magnitude) the session echoes: a page's JavaScript holds it."""

_LEADING_ID = re.compile(r'\s*\{\s*"id"\s*:\s*(-?\d{1,16}|"[A-Za-z0-9_.:-]{0,64}")\s*[,}]')


def _leading_id(text: str) -> Any:
    """The ``id`` of a message that could not be parsed, when it comes first (else None)."""
    match = _LEADING_ID.match(text[:200])
    if match is None:
        return None
    ident = json.loads(match.group(1))
    return ident if fit_id(ident) else None


def fit_id(ident: Any) -> bool:
    """Whether a message's ``id`` may be echoed back: absent, an int within ±2^53, or a
    short string."""
    if ident is None:
        return True
    if isinstance(ident, int) and not isinstance(ident, bool):
        return abs(ident) <= MAX_ID_INT
    return isinstance(ident, str) and len(ident) <= MAX_ID_CHARS


def _check_tree(value: Any, limits: SessionLimits) -> None:
    stack: list[tuple[Any, int, str]] = [(value, 0, "$")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            _check_string(node, path, limits)
        elif isinstance(node, dict | list):
            if depth >= limits.max_depth:
                raise Refused(
                    "oversized",
                    f"nesting must be at most {limits.max_depth} deep, got deeper at {path}",
                )
            if isinstance(node, dict):
                for key, child in node.items():
                    _check_string(key, f"{path} (a key)", limits)
                    stack.append((child, depth + 1, f"{path}.{key[:40]}"))
            else:
                stack.extend((child, depth + 1, f"{path}[{i}]") for i, child in enumerate(node))


def _check_string(text: str, path: str, limits: SessionLimits) -> None:
    if len(text) > limits.max_string_chars:
        raise Refused(
            "oversized",
            f"a string must be at most {limits.max_string_chars} characters, got "
            f"{len(text)} at {path}",
        )
    at = lone_surrogate(text)
    if at is not None:
        raise Refused(
            "malformed",
            f"strings must be valid Unicode, got a lone surrogate {text[at]!r} at {path}",
        )


# --- what the server says -----------------------------------------------------------------


def wire(message: Mapping[str, Any]) -> str:
    """``message`` as JSON text a browser's ``JSON.parse`` reads: never a bare NaN/Infinity.

    A non-finite float becomes ``null`` and its place is listed in ``unsendable`` (a
    warning is logged once a second at most); the message is still sent.
    """
    try:
        return json.dumps(message, allow_nan=False, default=repr)
    except ValueError:
        pass
    places: list[str] = []
    cleaned = finite_only(message, places)
    _unsendable.warning("web_value_unsendable", type=message.get("type"), places=places[:8])
    return json.dumps({**cleaned, "unsendable": places}, allow_nan=False, default=repr)


# --- rates and log lines ------------------------------------------------------------------


class TokenBucket:
    """``rate.per_s`` tokens a second, at most ``rate.burst`` saved up (starts full); safe to
    use from several threads (a page's ``keyframes`` rate is spent on the sink's thread and on
    the loop's)."""

    def __init__(self, rate: Rate, clock: Clock = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._tokens = float(rate.burst)
        self._at = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.rate.burst, self._tokens + (now - self._at) * self.rate.per_s)
        self._at = now

    def take(self) -> bool:
        """Spend a token if there is one."""
        with self._lock:
            self._refill()
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False

    def charge(self) -> float:
        """Spend a token, into debt if need be: the seconds until the debt is paid (0: none)."""
        with self._lock:
            self._refill()
            self._tokens -= 1
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate.per_s


class SampledLog:
    """Warnings at most once every ``every_s`` per event; each line counts the ones it hides.

    A line carries ``suppressed``: how many of the same event were not logged since the
    previous line; :meth:`flush` logs what is still untold (when a connection ends).
    """

    def __init__(
        self,
        every_s: float,
        clock: Clock = time.monotonic,
        logger: Any = None,
        **context: Any,
    ) -> None:
        self.every_s = every_s
        self._clock = clock
        self._logger = _log if logger is None else logger
        self._context = context
        self._last: dict[str, float] = {}
        self._hidden: dict[str, int] = {}

    def warning(self, event: str, **fields: Any) -> bool:
        """Log ``event`` unless one was logged less than ``every_s`` ago; True if logged."""
        now = self._clock()
        last = self._last.get(event)
        if last is not None and now - last < self.every_s:
            self._hidden[event] = self._hidden.get(event, 0) + 1
            return False
        self._last[event] = now
        hidden = self._hidden.pop(event, 0)
        self._logger.warning(event, **self._context, **fields, suppressed=hidden)
        return True

    def flush(self) -> None:
        """Log one line per event with hidden occurrences still untold."""
        for event, hidden in self._hidden.items():
            self._logger.warning(event, **self._context, suppressed=hidden, final=True)
        self._hidden.clear()


_unsendable = SampledLog(1.0)


class ClientGuard:
    """One connection's buckets and its sampled refusal log."""

    def __init__(
        self,
        limits: SessionLimits,
        peer: str,
        rated: Mapping[str, str],
        clock: Clock = time.monotonic,
    ) -> None:
        self.limits = limits
        self.peer = peer
        self._rated = {
            kind: TokenBucket(getattr(limits, bucket), clock) for kind, bucket in rated.items()
        }
        self._names = dict(rated)
        self._messages = TokenBucket(limits.messages, clock)
        self._refusals = TokenBucket(limits.refusals, clock)
        self.log = SampledLog(limits.log_every_s, clock, client=peer)
        self.refused = 0
        """Messages refused on this connection so far."""

    def admit(self, kind: str) -> None:
        """Spend a token of ``kind``'s rate (if it has one), else :class:`Refused`."""
        bucket = self._rated.get(kind)
        if bucket is not None and not bucket.take():
            raise Refused(
                "rate_limited",
                f"{kind} messages are limited to {bucket.rate} per connection "
                f"(SessionLimits.{self._names[kind]})",
            )

    def paced(self, refused: bool) -> float:
        """After a message: the seconds to wait before reading the next (0: at once)."""
        wait = self._messages.charge()
        if refused:
            self.refused += 1
            wait = max(wait, self._refusals.charge())
        return wait

    def allows(self, kind: str) -> bool:
        """Spend a token of ``kind``'s rate if there is one (no refusal: the caller waits)."""
        bucket = self._rated.get(kind)
        return bucket is None or bucket.take()

    def refusal(self, code: str, error: str) -> None:
        """Log a refused message (sampled)."""
        self.log.warning("web_message_refused", code=code, error=error[:200])
