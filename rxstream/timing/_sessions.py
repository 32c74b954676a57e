"""The sessions of a timing log written by ``rxstream serve``: each line carries ``session``
(its id), each session's records one run of their own (``rxstream timing --session ID``)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["session_runs"]


def session_runs(path: str | Path) -> dict[str, list[str]]:
    """Each session of the log at ``path`` (by id, in the order first seen) and the runs its
    timing records ran under (in order; a self test's left out)."""
    sessions: dict[str, list[str]] = {}
    with Path(path).open(encoding="utf-8") as lines:
        for line in lines:
            if '"session"' not in line:
                continue
            try:
                flat = json.loads(line)
            except ValueError:
                continue
            session = flat.get("session") if isinstance(flat, dict) else None
            if not isinstance(session, str):
                continue
            runs = sessions.setdefault(session, [])
            event, run = flat.get("event"), flat.get("run")
            timing = isinstance(event, str) and event.startswith("[timing:")
            if timing and not flat.get("self_test") and isinstance(run, str) and run not in runs:
                runs.append(run)
    return sessions
