"""The runtime: stage threads and bounded inboxes, the virtual clock, the stage shell, runs."""

from rxstream.runtime._inbox import InboxSpec
from rxstream.runtime._stats import StageStatistics, format_statistics
from rxstream.runtime._thread import StageThread, VirtualClock

__all__ = ["InboxSpec", "StageStatistics", "StageThread", "VirtualClock", "format_statistics"]
