"""A histogram of plain numbers, turned into Prometheus' buckets when scraped."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.core import HistogramMetricFamily


class Histogram:
    """A histogram kept as plain numbers on the event loop (the only thread that
    touches it); the collector turns it into Prometheus' cumulative buckets."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: the first bound >= seconds, as Prometheus' le is inclusive
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def add_to(self, family: HistogramMetricFamily, labels: list[str]) -> None:
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
        family.add_metric(labels, buckets, self.total)
