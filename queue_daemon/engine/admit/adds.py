"""Adding jobs: the one use case that the add route, a batch's follow-on jobs and
the schedules' ticks go through.

An add, in this order:

- its quotas: the tenant's add rate (``quotas.RateLimiter``: jobs, plus one
  for every 64 KiB of payloads), then its waiting limit
  (``quotas.WaitingLimiter``); a request that does not fit is refused whole;
- its ids: an ``Idempotency-Key``'s (``ids.keyed_ids``), else new ones;
- its options (``JobOptions``): the jobs it waits for must be in the store
  (a job acknowledged a moment ago may still be on its way);
- the intake (``intake.Intake``): the journal, the queue log, the metrics.

A refusal raises an ``AddRefused`` and nothing is accepted; what was taken
from the add rate and the waiting limit is given back. Follow-on jobs and ticks take their
quotas with ``admit`` (per run, per tick) and are journaled with ``write``
(per chunk, per type), keeping their own rules around them
(``followons``, ``engine.schedule.ticker``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from queue_daemon.domain.names import JobType
from queue_daemon.domain.options import NO_OPTIONS, JobOptions
from queue_daemon.engine.admit.ids import keyed_ids
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits, TenantLimits
from queue_daemon.engine.admit.quotas import RATE_UNIT_BYTES, RateLimiter, WaitingLimiter, rate_cost
from queue_daemon.engine.backoff import Backoff
from queue_daemon.journal import JournalError
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog

logger = logging.getLogger(__name__)

DEPENDENCY_WAIT_S = 2.0  # how long an add waits for its dependencies to reach the store
DEPENDENCY_PAUSE_S = (0.002, 0.5)  # first and longest pause between two looks


class AddRefused(Exception):
    """An add refused whole: nothing was accepted."""

    def __init__(self, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after  # seconds until it may fit (OverRate, OverWaiting)


class OverRate(AddRefused):
    """Over the tenant's add rate now; it fits after ``retry_after`` seconds."""


class OverWaiting(AddRefused):
    """The tenant has its limit of waiting jobs; try again after ``retry_after``."""


class NeverFits(AddRefused):
    """More at once than a quota can ever hold: the burst, or the waiting limit."""

    def __init__(self, message: str, quota: str) -> None:
        super().__init__(message)
        self.quota = quota  # "rate" or "waiting"


class BadDependencies(AddRefused):
    """``after`` names the add's own jobs, or jobs the tenant does not have."""


class NotJournaled(AddRefused):
    """The journal cannot be written."""


class KnownJobs(Protocol):
    """The store port an add's dependencies are looked up in."""

    async def existing_jobs(self, ids: Sequence[str], *, client: str) -> set[str]: ...


@dataclass(frozen=True, slots=True)
class AddResult:
    ids: list[str]


class Adds:
    """A daemon's admission of new jobs: its quotas and its intake."""

    def __init__(
        self,
        *,
        intake: Intake,
        limits: Limits,
        rates: RateLimiter,
        waiting: WaitingLimiter,
        jobs: KnownJobs,
        queuelog: QueueLog,
        metrics: Metrics,
    ) -> None:
        self._intake = intake
        self._limits = limits
        self._rates = rates
        self._waiting = waiting
        self._jobs = jobs
        self._queuelog = queuelog
        self._metrics = metrics
        # per tenant and pool (None: the types whose runs emitted; a type: that
        # one, not yet seen to emit): its batches running now that were given a
        # share of its rate's room
        self._sharing: dict[tuple[str, str | None], int] = {}
        self._emitting: set[tuple[str, str]] = set()  # (tenant, type): its runs sent some

    def check(self, client: str, length: int | None) -> None:
        """Refuse an add its tenant's quotas cannot take, before its body is read:
        its least cost against the rate (one job, plus ``length``, the announced
        bytes), and a tenant already at its waiting limit."""
        limits = self._limits.of(client)
        wait = self._rates.peek(client, rate_cost(1, length or 0), limits.rate, limits.burst)
        if math.isinf(wait):
            raise NeverFits(
                f"a body of {length} bytes is over this tenant's burst of {limits.burst:g}", "rate"
            )
        if wait:
            raise OverRate(f"over this tenant's add rate of {limits.rate:g} jobs/s", wait)
        if self._waiting.full(client, limits.waiting):
            raise _over_waiting(limits)

    async def add(
        self,
        client: str,
        jobtype: str,
        payloads: list[str],
        *,
        size: int,
        create_ms: int,
        dt_ms: int,
        options: JobOptions = NO_OPTIONS,
        key: str | None = None,
    ) -> AddResult:
        """Admit and journal ``payloads`` (``size`` bytes in all) as jobs of
        ``client``'s ``jobtype``; their ids once durable. AddRefused otherwise;
        ValueError for a payload the journal cannot frame."""
        given = None if key is None else keyed_ids(client, key, len(payloads))
        after = options.after
        if after and given is not None and not set(after).isdisjoint(given):
            raise BadDependencies("a job cannot depend on itself")
        n = len(payloads)
        limits = self._limits.of(client)
        cost = rate_cost(n, size)
        wait = self._rates.take(client, cost, limits.rate, limits.burst)
        if wait:
            if math.isinf(wait):
                raise NeverFits(
                    f"{n} jobs of {size} bytes in one request (counting {cost} against"
                    f" the rate) are over this tenant's burst of {limits.burst:g}",
                    "rate",
                )
            raise OverRate(f"over this tenant's add rate of {limits.rate:g} jobs/s", wait)
        typed = JobType(client, jobtype)
        try:
            await self._take_waiting(client, n, limits)
        except AddRefused:
            self._rates.refund(client, cost, limits.burst)
            raise
        try:
            if after:
                await self._dependencies_stored(client, after)
            ids = await self._intake.add(
                typed, payloads, create_ms=create_ms, dt_ms=dt_ms, ids=given, options=options
            )
        except JournalError as exc:
            self._give_back(client, n, cost, limits)
            logger.error("journal write failed: %s", exc, extra={"action": "journal_write_failed"})
            raise NotJournaled("the journal cannot be written; nothing was accepted") from None
        except BaseException:  # a cancelled add too: its slots are not left counted
            self._give_back(client, n, cost, limits)
            raise
        if after:
            self._queuelog.blocked(typed.stored, ids, len(after))
            self._metrics.graph(client, "blocked", len(ids))
        return AddResult(ids)

    def take_reruns(self, client: str, n: int) -> int:
        """Of ``n`` done jobs to wait again, as many as ``client``'s add rate
        allows now (taken from it, as adds are): a rerun is an add of the job
        again. Its waiting limit is not checked: the store counts them."""
        limits = self._limits.of(client)
        return self._rates.take_up_to(client, n, limits.rate, limits.burst)

    def refund_reruns(self, client: str, n: int) -> None:
        """Reruns taken from the rate that found no job."""
        if n > 0:
            self._rates.refund(client, n, self._limits.of(client).burst)

    def rerun_wait(self, client: str) -> float:
        """Seconds until one rerun fits ``client``'s add rate."""
        limits = self._limits.of(client)
        return self._rates.peek(client, 1, limits.rate, limits.burst)

    def rate_room_bytes(self, client: str) -> float:
        """Payload bytes ``client``'s add rate would take now (infinite without a
        rate): what a run's follow-on jobs may carry and not be over it."""
        limits = self._limits.of(client)
        return self._rates.room(client, limits.rate, limits.burst) * RATE_UNIT_BYTES

    def emitted(self, client: str, type: str) -> None:
        """A run of ``client``'s ``type`` sent follow-on jobs (``ctx.emit``)."""
        self._emitting.add((client, type))

    def emits(self, client: str, type: str) -> bool:
        """Whether runs of ``client``'s ``type`` sent follow-on jobs here before."""
        return (client, type) in self._emitting

    def share_room_bytes(self, client: str, pool: str | None) -> float:
        """Payload bytes one more batch's runs of ``client`` may send as follow-on
        jobs: the room of its add rate now, split with its batches running in the
        same pool (a batch started beside k others gets 1/(k+1) of it, fixed then),
        so their contexts together send the daemon a few times what the rate
        takes, not once per batch. The batches of the types whose runs emitted
        before share one pool (``pool`` None); those of a type not yet seen to
        emit share the pool of that type (``pool`` the type), so it takes nothing
        from the types that do, nor they from it. Ended by ``end_share``."""
        room = self.rate_room_bytes(client)
        if math.isinf(room):
            return room
        key = (client, pool)
        sharing = self._sharing[key] = self._sharing.get(key, 0) + 1
        return room / sharing

    def end_share(self, client: str, pool: str | None) -> None:
        """A batch given ``share_room_bytes`` ended."""
        key = (client, pool)
        left = self._sharing.get(key, 0) - 1
        if left > 0:
            self._sharing[key] = left
        else:
            self._sharing.pop(key, None)

    def burst_bytes(self, client: str) -> float:
        """Payload bytes ``client``'s add rate could ever take at once (infinite
        without a rate): follow-on payloads past it never fit."""
        limits = self._limits.of(client)
        if limits.rate <= 0:
            return math.inf
        return max(limits.burst, 1.0) * RATE_UNIT_BYTES

    async def admit(self, client: str, n: int, size: int) -> None:
        """Take ``n`` jobs of ``size`` payload bytes in all from ``client``'s add
        rate, then its waiting limit (until they are stored, or given back by
        ``write`` or ``give_back``). OverRate, OverWaiting or NeverFits otherwise."""
        limits = self._limits.of(client)
        cost = rate_cost(n, size)
        wait = self._rates.take(client, cost, limits.rate, limits.burst)
        if math.isinf(wait):
            said = f"{n} of {size} bytes" if cost > n else f"{n}"
            raise NeverFits(
                f"{said} at once is over this tenant's burst of {limits.burst:g}", "rate"
            )
        if wait:
            raise OverRate(f"over this tenant's add rate of {limits.rate:g} jobs/s", wait)
        try:
            await self._take_waiting(client, n, limits)
        except AddRefused:  # refused whole: the rate is not spent either
            self._rates.refund(client, cost, limits.burst)
            raise

    async def write(
        self, jobtype: JobType, payloads: Sequence[str], *, ids: list[str] | None = None
    ) -> list[str]:
        """Journal admitted jobs, due now; their ids. On JournalError or ValueError
        (raised) they are given back to the waiting limit."""
        now_ms = time.time_ns() // 1_000_000
        try:
            return await self._intake.add(
                jobtype, payloads, create_ms=now_ms, dt_ms=now_ms, ids=ids
            )
        except BaseException:
            self._waiting.give_back(jobtype.client, len(payloads))
            raise

    def give_back(self, client: str, n: int) -> None:
        """``n`` admitted jobs of ``client`` that will not be journaled."""
        self._waiting.give_back(client, n)

    def _give_back(self, client: str, n: int, cost: int, limits: TenantLimits) -> None:
        """An add refused after both its quotas were taken: nothing was accepted."""
        self._waiting.give_back(client, n)
        self._rates.refund(client, cost, limits.burst)

    async def _take_waiting(self, client: str, n: int, limits: TenantLimits) -> None:
        if await self._waiting.take(client, n, limits.waiting):
            if n > limits.waiting:
                raise NeverFits(
                    f"{n} jobs in one request is over this tenant's waiting limit of "
                    f"{limits.waiting}",
                    "waiting",
                )
            raise _over_waiting(limits)

    async def _dependencies_stored(self, client: str, after: tuple[str, ...]) -> None:
        """Return once every job of ``after`` is in the store (a job acknowledged a
        moment ago, here or by another daemon, may still be on its way);
        BadDependencies for those that never come."""
        deadline = time.monotonic() + DEPENDENCY_WAIT_S
        # a chained add's dependency is usually a few milliseconds from the store
        pause = Backoff(*DEPENDENCY_PAUSE_S)
        missing = list(after)
        while True:
            found = await self._jobs.existing_jobs(missing, client=client)
            missing = sorted(set(missing) - found)
            if not missing:
                return
            if time.monotonic() >= deadline:
                shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
                raise BadDependencies(f"after names jobs this tenant does not have: {shown}")
            await pause.sleep()


def _over_waiting(limits: TenantLimits) -> OverWaiting:
    return OverWaiting(
        f"this tenant has its limit of {limits.waiting} waiting jobs", WaitingLimiter.RETRY_AFTER_S
    )
