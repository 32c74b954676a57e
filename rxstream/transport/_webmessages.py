"""What a page of the web session may send, and the answer to each message.

:class:`PageMessages` is the control half of the page protocol (``_pageprotocol.py``):
``receive`` checks one text message (size, JSON within :class:`SessionLimits`, a known type,
the connection's rate) and hands it to its handler ``_on_<type>(page, message)``, which
returns the ack's fields or raises :class:`Refused`; a refusal or a handler's own failure is
answered with an ``error`` message on that page's link, never fatal.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from rxstream._exceptions import DocValidationError
from rxstream.timing import ClientTiming, TimingRecord
from rxstream.timing._client import ClockOffset
from rxstream.topology import SampleRefused
from rxstream.transport._base import Session
from rxstream.transport._guard import Refused as _Refused
from rxstream.transport._guard import SessionLimits, TokenBucket, parse_message, shown, wire
from rxstream.transport._page import Page
from rxstream.transport._photon import MAX_HOP_MS, PhotonJoin, Shown

__all__ = [
    "AT_MS_WINDOW_MS",
    "CLOCK_JUMPS",
    "MAX_ERROR_CHARS",
    "MAX_PAGE_CLOCK_MS",
    "MAX_RTT_MS",
    "MESSAGE_TYPES",
    "RATED",
    "PageMessages",
]

MESSAGE_TYPES = (
    "hello",
    "input",
    "set",
    "steer",
    "keyframe",
    "pong",
    "shown",
    "got",
    "rtc-offer",
)
"""The message types a page may send. A new type: a handler ``_on_<type>(page, message)``
(a ``-`` in the type is ``_`` in the name)
returning the ack's fields (or raising ``_Refused``), listed here (``PageMessages.handlers``
follows it), and in ``RATED`` if it needs a rate of its own."""

RATED = {
    "steer": "steers",
    "set": "sets",
    "input": "inputs",
    "keyframe": "keyframes",
    "shown": "reports",
    "pong": "reports",
    "got": "acks",
    "rtc-offer": "offers",
}
"""Message types with a rate of their own (a :class:`SessionLimits` field)."""

MAX_ERROR_CHARS = 500
"""The longest ``error`` text a reply carries: values are quoted cut short (``shown``), and a
refusal's text from further down is cut here, so an error costs about what its message did."""

AT_MS_WINDOW_MS = 600_000.0
"""An ``input``'s ``at_ms`` (the page's ``Date.now()``) must be within 10 minutes of the
server's wall clock."""

MAX_RTT_MS = 10_000.0
"""A ``pong`` whose round trip was longer sets no clock (it would loosen every bound): it is
acked, not used, counted in ``Page.pongs_unused``."""

MAX_PAGE_CLOCK_MS = 2.0**53
"""A page clock (``performance.now()``) is in 0..2^53 ms."""

CLOCK_JUMPS = 3
"""Contradicting ``pong``s in a row, agreeing with each other, after which a page's clock
estimate starts over (a clock that jumped)."""

_CLOCK_SLACK_MS = 1.0
"""Rounding; a page's clock step (``Page.clock_step``, twice) is allowed on top of it."""

_FRAME_SLACK_MS = 20.0
"""A presentation may be stamped up to about a display frame ahead (a vsync time)."""

_VIDEO_PATHS = ("webcodecs", "jpeg", "mse", "raw")


Handler = Callable[[Page, dict[str, Any]], dict[str, Any]]
"""A message type's handler: the page and the message in, the ack's fields out."""


class PageMessages:
    """The handlers of a page's messages, over what they read and call.

    ``session`` gives the open session (its streams, inputs and docs); ``photon`` joins the
    ``shown`` reports; ``joined`` hears each joined record; ``keyframe(stream)`` asks the
    stream's shared h264 encoder for an IDR (within its budget); ``acked(page, stream, seq)``
    hears a ``got``.
    """

    def __init__(
        self,
        *,
        session: Callable[[], Session],
        limits: SessionLimits,
        max_message_bytes: int,
        photon: PhotonJoin,
        joined: Callable[[TimingRecord, ClientTiming, int], None],
        keyframe: Callable[[str], None],
        acked: Callable[[Page, str, int], None],
    ) -> None:
        self.session = session
        self.limits = limits
        self.max_message_bytes = max_message_bytes
        self.photon = photon
        self._joined = joined
        self._keyframe = keyframe
        self._acked = acked
        self.rtc: Callable[[Page, str], None] | None = None
        """Answers a page's ``rtc-offer`` SDP (the WebRTC wire, ``_rtcwire.py``); None: this
        server has none, an offer is refused."""
        self.doc_writes = TokenBucket(limits.doc_writes)
        """``set`` and ``steer`` of all pages together (SessionLimits.doc_writes)."""
        self.handlers: dict[str, Handler] = {
            kind: getattr(self, f"_on_{kind.replace('-', '_')}") for kind in MESSAGE_TYPES
        }
        """The message types a page may send, each to its handler."""

    def receive(self, client: Page, text: str) -> bool:
        """Answer one text message: an ack (when it has an ``id``) or an error. True: refused."""
        ident: Any = None
        kind: Any = None
        try:
            size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
            if size > self.max_message_bytes:
                raise _Refused(
                    "oversized",
                    f"a message must be at most {self.max_message_bytes} bytes, got {size}",
                )
            message = parse_message(text, self.limits)
            if not isinstance(message, dict):
                raise _Refused(
                    "malformed", f"a message must be a JSON object, got {shown(message)}"
                )
            ident = message.get("id")
            kind = message.get("type")
            handler = self.handlers.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise _Refused(
                    "unknown_type",
                    f"type must be one of {', '.join(self.handlers)}, got {shown(kind)}",
                )
            client.guard.admit(kind)
            reply = handler(client, message)
            if ident is not None:
                client.push_text(wire({"type": "ack", "id": ident, **reply}), "ack", ident)
        except _Refused as refused:
            ident = ident if refused.ident is None else refused.ident
            self.error(client, ident, refused.code, str(refused))
            return True
        except Exception as exc:  # a handler's own bug: answered, logged, never fatal
            client.guard.log.warning("web_handler_failed", type=shown(kind), exc_info=True)
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            self.error(client, ident, "internal", f"{shown(kind)} failed: {detail}")
            return True
        return False

    def _on_hello(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        accept = message.get("accept", [])
        if not isinstance(accept, list) or not all(isinstance(c, str) for c in accept):
            raise _Refused(
                "malformed", f"hello.accept must be a list of codec names, got {shown(accept)}"
            )
        client.accept = frozenset(accept) | {"jpeg"}
        return {}

    def _on_input(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        stream = message.get("stream")
        if not isinstance(stream, str):
            raise _Refused("malformed", f"input.stream must be a string, got {shown(stream)}")
        if "sample" not in message:
            raise _Refused("malformed", "input.sample is missing")
        at_ms = message.get("at_ms")
        if at_ms is not None and (isinstance(at_ms, bool) or not isinstance(at_ms, int | float)):
            raise _Refused(
                "malformed", f"input.at_ms must be a number of ms or null, got {shown(at_ms)}"
            )
        ignored = None
        if at_ms is not None and not abs(at_ms - time.time() * 1e3) <= AT_MS_WINDOW_MS:
            # a page whose clock is off (or lies) keeps its input: the sample is fed with its
            # receive time, and the ack says why the page's time was left out
            ignored = (
                f"input.at_ms must be the page's wall clock (Date.now()) within "
                f"±{AT_MS_WINDOW_MS:g} ms of the server's, got {shown(at_ms)}: the receive "
                "time is used"
            )
            at_ms = None
        if stream not in self.session().inputs:
            raise _Refused(
                "unknown_stream",
                f"input.stream must be one of {', '.join(self.session().inputs) or 'none'}, "
                f"got {shown(stream)}",
            )
        sample = message["sample"]
        if isinstance(sample, list):
            sample = tuple(sample)
        try:
            seq = self.session().feed(stream, sample, at_ms, client=client)
        except SampleRefused as exc:
            raise _Refused(exc.code, str(exc)) from exc
        return {"input_seq": seq} if ignored is None else {"input_seq": seq, "at_ms": ignored}

    def _on_set(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        return self._write_doc(message, steer=False)

    def _on_steer(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        return self._write_doc(message, steer=True)

    def _write_doc(self, message: dict[str, Any], *, steer: bool) -> dict[str, Any]:
        doc, changes = self._write_target(message)
        if not self.doc_writes.take():
            raise _Refused(
                "rate_limited",
                f"{message['type']} messages of all connections together are limited to "
                f"{self.doc_writes.rate} (SessionLimits.doc_writes)",
            )
        try:
            return {"version": doc.steer(changes) if steer else doc.set(changes)}
        except DocValidationError as exc:
            raise _Refused("schema", str(exc)) from exc

    def _write_target(self, message: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        kind = message["type"]
        name = message.get("doc", "control")
        doc = self.session().docs.get(name) if isinstance(name, str) else None
        if doc is None:
            raise _Refused(
                "unknown_doc",
                f"{kind}.doc must be one of {', '.join(self.session().docs) or 'none'}, "
                f"got {shown(name)}",
            )
        changes = message.get("changes")
        if not isinstance(changes, dict):
            raise _Refused(
                "malformed", f"{kind}.changes must be a JSON object, got {shown(changes)}"
            )
        return doc, changes

    def error(self, client: Page, ident: Any, code: str, error: str) -> None:
        if len(error) > MAX_ERROR_CHARS:  # a refusal from below (a doc, a stream) may quote more
            tail = f"… ({len(error)} characters)"
            error = error[: MAX_ERROR_CHARS - len(tail)] + tail
        client.guard.refusal(code, error)
        message = {"type": "error", "id": ident, "code": code, "error": error}
        client.push_text(wire(message), "error", ident)

    def _on_keyframe(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        stream = self._stream_of(message)
        client.live.discard(stream)  # no delta frame until the keyframe
        self._keyframe(stream)
        return {}

    def _on_rtc_offer(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        sdp = message.get("sdp")
        if not isinstance(sdp, str) or not sdp.startswith("v=0"):
            raise _Refused(
                "malformed",
                f"rtc-offer.sdp must be an SDP offer (text starting with v=0), got {shown(sdp)}",
            )
        if "m=application" not in sdp:
            raise _Refused(
                "malformed",
                f"rtc-offer.sdp must offer data channels (an m=application line), got {shown(sdp)}",
            )
        if self.rtc is None:
            raise _Refused(
                "unavailable",
                "rtc-offer needs the WebRTC wire (pip install 'rxstream[webrtc]'), which this "
                "server does not have: the page stays on its WebSocket",
            )
        self.rtc(client, sdp)
        return {}

    def _on_got(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        stream = self._stream_of(message)
        seq = _count(message, "seq")
        page = _number(message, "t")
        if not 0 <= page <= MAX_PAGE_CLOCK_MS:
            raise _Refused(
                "implausible",
                f"got.t must be a page clock (performance.now()) in 0..2^53 ms, got {shown(page)}",
            )
        self._acked(client, stream, seq)
        return {}

    def _on_pong(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        sent = _number(message, "t")
        if sent not in client.pings:
            raise _Refused("malformed", f"pong.t must be the t of a recent ping, got {shown(sent)}")
        client.pings.remove(sent)
        received = time.monotonic() * 1e3
        page = _number(message, "c")
        if not 0 <= page <= MAX_PAGE_CLOCK_MS:
            raise _Refused(
                "implausible",
                f"pong.c must be a page clock (performance.now()) in 0..2^53 ms, got {shown(page)}",
            )
        client.saw_clock(page)
        if received - sent > MAX_RTT_MS:
            client.pongs_unused += 1
            return {
                "clock": f"pong.t: a round trip must be at most {MAX_RTT_MS:g} ms to set the "
                f"clock, got {received - sent:.0f} ms: not used"
            }
        offset, rtt = client.clock.offset_ms, client.clock.rtt_ms
        if offset is not None and rtt is not None:
            # the true offset lies within half a round trip (and the page clock's step) of
            # each exchange's: two that cannot both hold contradict each other. Not used,
            # counted; CLOCK_JUMPS in a row that agree with each other are a clock that
            # jumped: the estimate starts over (a coarse clock's scatter never agrees)
            step = 2 * client.clock_step + _CLOCK_SLACK_MS
            new = page - (sent + received) / 2
            bound = (rtt + received - sent) / 2 + step
            if abs(new - offset) > bound:
                jumps = client.clock_jumps = [*client.clock_jumps, (new, received - sent)]
                del jumps[:-CLOCK_JUMPS]
                news = [n for n, _ in jumps]
                spread = max(news) - min(news) - max(r for _, r in jumps)
                if len(jumps) < CLOCK_JUMPS or spread > step:
                    if len(jumps) == CLOCK_JUMPS:  # scatter, not a jump: allow for it
                        client.clock_scatter = max(client.clock_scatter, spread)
                    client.pongs_unused += 1
                    return {
                        "clock": f"pong.c contradicts the round trip: it puts the page's clock "
                        f"{new - offset:+.1f} ms from the estimate, more than the {bound:.1f} "
                        "ms the round trips allow: not used"
                    }
                client.clock = ClockOffset()
        client.clock_jumps = []
        client.clock.add(sent, page, received)
        return {}

    def _on_shown(self, client: Page, message: dict[str, Any]) -> dict[str, Any]:
        stream = self._stream_of(message)
        arrived, decoded, presented = (
            _number(message, name) for name in ("arrived", "decoded", "presented")
        )
        if not arrived <= decoded <= presented:
            raise _Refused(
                "malformed",
                f"shown times must be in order arrived <= decoded <= presented, got "
                f"{arrived}, {decoded}, {presented}",
            )
        too_long = self._check_shown(
            client, stream, _count(message, "seq"), arrived, decoded, presented
        )
        if too_long is not None:  # a background tab's queued frame: true, but no latency to join
            self.photon.count_implausible()
            return {"shown": too_long}
        event = None if message.get("event") is None else _number(message, "event")
        note: dict[str, Any] = {}
        if event is not None and event > arrived:
            raise _Refused(
                "implausible",
                f"shown.event must not be after the frame arrived, got {event - arrived:+.1f} ms "
                "from arrived",
            )
        if event is not None and event < arrived - MAX_HOP_MS:  # the pointer sat still
            note["event"] = (
                f"shown.event is {arrived - event:.0f} ms before the frame arrived, more than "
                f"{MAX_HOP_MS:g} ms: not this frame's input event, the join starts at its origin"
            )
            event = None
        video = message.get("video", "")
        if video not in _VIDEO_PATHS:
            raise _Refused(
                "malformed",
                f"shown.video must be one of {', '.join(_VIDEO_PATHS)}, got {shown(video)}",
            )
        report = Shown(
            stream=stream,
            seq=_count(message, "seq"),
            input_seq=_count(message, "input_seq"),
            arrived=arrived,
            decoded=decoded,
            presented=presented,
            event=event,
            video=video,
        )
        joined = self.photon.shown(report, client.clock, client.number)
        if joined is not None:
            self._joined(*joined, client.number)
        return note

    def _check_shown(
        self, client: Page, stream: str, seq: int, arrived: float, decoded: float, shown_: float
    ) -> str | None:
        """Refuse a report whose times cannot be this frame's: on the server's clock (through
        the page's offset, good to a round trip), an arrival before the frame was made or a
        presentation after now. A hop over MAX_HOP_MS (a background tab's queued frame) is
        not refused: the note saying why the report joins nothing."""
        offset, rtt = client.clock.offset_ms, client.clock.rtt_ms
        if offset is not None and rtt is not None:
            slack = rtt + 2 * client.clock_step + _CLOCK_SLACK_MS
            late = shown_ - offset - time.monotonic() * 1e3
            if late > slack + _FRAME_SLACK_MS:
                raise _Refused(
                    "implausible",
                    f"shown.presented must not be after now on the server's clock, got "
                    f"{late:.1f} ms after it (through the page's clock offset, good to "
                    f"{slack + _FRAME_SLACK_MS:.1f} ms)",
                )
            origin = self.photon.origin_ms(stream, seq)
            if origin is not None and arrived - offset < origin - slack:
                raise _Refused(
                    "implausible",
                    f"shown.arrived must be after frame {seq} was made on the server's clock, "
                    f"got {origin - (arrived - offset):.1f} ms before it (through the page's "
                    f"clock offset, good to {slack:.1f} ms)",
                )
        for name, hop in (("decoded", decoded - arrived), ("presented", shown_ - decoded)):
            if hop > MAX_HOP_MS:
                return (
                    f"shown.{name} is {hop:.1f} ms after the time before it, more than "
                    f"{MAX_HOP_MS:g} ms: not joined (counted in PhotonJoin.implausible)"
                )
        return None

    def _stream_of(self, message: dict[str, Any]) -> str:
        stream = message.get("stream")
        if not isinstance(stream, str) or stream not in self.session().streams:
            raise _Refused(
                "unknown_stream",
                f"{message['type']}.stream must be one of "
                f"{', '.join(self.session().streams) or 'none'}, got {shown(stream)}",
            )
        return stream


def _number(message: dict[str, Any], name: str) -> float:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Refused(
            "malformed", f"{message['type']}.{name} must be a finite number, got {shown(value)}"
        )
    return float(value)


def _count(message: dict[str, Any], name: str) -> int:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Refused(
            "malformed", f"{message['type']}.{name} must be an int >= 0, got {shown(value)}"
        )
    return value
