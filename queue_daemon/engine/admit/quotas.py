"""Per-tenant admission of adds: the add rate and the number of waiting jobs.

The rate is a token bucket per client, refilled continuously: adding ``n``
jobs takes ``n`` tokens, plus one for every 64 KiB of their payloads (so a
tenant's rate bounds the bytes it adds too, not only the jobs); a request
that does not fit is refused whole with ``429`` and a ``Retry-After`` that
says when it would fit.

The waiting limit reads a tenant's count of waiting, scheduled and blocked
jobs from the store's state counts (one row per type, never job by job) when
the tenant adds, at most about once a second, and adds the jobs this daemon
admitted that its ingester has not stored yet (``stored``: told by the
ingester) and those it stored since that count began (they may or may not be
in it). So this daemon's own adds never take a tenant past its limit however
far ingestion trails the journal; other daemons' adds are seen at their next
count (docs/api.md says how far that lets a burst pass). While the store
cannot be reached the last count stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from queue_daemon.domain.names import JobType
from queue_daemon.journal import Entry
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import TenantStore

logger = logging.getLogger(__name__)


RATE_UNIT_BYTES = 64 << 10  # payload bytes that count as one more job against the rate


def rate_cost(jobs: int, payload_bytes: int) -> int:
    """The tokens ``jobs`` jobs of ``payload_bytes`` bytes in all take from the bucket."""
    return jobs + payload_bytes // RATE_UNIT_BYTES


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

    def take(
        self, client: str, n: int, rate: float | None = None, burst: float | None = None
    ) -> float:
        """Take ``n`` tokens from ``client``'s bucket: 0.0 if taken, else the
        seconds until they would be available (nothing is taken then).
        ``rate`` and ``burst`` override the limiter's own for this client."""
        return self._wait(client, n, rate, burst, take=True)

    def take_up_to(
        self, client: str, n: int, rate: float | None = None, burst: float | None = None
    ) -> int:
        """Take as many of ``n`` tokens as ``client``'s bucket holds now (whole
        ones): how many."""
        if (self.rate if rate is None else rate) <= 0:
            return n
        self._wait(client, 0, rate, burst, take=False)  # the bucket, filled up to now
        bucket = self._buckets[client]
        got = min(n, int(bucket.tokens))
        bucket.tokens -= got
        return got

    def room(self, client: str, rate: float | None = None, burst: float | None = None) -> float:
        """The tokens ``client``'s bucket holds now (infinite without a rate)."""
        if (self.rate if rate is None else rate) <= 0:
            return math.inf
        self._wait(client, 0, rate, burst, take=False)  # the bucket, filled up to now
        return self._buckets[client].tokens

    def refund(self, client: str, n: int, burst: float | None = None) -> None:
        """Give back ``n`` tokens taken for an add refused after its rate check."""
        bucket = self._buckets.get(client)
        if bucket is not None:
            cap = self.burst if burst is None else max(burst, 1.0)
            bucket.tokens = min(cap, bucket.tokens + n)

    def peek(
        self, client: str, n: int, rate: float | None = None, burst: float | None = None
    ) -> float:
        """What ``take`` would answer, taking nothing: an add checks its quota with
        it before it reads its body."""
        return self._wait(client, n, rate, burst, take=False)

    def _wait(
        self, client: str, n: int, rate: float | None, burst: float | None, *, take: bool
    ) -> float:
        rate = self.rate if rate is None else rate
        burst = self.burst if burst is None else max(burst, 1.0)
        if rate <= 0:
            return 0.0
        now = self._clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = self._buckets[client] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if n <= bucket.tokens:
            if take:
                bucket.tokens -= n
            return 0.0
        if n > burst:
            return math.inf  # can never fit: the caller says so
        return (n - bucket.tokens) / rate


@dataclass(slots=True)
class _Waiting:
    count: int = 0  # waiting jobs in the store at the count in force
    unstored: int = 0  # jobs admitted here that the ingester has not stored yet
    stored: int = 0  # jobs the ingester stored, ever
    stored_at_count: int = 0  # ``stored`` when the count in force began
    next_at: float = 0.0  # when to count again
    counting: asyncio.Task[None] | None = None

    def estimate(self) -> int:
        """Waiting jobs, at least: those stored since the count began may be in it."""
        return self.count + self.unstored + self.stored - self.stored_at_count


_TYPE_OF = attrgetter("type")


class WaitingLimiter:
    """Refuses adds that would take a tenant over its waiting limit."""

    RETRY_AFTER_S = 1.0
    FIRST_COUNT_WAIT_S = 1.0  # a tenant's first add waits this long for its count

    def __init__(
        self, store: TenantStore, interval: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._interval = interval
        self._clock = clock
        self._tenants: dict[str, _Waiting] = {}

    async def take(self, client: str, n: int, limit: int) -> float:
        """0.0 when ``n`` more waiting jobs fit under ``limit`` (0 = none), and
        they are counted (until stored, or given back); else seconds to wait
        before trying again."""
        if limit <= 0:
            return 0.0
        state = self._tenants.get(client)
        if state is None:
            state = self._tenants[client] = _Waiting()
            task = self._count(client, state)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self.FIRST_COUNT_WAIT_S)
        elif state.counting is None and self._clock() >= state.next_at:
            self._count(client, state)
        if state.estimate() + n > limit:
            return self.RETRY_AFTER_S
        state.unstored += n
        return 0.0

    def give_back(self, client: str, n: int) -> None:
        """``n`` jobs taken for ``client`` will not be journaled after all."""
        state = self._tenants.get(client)
        if state is not None:
            state.unstored = max(0, state.unstored - n)

    def stored(self, entries: Sequence[Entry]) -> None:
        """The ingester stored these lines of this daemon's journal: once per
        batch, counted by type (not job by job in Python)."""
        tenants = self._tenants
        if not tenants:
            return
        for stored_type, n in Counter(map(_TYPE_OF, entries)).items():
            state = tenants.get(JobType.parse(stored_type).client)
            if state is not None:
                # lines journaled before this daemon started were never counted here
                state.unstored = max(0, state.unstored - n)
                state.stored += n

    def full(self, client: str, limit: int) -> bool:
        """Whether ``client`` is at ``limit`` by the last count and what was added
        since (a count due is started, not awaited): an add checks it before it
        reads its body."""
        state = self._tenants.get(client)
        if limit <= 0 or state is None:
            return False
        if state.counting is None and self._clock() >= state.next_at:
            self._count(client, state)  # for the next add: jobs may have gone since
        return state.estimate() >= limit

    def _count(self, client: str, state: _Waiting) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._recount(client, state))
        state.counting = task
        return task

    async def _recount(self, client: str, state: _Waiting) -> None:
        began = self._clock()
        stored_before = state.stored
        try:
            count = await self._store.count_waiting(client)
        except StoreError as exc:
            logger.debug("waiting count of %s failed: %s", client, exc)
        else:
            # jobs stored before the count began are in it; those stored since may be
            state.count = count
            state.stored_at_count = stored_before
        finally:
            took = self._clock() - began
            # a long count (a deep backlog) is repeated less often
            state.next_at = self._clock() + max(self._interval, 20 * took)
            state.counting = None

    async def close(self) -> None:
        tasks = [s.counting for s in self._tenants.values() if s.counting is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
