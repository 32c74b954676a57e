"""The emulated link's SPEC string: what each way of the link does to the packets it carries.

A SPEC is ``clean`` (or empty: nothing done) or comma-separated ``[up:|down:]key=value`` items;
an item without a prefix applies to both ways, ``up:`` to the client's packets towards the
server, ``down:`` to the server's towards the client. The keys:

==========  ==========================================================================
``rtt``     the round trip, split evenly: ``rtt=40ms`` delays each way 20 ms (both ways only)
``delay``   one way's delay: ``up:delay=5ms,down:delay=35ms``
``loss``    the fraction of packets dropped at random (seeded): ``loss=3%``
``rate``    a rate cap: ``rate=250kbit`` (``bit``, ``kbit``, ``mbit``, ``gbit``; 1k = 1000);
            each packet takes size / rate to send, one after the other
``queue``   the drop-tail queue before the cap, as a time (``queue=1s``, the default) or as
            bytes (``queue=64kB``; ``B``, ``kB``, ``MB``): a packet that would wait longer
            is dropped
``blackout``  every packet dropped for a while: ``blackout=500ms/10s`` for 500 ms every 10 s
            (the first 10 s after the spec takes effect), ``blackout=3s`` once, at once
``udp``     ``udp=drop`` drops every UDP packet (TCP passes), ``udp=pass`` (the default)
``seed``    the loss's random seed (both ways only; default 0)
==========  ==========================================================================

Times take ``us``, ``ms`` or ``s``. A SPEC that breaks a rule raises
:class:`rxstream.ArgumentError` with one line naming the item, the rule and the value.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from rxstream import ArgumentError

__all__ = ["LinkSpec", "WaySpec", "parse"]

_TIME = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(us|ms|s)$")
_RATE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(bit|kbit|mbit|gbit)$", re.IGNORECASE)
_BYTES = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(B|kB|KB|MB)$")
_PERCENT = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)%$")
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_BYTE_UNITS = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000_000}
_KEYS = ("rtt", "delay", "loss", "rate", "queue", "blackout", "udp", "seed")
_BOTH_ONLY = ("rtt", "seed")


@dataclass(frozen=True)
class WaySpec:
    """What one way of the link does to its packets."""

    delay_s: float = 0.0
    """The one-way delay added to every packet that gets through."""
    loss: float = 0.0
    """The fraction of packets dropped at random, 0 <= loss < 1."""
    rate_bps: float | None = None
    """The rate cap in bits per second; None: no cap."""
    queue_s: float | None = None
    """The drop-tail queue before the cap as the longest wait (seconds); None when in bytes."""
    queue_bytes: int | None = None
    """The drop-tail queue before the cap in bytes; None when given as a time."""
    blackout_s: float = 0.0
    """How long each blackout drops every packet; 0: none."""
    blackout_every_s: float | None = None
    """The blackouts' period (the first one period after the spec applies); None: once, now."""
    udp_drop: bool = False
    """Drop every UDP packet (TCP and the rest pass)."""

    @property
    def queue_limit_s(self) -> float:
        """The longest a packet may wait before the cap, the queue's bound as a time."""
        if self.queue_bytes is not None and self.rate_bps is not None:
            return self.queue_bytes * 8 / self.rate_bps
        return self.queue_s if self.queue_s is not None else 1.0


@dataclass(frozen=True)
class LinkSpec:
    """Both ways of the link, as a SPEC string gave them."""

    text: str
    """The SPEC as given."""
    up: WaySpec = field(default_factory=WaySpec)
    """The client's packets towards the server."""
    down: WaySpec = field(default_factory=WaySpec)
    """The server's packets towards the client."""
    seed: int = 0
    """The loss's random seed."""

    @property
    def clean(self) -> bool:
        """Nothing done to any packet."""
        return self.up == WaySpec() and self.down == WaySpec()


def _time(item: str, key: str, value: str) -> float:
    match = _TIME.match(value)
    if match is None:
        raise ArgumentError(
            f"net spec item {item!r}: {key} must be a time (40ms, 1s, 500us), got {value!r}"
        )
    return float(match.group(1)) * _TIME_UNITS[match.group(2)]


def _way_fields(item: str, key: str, value: str) -> dict[str, object]:
    if key in ("rtt", "delay"):
        seconds = _time(item, key, value)
        return {"delay_s": seconds / 2 if key == "rtt" else seconds}
    if key == "loss":
        match = _PERCENT.match(value)
        if match is None or not float(match.group(1)) < 100:
            raise ArgumentError(
                f"net spec item {item!r}: loss must be a percentage from 0% to below 100%, got "
                f"{value!r}"
            )
        return {"loss": float(match.group(1)) / 100}
    if key == "rate":
        match = _RATE.match(value)
        if match is None or float(match.group(1)) <= 0:
            raise ArgumentError(
                f"net spec item {item!r}: rate must be above 0 in bit, kbit, mbit or gbit "
                f"(250kbit), got {value!r}"
            )
        return {"rate_bps": float(match.group(1)) * _RATE_UNITS[match.group(2).lower()]}
    if key == "queue":
        bytes_ = _BYTES.match(value)
        if bytes_ is not None:
            size = int(float(bytes_.group(1)) * _BYTE_UNITS[bytes_.group(2)])
            if size < 1:
                raise ArgumentError(
                    f"net spec item {item!r}: queue must hold at least 1 byte, got {value!r}"
                )
            return {"queue_bytes": size}
        if _TIME.match(value) is None:
            raise ArgumentError(
                f"net spec item {item!r}: queue must be a time (1s, 200ms) or bytes (64kB, "
                f"1500B), got {value!r}"
            )
        return {"queue_s": _time(item, key, value)}
    if key == "blackout":
        length, _, every = value.partition("/")
        seconds = _time(item, key, length)
        if seconds <= 0:
            raise ArgumentError(
                f"net spec item {item!r}: blackout must last more than 0, got {value!r}"
            )
        if not every:
            return {"blackout_s": seconds}
        period = _time(item, key, every)
        if period <= seconds:
            raise ArgumentError(
                f"net spec item {item!r}: blackout D/P must have its length D below its period P, "
                f"got {value!r}"
            )
        return {"blackout_s": seconds, "blackout_every_s": period}
    if key == "udp":
        if value not in ("drop", "pass"):
            raise ArgumentError(f"net spec item {item!r}: udp must be drop or pass, got {value!r}")
        return {"udp_drop": value == "drop"}
    raise AssertionError(key)


def parse(text: str) -> LinkSpec:
    """The :class:`LinkSpec` of a SPEC string (see the module's doc); one-line errors."""
    stripped = text.strip()
    if stripped in ("", "clean"):
        return LinkSpec(text=text)
    ways: dict[str, dict[str, object]] = {"up": {}, "down": {}}
    given: dict[tuple[str, str], str] = {}
    seed = 0
    for raw in stripped.split(","):
        item = raw.strip()
        if item == "clean":
            raise ArgumentError(f"net spec {text!r}: clean goes alone (it means no impairment)")
        prefix, colon, rest = item.partition(":")
        sides: tuple[str, ...] = ("up", "down")
        if colon:
            if prefix not in sides:
                raise ArgumentError(
                    f"net spec item {item!r}: the prefix must be up: or down:, got {prefix!r}"
                )
            sides = (prefix,)
        else:
            rest = item
        key, equals, value = rest.partition("=")
        if not equals or not key:
            raise ArgumentError(
                f"net spec item {item!r}: an item must be [up:|down:]key=value, got {item!r}"
            )
        if key not in _KEYS:
            raise ArgumentError(
                f"net spec item {item!r}: the key must be one of {', '.join(_KEYS)}, got {key!r}"
            )
        if key in _BOTH_ONLY and colon:
            hint = " (one way's: up:delay=… or down:delay=…)" if key == "rtt" else ""
            raise ArgumentError(
                f"net spec item {item!r}: {key} goes for both ways, without up:/down:{hint}"
            )
        slot = "delay" if key == "rtt" else key
        for side in sides:
            if (side, slot) in given:
                raise ArgumentError(
                    f"net spec item {item!r}: {slot} of the {side} way is given twice (first by "
                    f"{given[side, slot]!r})"
                )
            given[side, slot] = item
        if key == "seed":
            if not value.isdigit():
                raise ArgumentError(
                    f"net spec item {item!r}: seed must be a whole number >= 0, got {value!r}"
                )
            seed = int(value)
            continue
        update = _way_fields(item, key, value)
        for side in sides:
            ways[side].update(update)
    for side, fields in ways.items():
        if ("queue_s" in fields or "queue_bytes" in fields) and "rate_bps" not in fields:
            raise ArgumentError(
                f"net spec {text!r}: queue goes with rate (the queue is the cap's), the {side} "
                "way has no rate"
            )
    up = dataclasses.replace(WaySpec(), **ways["up"])  # type: ignore[arg-type]
    down = dataclasses.replace(WaySpec(), **ways["down"])  # type: ignore[arg-type]
    return LinkSpec(text=text, up=up, down=down, seed=seed)
