"""The rate controller on a virtual clock: it follows a simulated link down and back up."""

from __future__ import annotations

import random
import re

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from rxstream._exceptions import ArgumentError
from rxstream.transport import H264Fragments, JpegEncoder, RawEncoder
from rxstream.transport._rate import (
    SCALE_UP_AFTER_S,
    SCALES,
    LinkState,
    RateController,
    RateDecision,
    apply_rate,
    jpeg_quality,
    rate_message,
)

MIN_RTT_MS = 40.0
STEP_S = 0.1  # the transport hands over a link state about every 100 ms


class Link:
    """A link of ``capacity_kbps``: what the sender offers beyond it is dropped at the server
    and queues a frame's worth (the round trip rises); what fits is delivered. ``noise``: the
    estimate's own noise, as measured windows have it (the delivery rate up to 12 % under
    what was offered, the round trip up to 80 % of a frame over its minimum: a frame's time
    on the link)."""

    def __init__(self, capacity_kbps: float, noise: random.Random | None = None) -> None:
        self.capacity_kbps = capacity_kbps
        self.now_s = 0.0
        self.noise = noise

    def state(self, offered_kbps: float) -> LinkState:
        self.now_s += STEP_S
        over = offered_kbps > self.capacity_kbps
        delivered = min(offered_kbps, self.capacity_kbps)
        jitter = 2.0
        if self.noise is not None:
            delivered *= self.noise.uniform(0.88, 1.0)
            jitter = self.noise.uniform(0.0, 0.8 * 1000 / 24)
        return LinkState(
            now_s=self.now_s,
            delivery_bps=delivered * 1000,
            rtt_ms=MIN_RTT_MS + (90.0 if over else 0.0) + jitter,
            min_rtt_ms=MIN_RTT_MS,
            inflight_bytes=int(delivered * 1000 / 8 * MIN_RTT_MS / 1000),
            sent_bps=offered_kbps * 1000,
            dropped=2 if over else 0,
        )


def controller(start: float = 1000.0) -> RateController:
    return RateController(start_kbps=start, min_kbps=100, max_kbps=2000, fps=24, stream="video")


def run(rate: RateController, link: Link, seconds: float) -> list[RateDecision]:
    """Step ``link`` for ``seconds`` of virtual time, the sender offering the decided rate."""
    decisions = []
    for _ in range(round(seconds / STEP_S)):
        decision = rate.update(link.state(rate.current.bitrate_kbps))
        if decision is not None:
            decisions.append(decision)
    return decisions


def test_a_link_that_steps_down_is_followed_within_a_few_updates() -> None:
    """After the link's capacity falls below the bitrate, the third update at most offers no
    more than the link carries, cut to a fraction of the measured delivery rate."""
    rate, link = controller(start=2000), Link(5000)
    run(rate, link, 5)
    assert rate.current.bitrate_kbps == 2000
    link.capacity_kbps = 400
    offered = [rate.current.bitrate_kbps]
    for _ in range(3):
        rate.update(link.state(offered[-1]))
        offered.append(rate.current.bitrate_kbps)
    assert offered[-1] <= 400 * 0.9
    assert rate.current.reason == "drops"
    assert rate.changes.down == 1


def test_a_link_that_recovers_is_probed_back_up_to_max() -> None:
    """Once the link has room again, the bitrate climbs step by step back to its ceiling."""
    rate, link = controller(), Link(300)
    run(rate, link, 10)
    assert rate.current.bitrate_kbps <= 300
    link.capacity_kbps = 10_000
    ups = rate.changes.up
    decisions = run(rate, link, 60)
    assert rate.current.bitrate_kbps == 2000
    assert [d.reason for d in decisions] == ["probe"] * len(decisions)
    steps = [d.bitrate_kbps for d in decisions]
    assert steps == sorted(steps)
    assert all(b / a <= 1.2 for a, b in zip([300.0, *steps], steps, strict=False))
    assert rate.changes.up - ups == len(decisions) >= 5


@pytest.mark.parametrize("noise", [None, 1, 2], ids=["exact", "noisy-1", "noisy-2"])
def test_a_steady_link_at_capacity_does_not_flap(noise: int | None) -> None:
    """On a link steadily narrower than the ceiling the bitrate settles under it: over two
    minutes (1,200 updates) it changes at most once every 2 s on average and stays within
    [0.6, 1.15] of the link's rate, also when the estimate is noisy."""
    rate = controller()
    link = Link(800, None if noise is None else random.Random(noise))
    run(rate, link, 10)
    before = rate.changes.total
    decisions = run(rate, link, 120)
    assert rate.changes.total - before == len(decisions) <= 60
    assert all(0.6 * 800 <= d.bitrate_kbps <= 1.15 * 800 for d in decisions)
    assert {d.scale for d in decisions} == {1.0} or not decisions


@pytest.mark.parametrize("noise", [None, 3], ids=["exact", "noisy"])
def test_a_link_with_room_at_the_ceiling_changes_nothing(noise: int | None) -> None:
    """At its ceiling on a link with room to spare, the controller makes no change at all,
    also when the estimate is noisy."""
    rate = controller(start=2000)
    link = Link(10_000, None if noise is None else random.Random(noise))
    assert run(rate, link, 60) == []
    assert rate.changes.total == 0
    assert rate.current.reason == "start"


def state(now: float, **fields: float) -> LinkState:
    """A link with room at 1 Mbit/s, but for ``fields``."""
    base = {"delivery_bps": 1e6, "rtt_ms": 40.0, "min_rtt_ms": 40.0, "sent_bps": 1e6}
    values = {**base, **fields}
    return LinkState(
        now_s=now,
        delivery_bps=values["delivery_bps"],
        rtt_ms=values["rtt_ms"],
        min_rtt_ms=values["min_rtt_ms"],
        inflight_bytes=5000,
        sent_bps=values["sent_bps"],
        dropped=0,
        acked_bps=values.get("acked_bps"),
    )


@pytest.mark.parametrize(
    ("fields", "reason", "to_kbps"),
    [
        ({"rtt_ms": 40.0 + 1.5 * 1000 / 24 + 5}, "queue", 850.0),  # 1.5 frames above its min
        ({"delivery_bps": 0.7e6}, "delivery", 595.0),  # the page got 70 % of what was sent
    ],
)
def test_a_queue_or_a_short_delivery_is_congestion_without_drops(
    fields: dict[str, float], reason: str, to_kbps: float
) -> None:
    """No drops needed: a round trip 1.5 frames above its minimum, or a delivery a fifth short
    of what was offered, cuts the bitrate to 0.85 of the measured delivery at once."""
    rate = controller()
    assert rate.update(state(1.0)) is None
    decision = rate.update(state(1.1, **fields))
    assert decision is not None
    assert decision.reason == reason
    assert decision.bitrate_kbps == pytest.approx(to_kbps)


def test_a_link_that_just_narrowed_is_followed_in_one_step() -> None:
    """The delivery sample (the best of its window) still shows the old link while the page
    acknowledged 0.6 Mbit/s of the 1 offered: one step goes to 0.85 of what was acknowledged,
    not of the stale sample."""
    rate = controller()
    assert rate.update(state(1.0)) is None
    decision = rate.update(state(1.1, delivery_bps=0.9e6, acked_bps=0.6e6))
    assert decision is not None
    assert decision.reason == "delivery"
    assert decision.bitrate_kbps == pytest.approx(0.85 * 600)


def test_a_page_that_stops_acknowledging_costs_a_step_not_all() -> None:
    """Next to nothing acknowledged over the window (a page busy a moment): a step takes the
    bitrate to 0.85 of half, another a hold (0.5 s) later, rather than to its floor at once."""
    rate = controller()
    assert rate.update(state(1.0)) is None
    first = rate.update(state(1.1, delivery_bps=0.9e6, acked_bps=1e3))
    assert first is not None
    assert first.bitrate_kbps == pytest.approx(425.0)
    assert rate.update(state(1.2, delivery_bps=0.9e6, acked_bps=1e3)) is None  # held
    second = rate.update(state(1.1 + 0.5, delivery_bps=0.9e6, acked_bps=1e3))
    assert second is not None
    assert second.bitrate_kbps == pytest.approx(0.85 * 0.5 * 425.0)


def test_resolution_falls_only_at_the_floor_and_returns_with_room() -> None:
    """Below the floor's rate the bitrate reaches its floor first, then the scale falls to
    0.75 and 0.5; with room for some seconds it climbs back to 1 before the bitrate rises."""
    rate, link = controller(), Link(60)
    decisions = run(rate, link, 30)
    floor_at = next(i for i, d in enumerate(decisions) if d.bitrate_kbps == 100)
    assert all(d.scale == 1.0 for d in decisions[: floor_at + 1])
    assert [(d.scale, d.reason) for d in decisions[floor_at + 1 :]] == [
        (0.75, "floor"),
        (0.5, "floor"),
    ]
    link.capacity_kbps = 10_000
    room_from, back = link.now_s, []
    for _ in range(300):
        decision = rate.update(link.state(rate.current.bitrate_kbps))
        if decision is not None:
            back.append((link.now_s - room_from, decision))
    assert [(d.scale, d.reason, d.bitrate_kbps) for _, d in back[:2]] == [
        (0.75, "room", 100),
        (1.0, "room", 100),
    ]
    assert back[0][0] >= SCALE_UP_AFTER_S
    assert back[1][0] - back[0][0] >= SCALE_UP_AFTER_S
    assert all(d.reason == "probe" and d.scale == 1.0 for _, d in back[2:])
    assert rate.changes.scale_down == 2
    assert rate.changes.scale_up == 2


def test_jpeg_quality_rises_with_the_bitrate() -> None:
    """The JPEG quality is a monotone map of the bitrate, within 1..95."""
    qualities = [jpeg_quality(kbps, 100, 2000) for kbps in range(50, 2500, 10)]
    assert qualities == sorted(qualities)
    assert qualities[0] < qualities[-1] <= 95
    assert min(qualities) >= 1


def test_each_change_is_logged_once() -> None:
    """Every change is one ``rate_changed`` event naming the stream, the two rates and why."""
    rate, link = controller(start=2000), Link(400)
    with structlog.testing.capture_logs() as logs:
        decisions = run(rate, link, 3)
    events = [e for e in logs if e["event"] == "rate_changed"]
    assert len(events) == len(decisions) == rate.changes.total >= 1
    assert events[0]["stream"] == "video"
    assert events[0]["from_kbps"] == 2000
    assert events[0]["to_kbps"] == round(decisions[0].bitrate_kbps, 1)
    assert events[0]["reason"] == "drops"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"min_kbps": 0},
            "rate control: min_kbps must be a finite number > 0, got 0",
        ),
        (
            {"max_kbps": "fast"},
            "rate control: max_kbps must be a number > 0, got 'fast'",
        ),
        (
            {"max_kbps": 50},
            "rate control: max_kbps must be >= min_kbps (100), got 50",
        ),
        (
            {"start_kbps": 5000},
            "rate control: start_kbps must be within min_kbps..max_kbps (100..2000), got 5000",
        ),
        ({"fps": float("nan")}, "rate control: fps must be a finite number > 0, got nan"),
    ],
)
def test_arguments_are_checked(kwargs: dict[str, object], message: str) -> None:
    """A bad argument raises ArgumentError naming the field, the rule and the value."""
    args: dict[str, object] = {"start_kbps": 1000, "min_kbps": 100, "max_kbps": 2000, "fps": 24}
    with pytest.raises(ArgumentError, match=f"^{re.escape(message)}$"):
        RateController(**{**args, **kwargs})  # type: ignore[arg-type]


_maybe = st.none() | st.floats(0, 1e8, allow_nan=False)
_states = st.lists(
    st.tuples(
        st.floats(0, 5),  # time step, s
        _maybe,  # delivery_bps
        _maybe,  # rtt_ms
        _maybe,  # min_rtt_ms
        st.integers(0, 10**7),  # inflight_bytes
        st.floats(0, 1e8, allow_nan=False),  # sent_bps
        st.integers(0, 5),  # dropped
    ),
    max_size=200,
)


@given(_states, st.floats(1, 1000), st.floats(1, 100))
def test_decisions_keep_their_laws(
    states: list[tuple[float, float | None, float | None, float | None, int, float, int]],
    low: float,
    span: float,
) -> None:
    """Whatever the link says, the bitrate stays in [min, max], the scale one of SCALES, and
    neither rises on an update that reports drops."""
    rate = RateController(start_kbps=low, min_kbps=low, max_kbps=low * span, fps=30)
    now = 0.0
    for step, delivery, rtt, min_rtt, inflight, sent, dropped in states:
        now += step
        before = rate.current
        decision = rate.update(LinkState(now, delivery, rtt, min_rtt, inflight, sent, dropped))
        after = rate.current
        assert decision is None or decision is after
        assert low <= after.bitrate_kbps <= low * span
        assert after.scale in SCALES
        assert 1 <= after.jpeg_quality <= 95
        if dropped:
            assert after.bitrate_kbps <= before.bitrate_kbps
            assert after.scale <= before.scale


def test_a_decision_is_followed_by_each_encoder_and_told_to_the_page() -> None:
    """apply_rate() sets an h264 encoder's bitrate and scale and a JPEG encoder's quality and
    scale; rate_message() is the page-bound ``rate`` message of the decision."""
    decision = RateDecision(bitrate_kbps=412.34, jpeg_quality=40, scale=0.75, reason="drops")
    h264, jpeg = H264Fragments(fps=24, stream="video"), JpegEncoder(stream="video")
    apply_rate(h264, decision)
    apply_rate(jpeg, decision)
    apply_rate(RawEncoder(stream="video"), decision)
    assert (h264.bitrate_kbps, h264.scale) == (412.34, 0.75)
    assert (jpeg.quality, jpeg.scale) == (40, 0.75)
    assert rate_message("video", decision) == {
        "type": "rate",
        "stream": "video",
        "kbps": 412.3,
        "scale": 0.75,
        "reason": "drops",
    }


@pytest.mark.parametrize("rtt_ms", [20.0, 60.0, 120.0])
def test_a_link_that_keeps_up_is_not_judged_short_whatever_its_round_trip(rtt_ms: float) -> None:
    """Frames each acked a round trip after it was sent (no queue, no loss): the estimate's
    acked rate matches what was offered, so the bitrate never steps down, on a 20 ms link as
    on a 120 ms one (frames 42 ms apart: a delivery sample holds one frame a round trip)."""
    from rxstream.transport._linkestimate import LinkEstimate

    clock = [100.0]
    estimate = LinkEstimate(lambda: clock[0])
    rate = RateController(start_kbps=1000, min_kbps=150, max_kbps=4000, fps=24, stream="video")
    due: list[tuple[float, int]] = []
    for seq in range(1, 24 * 10):  # 10 s at 24 fps, 5 kB a frame (960 kbit/s)
        estimate.sent("video", seq, 5000)
        due.append((clock[0] + rtt_ms / 1e3, seq))
        step = 1 / 24
        while due and due[0][0] <= clock[0] + step:
            at, acked = due.pop(0)
            clock[0] = at
            estimate.acked("video", acked)
            rate.update(estimate.state())
        clock[0] = 100.0 + seq * step
    assert rate.changes.down == 0, rate.current
    assert rate.current.bitrate_kbps >= 1000


def test_a_frame_dropped_now_and_then_is_not_congestion_but_a_share_of_them_is() -> None:
    """A frame held back for the link once a second (a keyframe's burst, a late ack), 1 in 24:
    no step down; a fifth of the window's frames and more: a step down (``drops``)."""
    rate = RateController(start_kbps=1000, min_kbps=150, max_kbps=4000, fps=24, stream="video")
    base = {"delivery_bps": 1.2e6, "rtt_ms": 40.0, "min_rtt_ms": 40.0, "sent_bps": 1e6}
    for frame in range(24 * 5):
        now = frame / 24
        dropped = 1 if frame % 24 == 0 else 0
        rate.update(
            LinkState(now, inflight_bytes=5000, dropped=dropped, dropped_share=1 / 24, **base)
        )
    assert rate.changes.down == 0
    decision = rate.update(
        LinkState(5.0, inflight_bytes=5000, dropped=1, dropped_share=0.25, **base)
    )
    assert decision is not None
    assert decision.reason == "drops"
    assert decision.bitrate_kbps == pytest.approx(0.85 * 1200)  # BACKOFF of what was received
    assert rate.changes.down == 1
