"""Histograms kept as plain counts, made into Prometheus families when scraped.

prometheus-client's ``Histogram.observe`` takes a lock and walks every bucket per value; a
record's hops are a dozen or more values at once, so :class:`Histogram` leaves the locking to
its owner (one lock a record) and finds each value's bucket by bisection, in ms.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

__all__ = ["Histogram"]


class Histogram:
    """One histogram family: its series by label values, each ``[counts, sum_ms]`` where
    ``counts[i]`` is the values in ``(bounds[i-1], bounds[i]]`` (the last: past every bound).
    Not locked: its owner holds one lock over :meth:`series` and what it changes."""

    def __init__(
        self, name: str, doc: str, labels: Sequence[str], bounds_s: Sequence[float]
    ) -> None:
        self.name = name
        self.doc = doc
        self.labels = list(labels)
        self.bounds_s = tuple(bounds_s)
        self.bounds_ms = tuple(bound * 1e3 for bound in bounds_s)
        """The bounds in ms, the unit of the records: bisect the values against these."""
        self._series: dict[tuple[str, ...], list[Any]] = {}

    def series(self, key: tuple[str, ...]) -> list[Any]:
        """The series of ``key`` (its label values), made empty on first use."""
        row = self._series.get(key)
        if row is None:
            row = self._series[key] = [[0] * (len(self.bounds_ms) + 1), 0.0]
        return row

    def copy(self) -> dict[tuple[str, ...], tuple[list[int], float]]:
        """A copy of every series (under the owner's lock), for :meth:`family`."""
        return {key: (list(counts), total) for key, (counts, total) in self._series.items()}

    def family(self, copied: dict[tuple[str, ...], tuple[list[int], float]]) -> Any:
        """The Prometheus family of ``copied`` (:meth:`copy`), in seconds."""
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key in sorted(copied):
            counts, total_ms = copied[key]
            cumulative = list(itertools.accumulate(counts))
            buckets = [
                (floatToGoString(bound), float(count))  # type: ignore[no-untyped-call]
                for bound, count in zip(self.bounds_s, cumulative, strict=False)
            ]
            buckets.append(("+Inf", float(cumulative[-1])))
            family.add_metric(list(key), buckets, sum_value=total_ms / 1e3)
        return family
