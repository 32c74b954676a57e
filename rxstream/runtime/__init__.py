"""The runtime: stage threads and bounded inboxes, the virtual clock, the stage shell, runs.

Public here: an inbox's declaration (:class:`InboxSpec`) and a stage's statistics
(:class:`StageStatistics`, :func:`format_statistics`), all also exported by ``rxstream``. The
rest (``StageThread``, ``VirtualClock``, the stage shell, the runs: ``Run``, ``Port``,
``ThreadedRun``, ``DrivenRun``) is the engine's own and may change without notice;
docs/decisions.md says why.
"""

from rxstream._kernel._inbox import InboxSpec
from rxstream._kernel._stats import StageStatistics, format_statistics
from rxstream._util import fixup_module_metadata

__all__ = ["InboxSpec", "StageStatistics", "format_statistics"]

fixup_module_metadata(__name__, globals())
