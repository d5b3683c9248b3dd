"""Percentiles of a stream of numbers in bounded memory, for ``queue-daemon stats``."""

from __future__ import annotations

import math
from collections import Counter

EXACT_MAX = 1024  # values kept exactly per sketch before it switches to buckets
RELATIVE_ERROR = 0.01  # of a percentile once a sketch uses buckets
_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)
_SMALLEST = 1e-3  # ms; anything at or below counts as zero
PERCENTILES = (50, 95, 99)
PERCENTILE_METHOD = (
    f"exact (nearest rank) up to {EXACT_MAX} values per tenant and type, beyond that "
    f"log-scale buckets with at most {RELATIVE_ERROR:.0%} relative error"
)


class Quantiles:
    """Percentiles of a stream of non-negative numbers in bounded memory.

    Exact (nearest rank) while it holds at most ``EXACT_MAX`` values; then a
    log-bucket sketch (as DDSketch): with ``g = (1+e)/(1-e)``, bucket ``i`` holds
    values in ``(g^(i-1), g^i]`` and reports ``2g^i/(g+1)``, within ``e = RELATIVE_ERROR``
    of every value in it. A few thousand buckets cover 1 µs to years in ms.
    Sketches merge by adding their buckets.
    """

    __slots__ = ("buckets", "count", "values", "zeros")

    def __init__(self) -> None:
        self.values: list[float] | None = []
        self.buckets: Counter[int] = Counter()
        self.zeros = 0
        self.count = 0

    def add(self, value: float) -> None:
        self.count += 1
        values = self.values
        if values is not None:
            values.append(value)
            if len(values) > EXACT_MAX:
                self.values = None
                for v in values:
                    self._bucket(v)
            return
        self._bucket(value)

    def _bucket(self, value: float) -> None:
        if value <= _SMALLEST:
            self.zeros += 1
        else:
            self.buckets[math.ceil(math.log(value) / _LOG_GAMMA)] += 1

    def merge(self, other: Quantiles) -> None:
        """Add ``other``'s values (sketches of several daemons or files combine)."""
        if other.values is not None:
            for v in other.values:
                self.add(v)
            return
        if self.values is not None:
            values, self.values = self.values, None
            for v in values:
                self._bucket(v)
        self.buckets.update(other.buckets)
        self.zeros += other.zeros
        self.count += other.count

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile (0 < q <= 1); None when empty."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        if self.values is not None:
            return sorted(self.values)[rank - 1]
        if rank <= self.zeros:
            return 0.0
        seen = self.zeros
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                return 2 * _GAMMA**index / (_GAMMA + 1)
        return None  # not reached: the buckets hold count - zeros values

    def summary(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {"n": self.count}
        for p in PERCENTILES:
            value = self.quantile(p / 100)
            out[f"p{p}"] = None if value is None else round(value, 3)
        return out
