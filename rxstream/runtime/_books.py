"""The books of a run: every item a stage was handed is passed on, dropped with a reason, or
still waiting.

For a stage, what *arrived* is the sum of what each of its inputs emitted (every consumer of
a stage gets each of its items), and what it *took* is what arrived less what it dropped
(any reason: at its inbox, stale, ``error``, ``stopped``…) less what waits in its inbox.
Then, by the shape its kind declares (``StageKind.shape``, ``fan_in`` with several inputs;
``rxstream/_kernel/_kind.py``):

- a source: each pull that made an item emits it or, when a stopping run's ring to another
  process refused it, drops it (``items_in == items_out + dropped``); a pull that raised
  under ``on_error="skip"`` made none (``failed_pulls``, not a drop);
- an input: what ``feed`` accepted is what the stage pulled, plus what the full queue dropped
  (``latest``), plus what still waits; refused samples (``invalid``, ``limit``) were never
  accepted;
- ``1:1`` (``pipe`` and ``tap`` with one input, ``merge``, ``stream``): it emits exactly
  what it took (``took == items_out``);
- ``N:1`` (``window``, ``zip``, ``combine``, a fan-in ``pipe``): each output is at least one
  item it took (``items_out <= took``);
- ``repeats`` (``pace``): each item it took goes out once, and a tick with nothing new
  repeats the last (``items_out >= took``);
- ``1:N`` and ``free`` (``unbatch``, ``rx``, ``bind``, ``walks``), and stages fed through a
  chunk policy (theirs, or an input's own ``chunks=``): never more dropped than arrived
  (``took >= 0``).

A stage that says it holds items (``StageCounters.held``) must be of a kind that declares
``holds=True`` (an idle run waits for what it holds).

Checked by the test suite after every threaded test (``tests/conftest.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rxstream._kernel._options import chunks_of
from rxstream.operators._input import InputFeed

if TYPE_CHECKING:
    from rxstream.runtime._threaded import ThreadedRun

__all__ = ["settled", "unbalanced"]

_FED = ("invalid", "limit", "latest")
"""An input's drops before a pull: refused by ``feed``, or dropped from its full queue."""


def settled(run: ThreadedRun) -> bool:
    """Whether every thread of ``run`` has ended (its books no longer move)."""
    sources = run._source_threads.values()  # the books read the run they check
    return not any(thread.is_alive() for thread in sources) and all(
        thread.join(0) for thread in run.threads.values()
    )


def unbalanced(run: ThreadedRun) -> list[str]:
    """Each law of the module docstring that ``run``'s statistics break, in words."""
    plan = run.plan
    stats = run.statistics()
    local = set(run.local)
    problems = []
    for node in run.local:
        name = plan.name_of(node)
        s = stats[name]
        kind = s.kind
        if node.stage.is_source:
            # an input's refusals and queue drops come before its pulls
            lost = s.dropped_total - sum(s.dropped.get(reason, 0) for reason in _FED)
            if s.items_in != s.items_out + lost:
                problems.append(
                    f"source {name!r} pulled {s.items_in} but emitted {s.items_out} and "
                    f"dropped {lost}"
                )
            feed = node.stage.source
            if isinstance(feed, InputFeed):
                kept = s.items_in + s.dropped.get("latest", 0) + feed.depth
                if feed.accepted != kept:
                    problems.append(
                        f"input {name!r} accepted {feed.accepted} samples but pulled "
                        f"{s.items_in}, dropped {s.dropped.get('latest', 0)} (latest) and "
                        f"holds {feed.depth}"
                    )
            continue
        if any(up not in local for up in node.inputs):
            continue  # what arrived from another process is counted there
        arrived = sum(stats[plan.name_of(up)].items_out for up in node.inputs)
        took = arrived - s.dropped_total - s.inbox_depth
        books = (
            f"{kind} {name!r}: arrived {arrived}, dropped {dict(s.dropped)}, waiting "
            f"{s.inbox_depth}, took {took}, emitted {s.items_out}"
        )
        if run.shells[node].counters.held and not node.stage.declared.holds:
            problems.append(
                f"{books}: it holds {run.shells[node].counters.held} items, and its kind does "
                f"not declare holds=True"
            )
        if took < 0:
            problems.append(f"{books}: more dropped than arrived")
        elif chunks_of(node.stage) is not None or any(
            up.stage.is_source and chunks_of(up.stage) is not None for up in node.inputs
        ):
            continue  # it takes chunks of what arrived
        shape = node.stage.declared.shape_with(len(node.inputs))
        if shape == "1:1" and took != s.items_out:
            problems.append(f"{books}: a 1:1 stage emits what it took")
        elif shape == "N:1" and s.items_out > took:
            problems.append(f"{books}: an N:1 stage emits at most what it took")
        elif shape == "repeats" and s.items_out < took:
            problems.append(f"{books}: a repeating stage emits every item it took")
    return problems
