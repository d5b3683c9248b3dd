"""Per-tenant add-rate limits: a token bucket per client, refilled continuously.

Adding ``n`` jobs takes ``n`` tokens; a request that does not fit is refused
whole with ``429`` and a ``Retry-After`` that says when it would fit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate  # jobs per second; 0 = unlimited
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, client: str, n: int) -> float:
        """Take ``n`` tokens from ``client``'s bucket: 0.0 if taken, else the
        seconds until they would be available (nothing is taken then)."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = self._buckets[client] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if n <= bucket.tokens:
            bucket.tokens -= n
            return 0.0
        if n > self.burst:
            return math.inf  # can never fit: the caller says so
        return (n - bucket.tokens) / self.rate
