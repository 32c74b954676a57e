"""The front's ``GET /metrics`` (``rxstream serve --metrics``): the server's own series and
every live session's run metrics, one exposition.

Front series (bounded labels only): ``rxstream_serve_sessions_live``,
``rxstream_serve_queue_length``, ``rxstream_serve_workers`` (``state``: ``busy``, ``free``,
``starting``, ``dead``), ``rxstream_serve_sessions_started_total`` and
``rxstream_serve_sessions_ended_total`` (``reason``: one of :data:`REASONS`).

Each live session's launch serves its run metrics on its worker's private port behind the
session's token; the front scrapes them all at once, gives each sample a ``session="<id>"``
label (sessions are bounded by the workers; nothing is labelled by input) and merges them so
each family has one HELP and TYPE. A session that ended is no longer scraped: its series go.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import aiohttp

__all__ = ["REASONS", "SCRAPE_S", "FrontMetrics", "end_reason", "merge", "scrape"]

SCRAPE_S = 2.0
"""How long the front waits for one session's metrics (a session that does not answer in
time is left out of that scrape)."""

REASONS = (
    "page_left",
    "idle",
    "max_duration",
    "pipeline_ended",
    "app_failed",
    "worker_died",
    "server_stopped",
    "other",
)
"""The ``reason`` label of ``rxstream_serve_sessions_ended_total``: why a session ended, from
a fixed set (the ``why`` a visitor reads is free text)."""

_REASON_OF = (
    ("the page left", "page_left"),
    ("no input for", "idle"),
    ("it reached its maximum of", "max_duration"),
    ("the app's pipeline ended", "pipeline_ended"),
    ("the app failed", "app_failed"),
    ("its worker process died", "worker_died"),
    ("the server", "server_stopped"),
)
"""How each ``why`` the front and its workers give begins, and its reason."""


def end_reason(why: str) -> str:
    """The bounded ``reason`` label of a session's end ``why``."""
    for said, reason in _REASON_OF:
        if why.startswith(said):
            return reason
    return "other"


class FrontMetrics:
    """The counters the front keeps for ``/metrics``: sessions started, sessions ended by
    reason (gauges are read from the front when scraped)."""

    def __init__(self) -> None:
        self.started = 0
        self.ended: Counter[str] = Counter()

    def session_started(self) -> None:
        self.started += 1

    def session_ended(self, why: str) -> None:
        self.ended[end_reason(why)] += 1

    def families(self, *, live: int, queue: int, workers: Iterable[str]) -> list[Any]:
        """The front's series now: ``live`` sessions, ``queue`` waiting, each worker's state."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        states = Counter(workers)
        gauge = GaugeMetricFamily(
            "rxstream_serve_sessions_live", "Sessions running now", value=float(live)
        )
        waiting = GaugeMetricFamily(
            "rxstream_serve_queue_length", "Visitors waiting for a worker", value=float(queue)
        )
        pool = GaugeMetricFamily(
            "rxstream_serve_workers", "Warm workers by state", labels=["state"]
        )
        for state in ("busy", "free", "starting", "dead"):
            pool.add_metric([state], float(states[state]))
        started = CounterMetricFamily(
            "rxstream_serve_sessions_started",
            "Sessions given out since the server started",
            value=float(self.started),
        )
        ended = CounterMetricFamily(
            "rxstream_serve_sessions_ended", "Sessions ended, by reason", labels=["reason"]
        )
        for reason in REASONS:
            ended.add_metric([reason], float(self.ended[reason]))
        return [gauge, waiting, pool, started, ended]


async def scrape(
    client: aiohttp.ClientSession, sessions: Iterable[tuple[str, int, str]]
) -> list[tuple[str, str]]:
    """Each ``(id, port, token)`` session's exposition, fetched at once: ``(id, text)`` for
    those that answered within :data:`SCRAPE_S` (one that ended meanwhile is left out)."""

    async def one(sid: str, port: int, token: str) -> tuple[str, str] | None:
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            async with asyncio.timeout(SCRAPE_S):
                async with client.get(url, params={"token": token}) as got:
                    if got.status != 200:
                        return None
                    return sid, await got.text()
        except (aiohttp.ClientError, TimeoutError):
            return None

    got = await asyncio.gather(*(one(*s) for s in sessions))
    return [g for g in got if g is not None]


def merge(front: list[Any], sessions: list[tuple[str, str]]) -> bytes:
    """One exposition: the ``front`` families, then every session's, each sample labelled
    with its ``session``; a family of many sessions has one HELP and TYPE."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Any] = {f.name: f for f in front}
    for sid, text in sessions:
        for family in text_string_to_metric_families(text):
            labelled = [
                Sample(s.name, {**s.labels, "session": sid}, s.value, s.timestamp, s.exemplar)
                for s in family.samples
            ]
            have = families.get(family.name)
            if have is None:
                family.samples = labelled
                families[family.name] = family
            elif have.type == family.type:
                have.samples.extend(labelled)

    class _All:
        def collect(self) -> Iterator[Any]:
            return iter(families.values())

    return generate_latest(_All())
