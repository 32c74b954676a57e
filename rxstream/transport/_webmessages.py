"""What a page of the web session may send, and the answer to each message.

:class:`PageMessages` is the control half of :class:`~rxstream.transport._web.WebTransport`:
``_receive`` checks one text message (size, JSON within :class:`SessionLimits`, a known type,
the connection's rate) and hands it to its handler ``_on_<type>(client, message)``, which
returns the ack's fields or raises :class:`Refused`; a refusal or a handler's own failure is
answered with an ``error`` message on that socket, never fatal.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from rxstream._exceptions import DocValidationError
from rxstream.timing import ClientTiming, TimingRecord
from rxstream.topology import SampleRefused
from rxstream.transport._base import Session
from rxstream.transport._codecs import Encoder, H264Fragments
from rxstream.transport._guard import Refused as _Refused
from rxstream.transport._guard import SessionLimits, TokenBucket, parse_message, shown, wire
from rxstream.transport._photon import PhotonJoin, Shown
from rxstream.transport._webclient import Client

__all__ = ["MAX_ERROR_CHARS", "MESSAGE_TYPES", "RATED", "PageMessages"]

MESSAGE_TYPES = ("hello", "input", "set", "steer", "keyframe", "pong", "shown")
"""The message types a page may send. A new type: a handler ``_on_<type>(client, message)``
returning the ack's fields (or raising ``_Refused``), listed here and in
``WebTransport._handlers``, and in ``RATED`` if it needs a rate of its own."""

RATED = {
    "steer": "steers",
    "set": "sets",
    "input": "inputs",
    "keyframe": "keyframes",
    "shown": "reports",
    "pong": "reports",
}
"""Message types with a rate of their own (a :class:`SessionLimits` field)."""

MAX_ERROR_CHARS = 500
"""The longest ``error`` text a reply carries: values are quoted cut short (``shown``), and a
refusal's text from further down is cut here, so an error costs about what its message did."""

_VIDEO_PATHS = ("webcodecs", "jpeg", "mse", "raw")


class PageMessages:
    """The handlers of a page's messages, mixed into ``WebTransport``: the state they read."""

    _session: Session
    _shared: dict[tuple[str, str], Encoder]
    _photon: PhotonJoin
    _handlers: dict[str, Callable[[Client, dict[str, Any]], dict[str, Any]]]
    _photon_joined: Callable[[TimingRecord, ClientTiming, int], None]
    _doc_writes: TokenBucket
    _request_keyframe: Callable[[str, H264Fragments], bool]
    limits: SessionLimits
    max_message_bytes: int

    def _receive(self, client: Client, text: str) -> bool:
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
            handler = self._handlers.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise _Refused(
                    "unknown_type",
                    f"type must be one of {', '.join(self._handlers)}, got {shown(kind)}",
                )
            client.guard.admit(kind)
            reply = handler(client, message)
            if ident is not None:
                client.push_text(wire({"type": "ack", "id": ident, **reply}), "ack", ident)
        except _Refused as refused:
            ident = ident if refused.ident is None else refused.ident
            self._error(client, ident, refused.code, str(refused))
            return True
        except Exception as exc:  # a handler's own bug: answered, logged, never fatal
            client.guard.log.warning("web_handler_failed", type=shown(kind), exc_info=True)
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            self._error(client, ident, "internal", f"{shown(kind)} failed: {detail}")
            return True
        return False

    def _on_hello(self, client: Client, message: dict[str, Any]) -> dict[str, Any]:
        accept = message.get("accept", [])
        if not isinstance(accept, list) or not all(isinstance(c, str) for c in accept):
            raise _Refused(
                "malformed", f"hello.accept must be a list of codec names, got {shown(accept)}"
            )
        client.accept = frozenset(accept) | {"jpeg"}
        return {}

    def _on_input(self, client: Client, message: dict[str, Any]) -> dict[str, Any]:
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
        if stream not in self._session.inputs:
            raise _Refused(
                "unknown_stream",
                f"input.stream must be one of {', '.join(self._session.inputs) or 'none'}, "
                f"got {shown(stream)}",
            )
        sample = message["sample"]
        if isinstance(sample, list):
            sample = tuple(sample)
        try:
            seq = self._session.feed(stream, sample, at_ms, client=client)
        except SampleRefused as exc:
            raise _Refused(exc.code, str(exc)) from exc
        return {"input_seq": seq}

    def _on_set(self, client: Client, message: dict[str, Any]) -> dict[str, Any]:
        return self._write_doc(message, steer=False)

    def _on_steer(self, client: Client, message: dict[str, Any]) -> dict[str, Any]:
        return self._write_doc(message, steer=True)

    def _write_doc(self, message: dict[str, Any], *, steer: bool) -> dict[str, Any]:
        doc, changes = self._write_target(message)
        if not self._doc_writes.take():
            raise _Refused(
                "rate_limited",
                f"{message['type']} messages of all connections together are limited to "
                f"{self._doc_writes.rate} (SessionLimits.doc_writes)",
            )
        try:
            return {"version": doc.steer(changes) if steer else doc.set(changes)}
        except DocValidationError as exc:
            raise _Refused("schema", str(exc)) from exc

    def _write_target(self, message: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        kind = message["type"]
        name = message.get("doc", "control")
        doc = self._session.docs.get(name) if isinstance(name, str) else None
        if doc is None:
            raise _Refused(
                "unknown_doc",
                f"{kind}.doc must be one of {', '.join(self._session.docs) or 'none'}, "
                f"got {shown(name)}",
            )
        changes = message.get("changes")
        if not isinstance(changes, dict):
            raise _Refused(
                "malformed", f"{kind}.changes must be a JSON object, got {shown(changes)}"
            )
        return doc, changes

    def _error(self, client: Client, ident: Any, code: str, error: str) -> None:
        if len(error) > MAX_ERROR_CHARS:  # a refusal from below (a doc, a stream) may quote more
            tail = f"… ({len(error)} characters)"
            error = error[: MAX_ERROR_CHARS - len(tail)] + tail
        client.guard.refusal(code, error)
        message = {"type": "error", "id": ident, "code": code, "error": error}
        client.push_text(wire(message), "error", ident)

    def _on_keyframe(self, client: Client, message: dict[str, Any]) -> dict[str, Any]:
        stream = self._stream_of(message)
        client.live.discard(stream)  # no delta frame until the keyframe
        made = self._shared.get((stream, "h264"))
        if isinstance(made, H264Fragments):
            self._request_keyframe(stream, made)
        return {}

    def _on_pong(self, client: Client, message: dict[str, Any]) -> dict[str, Any]:
        sent = _number(message, "t")
        if sent not in client.pings:
            raise _Refused("malformed", f"pong.t must be the t of a recent ping, got {shown(sent)}")
        client.pings.remove(sent)
        client.clock.add(sent, _number(message, "c"), time.monotonic() * 1e3)
        return {}

    def _on_shown(self, client: Client, message: dict[str, Any]) -> dict[str, Any]:
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
            event=None if message.get("event") is None else _number(message, "event"),
            video=video,
        )
        joined = self._photon.shown(report, client.clock, client.number)
        if joined is not None:
            self._photon_joined(*joined, client.number)
        return {}

    def _stream_of(self, message: dict[str, Any]) -> str:
        stream = message.get("stream")
        if not isinstance(stream, str) or stream not in self._session.streams:
            raise _Refused(
                "unknown_stream",
                f"{message['type']}.stream must be one of "
                f"{', '.join(self._session.streams) or 'none'}, got {shown(stream)}",
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
