"""The remote visitor's targets, judged on ``bench/photon.py --net`` rows: PASS/FAIL with the
figures.

Each row is judged against the unimpaired row of the same bench run at the same size (the
``clean`` link, or ``720p:clean`` for a ``720p:`` row), with the link's own round trip:

- a rate cap: on-screen p50 <= unimpaired p50 + RTT + 100 ms, and >= 12 fps shown;
- loss: the longest stall <= 200 ms, and p95 <= the loss-free row's p95 + 60 ms (the row of
  the same spec without its loss; without one in the run, the unimpaired p95 + RTT);
- a delay alone (``rtt=40ms``): p50 <= unimpaired p50 + RTT + 10 ms.

A blackout row, ``clean`` and ``loopback`` have no target. A delay row also says (INFO) the
p50 of each move's on-screen time minus its server ``total_ms``: the link's and the page's
part, apart from where the input landed against the demo's 24 Hz tick (the server's wait for
it differs between rows of 20 moves by up to half a frame).
"""

from __future__ import annotations

from typing import Any

from _net import parse

__all__ = ["SIZES", "judge", "size_of"]

SIZES = {"720p": "5"}
"""A row's size prefix (``720p:SPEC``) and the demo's ``RXSTREAM_DEMO_SCALE`` for it."""

CAP_SLACK_MS = 100.0
LOSS_STALL_MS = 200.0
LOSS_P95_SLACK_MS = 60.0
DELAY_SLACK_MS = 10.0
MIN_FPS = 12.0


def size_of(name: str) -> tuple[str, str]:
    """A row's size prefix ('' for the demo's own) and its link spec."""
    head, sep, rest = name.partition(":")
    return (head, rest) if sep and head in SIZES else ("", name)


def _without_loss(spec: str) -> str:
    kept = [item for item in spec.split(",") if not item.split(":")[-1].startswith("loss=")]
    return ",".join(kept) or "clean"


def judge(rows: list[dict[str, Any]]) -> list[str]:
    """One line per target of each row: ``PASS``/``FAIL``, the row, the rule with its
    figures."""
    by_name = {(r["name"], r.get("asked", "")): r for r in rows if "p50" in r}  # per wire
    lines: list[str] = []
    for r in rows:
        wire = r.get("asked", "")
        label = f"{r['name']} ({wire})" if wire else r["name"]
        size, spec = size_of(r["name"])
        if r["name"] == "loopback" or spec == "clean":
            continue
        base = by_name.get((f"{size}:clean" if size else "clean", wire))
        if "p50" not in r or base is None:
            lines.append(f"FAIL {label}: no figures ({r.get('error') or 'no baseline'})")
            continue
        link = parse(spec)
        rtt = (link.up.delay_s + link.down.delay_s) * 1e3
        down, up = link.down, link.up
        checks: list[tuple[bool, str]] = []
        if down.rate_bps or up.rate_bps:
            bound = base["p50"] + rtt + CAP_SLACK_MS
            checks.append(
                (
                    r["p50"] <= bound,
                    f"p50 {r['p50']:.0f} <= unimpaired {base['p50']:.0f} + RTT {rtt:.0f} + "
                    f"{CAP_SLACK_MS:.0f} = {bound:.0f}",
                )
            )
            checks.append((r["fps"] >= MIN_FPS, f"fps shown {r['fps']:.1f} >= {MIN_FPS:.0f}"))
        if down.loss or up.loss:
            checks.append(
                (
                    r["stall_ms"] <= LOSS_STALL_MS,
                    f"longest stall {r['stall_ms']:.0f} <= {LOSS_STALL_MS:.0f}",
                )
            )
            free_name = _without_loss(spec)
            free = by_name.get((f"{size}:{free_name}" if size else free_name, wire))
            if free is not None and free is not base:
                bound, what = free["p95"] + LOSS_P95_SLACK_MS, f"loss-free {free['p95']:.0f}"
            else:
                bound = base["p95"] + rtt + LOSS_P95_SLACK_MS
                what = f"unimpaired {base['p95']:.0f} + RTT {rtt:.0f}"
            checks.append(
                (
                    r["p95"] <= bound,
                    f"p95 {r['p95']:.0f} <= {what} + {LOSS_P95_SLACK_MS:.0f} = {bound:.0f}",
                )
            )
        impaired = down.rate_bps or up.rate_bps or down.loss or up.loss
        if rtt and not impaired and not (down.blackout_s or up.blackout_s):
            bound = base["p50"] + rtt + DELAY_SLACK_MS
            checks.append(
                (
                    r["p50"] <= bound,
                    f"p50 {r['p50']:.0f} <= unimpaired {base['p50']:.0f} + RTT {rtt:.0f} + "
                    f"{DELAY_SLACK_MS:.0f} = {bound:.0f}",
                )
            )
        info = ""
        if rtt and not impaired and not (down.blackout_s or up.blackout_s):
            info = (
                f"INFO {r['name']}: on screen minus the move's server total_ms, p50 "
                f"{r['beyond_p50']:.0f} vs unimpaired {base['beyond_p50']:.0f} + RTT {rtt:.0f} "
                f"(server total_ms p50 {r['total_p50']:.0f} vs {base['total_p50']:.0f}: where "
                "the input lands against the 24 Hz tick, not the link)"
            )
        for ok, text in checks:
            lines.append(f"{'PASS' if ok else 'FAIL'} {label}: {text}")
        if info:
            lines.append(info)
    return lines
