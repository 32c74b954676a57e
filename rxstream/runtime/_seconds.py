"""A number of seconds an environment variable sets (``RXSTREAM_HEARTBEAT_S``,
``RXSTREAM_BUSY_S``): one rule and one message for every such setting."""

from __future__ import annotations

import math
import os
from typing import TypeVar

from rxstream._exceptions import ArgumentError

__all__ = ["seconds_from_env"]

_T = TypeVar("_T")


def seconds_from_env(name: str, default: _T) -> float | _T:
    """The seconds the environment variable ``name`` gives, ``default`` when it is unset or
    blank; anything but a finite number > 0 is an :class:`~rxstream.ArgumentError` naming the
    variable, the rule and the text."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ArgumentError(f"{name} must be a number of seconds > 0, got {text!r}")
    return value
