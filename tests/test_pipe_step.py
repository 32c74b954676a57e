"""The pipe step is written twice for speed: a pipe behind its own port (operators/_pipe.py)
and the fused chain a drive runs consecutive pipes as (runtime/_fuse.py). Every branch of the
step (admission: stale, cutover, a newer flush and its reset; a function that raises, steers,
flushes or sets the metadata itself) gives the same outputs and the same books both ways."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rxstream
from rxstream.item import PipelineItem, PipelineMetadata
from rxstream.runtime import _run
from rxstream.runtime._driven import DrivenRun
from rxstream.runtime._fuse import fused_chain

MEMBERS = 3
ACTIONS = ("raise", "steer", "steer_keep", "flush", "item")

arrival = st.tuples(
    st.integers(0, 2),  # prompt_generation
    st.booleans(),  # cutover
    st.integers(0, 3),  # flush_generation
)
plan = st.tuples(
    st.lists(arrival, min_size=1, max_size=12),
    # per member: the payloads at which its function does something besides adding one
    st.lists(
        st.dictionaries(st.integers(0, 14), st.sampled_from(ACTIONS), max_size=4),
        min_size=MEMBERS,
        max_size=MEMBERS,
    ),
    st.booleans(),  # steer once before the run (drop = 1: generation 0 is stale)
)


class Member:
    """A member's function: ``x + 1``, and at some payloads an action first; ``reset()``
    logged."""

    def __init__(self, ctx: rxstream.Context, index: int, actions: dict[int, str]) -> None:
        self.ctx, self.index, self.actions = ctx, index, actions
        self.log: list[Any] = []

    def __call__(self, x: int) -> Any:
        self.log.append(x)
        action = self.actions.get(x)
        generations = self.ctx.generations
        if action == "raise":
            raise ValueError(f"member {self.index} refuses {x}")
        if action == "steer":
            generations.steer()
        elif action == "steer_keep":
            generations.steer(drop_stale=False)
        elif action == "flush":
            generations.bump_flush()
        elif action == "item":  # the function sets the metadata itself: a fresh cutover
            return PipelineItem(
                x + 1,
                PipelineMetadata(
                    prompt_generation=generations.prompt,
                    flush_generation=generations.flush,
                    cutover=True,
                ),
            )
        return x + 1

    def reset(self) -> None:
        self.log.append("reset")


def _outcome(fused: bool, arrivals: list[Any], actions: list[Any], steered: bool) -> Any:
    """What a drive of ``source | m0 | m1 | m2 | out`` gives: outputs, books, members' logs."""
    ctx = rxstream.Context(transport=rxstream.transport.MemoryTransport())
    if steered:
        ctx.generations.steer()
    members = [Member(ctx, i, actions[i]) for i in range(MEMBERS)]

    def items() -> Iterator[PipelineItem]:
        for payload, (prompt, cutover, flush) in enumerate(arrivals):
            yield PipelineItem(
                payload,
                PipelineMetadata(prompt_generation=prompt, cutover=cutover, flush_generation=flush),
            )

    pipeline: Any = ctx.source(items, name="src")
    for i, member in enumerate(members):
        pipeline = pipeline | ctx.pipe(member, name=f"m{i}", on_error="skip")
    pipeline = pipeline | ctx.stream("out")
    made: list[object] = []

    def counted(*args: Any) -> Any:
        made.append(args)
        return fused_chain(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_run, "fused_chain", counted)
        if not fused:
            patch.setattr(DrivenRun, "_chains", lambda self: {})
        out = pipeline.drive(len(arrivals))
    assert len(made) == (1 if fused else 0)  # the path under test ran
    stats = pipeline.statistics()
    books = {
        name: (s.items_in, s.items_out, dict(s.dropped), s.cutovers)
        for name, s in stats.items()
        if name.startswith("m")
    }
    return out, books, [member.log for member in members]


@settings(max_examples=150, deadline=None)
@given(plan)
def test_the_fused_chain_and_the_pipe_agree_on_every_branch(case: Any) -> None:
    """Outputs, each member's books (in, out, drops by reason, cutovers) and what each
    member's function saw and when it reset: the same fused and unfused."""
    arrivals, actions, steered = case
    assert _outcome(True, arrivals, actions, steered) == _outcome(False, arrivals, actions, steered)


@pytest.mark.parametrize("fused", [True, False])
def test_a_steer_inside_a_member_drops_the_item_at_the_next(fused: bool) -> None:
    """A pinned branch: m0 steers at payload 0, so that item is stale at m1 and the next
    (generation 0 too) at m0 (both paths)."""
    out, books, logs = _outcome(fused, [(0, False, 0)] * 2, [{0: "steer"}, {}, {}], False)
    assert out == []
    assert (books["m0"][2], books["m1"][2]) == ({"stale": 1}, {"stale": 1})
    assert logs == [[0], [], []]
