"""How fast the daemon reads what each tenant's handlers print.

A handler's output (a context's stdout and stderr, a shell job's stdout and
stderr) is read in bulk, never a line at a time, and at most ``rate`` bytes a
second per tenant (after a ``burst``): past that the daemon stops reading that
tenant's pipes for as long as the excess takes at the rate. The pipes fill
and the handler's next write blocks, so a handler printing without end slows
itself, not the daemon or other tenants; nothing is read only to be thrown
away. ``throttled`` counts, per tenant, the seconds its reads waited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

# bytes read from one pipe; the reader waits when its tenant's budget is spent
Spend = Callable[[int], Awaitable[None]]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class OutputBudget:
    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate  # bytes per second per tenant; 0 = no limit
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self.throttled: dict[str, float] = {}  # tenant -> seconds its reads waited

    def wait_for(self, client: str, size: int) -> float:
        """Take ``size`` bytes from ``client``'s budget; the seconds to wait before
        reading more (0.0 within the budget)."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = self._buckets[client] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        bucket.tokens -= size
        return 0.0 if bucket.tokens >= 0 else -bucket.tokens / self.rate

    def spender(self, client: str) -> Spend:
        """What a reader of ``client``'s pipes calls after each read."""

        async def spend(size: int) -> None:
            wait = self.wait_for(client, size)
            if wait > 0:
                self.throttled[client] = self.throttled.get(client, 0.0) + wait
                await asyncio.sleep(wait)

        return spend


async def no_limit(size: int) -> None:
    """A ``Spend`` that never waits (output the daemon itself must read at once)."""
