"""Adding jobs (``queue_daemon.engine.admit.adds``): the quotas in order, the
waiting limit held however far ingestion trails the journal, what a refused or
failed add gives back."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import pytest

from queue_daemon.domain.jobs import added_once
from queue_daemon.domain.names import JobType
from queue_daemon.domain.options import JobOptions
from queue_daemon.engine.admit.adds import (
    Adds,
    BadDependencies,
    NeverFits,
    NotJournaled,
    OverRate,
    OverWaiting,
)
from queue_daemon.engine.admit.ids import IdGenerator, keyed_ids, tick_id
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits, TenantLimits
from queue_daemon.engine.admit.quotas import RateLimiter, WaitingLimiter
from queue_daemon.journal import Entry, JournalError
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.store.ports import TenantStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Store:
    """The store as admission reads it: waiting jobs counted only once ingested
    (``ingest``), which here happens only when the test says."""

    def __init__(self) -> None:
        self.waiting = 0
        self.counts = 0

    async def count_waiting(self, client: str) -> int:
        self.counts += 1
        return self.waiting

    async def existing_jobs(self, ids: Sequence[str], *, client: str) -> set[str]:
        return set()


class Journal:
    """The intake: lines journaled (and not ingested until the test says)."""

    def __init__(self) -> None:
        self.lines: list[Entry] = []
        self.fail = False

    async def add(
        self,
        jobtype: JobType,
        payloads: Sequence[str],
        *,
        create_ms: int,
        dt_ms: int,
        ids: list[str] | None = None,
        options: JobOptions | None = None,
    ) -> list[str]:
        await asyncio.sleep(0)  # the group commit: other tasks (a count) run meanwhile
        if self.fail:
            raise JournalError("no space left on device")
        ids = ids or [f"j{len(self.lines) + i}" for i in range(len(payloads))]
        self.lines += [
            Entry(id=i, create_ms=create_ms, dt_ms=dt_ms, type=jobtype.stored, payload=p)
            for i, p in zip(ids, payloads, strict=True)
        ]
        return ids


def adds_of(
    limits: TenantLimits, store: Store, journal: Journal, clock: Clock
) -> tuple[Adds, WaitingLimiter]:
    waiting = WaitingLimiter(cast(TenantStore, store), interval=1.0, clock=clock)
    adds = Adds(
        intake=cast(Intake, journal),
        limits=Limits(limits),
        rates=RateLimiter(0, 1, clock=clock),
        waiting=waiting,
        jobs=store,
        queuelog=cast(QueueLog, None),  # only adds with dependencies write to it
        metrics=Metrics(),
    )
    return adds, waiting


async def add(adds: Adds, n: int, **options: object) -> list[str]:
    payloads = [f"p{i}" for i in range(n)]
    result = await adds.add(
        "acme",
        "t",
        payloads,
        size=2 * n,
        create_ms=1,
        dt_ms=1,
        **options,  # type: ignore[arg-type]
    )
    return result.ids


async def settle(waiting: WaitingLimiter) -> None:
    """Let a count begun by the last add end."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_burst_faster_than_ingestion_stays_within_the_waiting_limit() -> None:
    # the store's count trails the journal: nothing is ingested during the burst,
    # while counts are taken again and again (each second of the clock)
    store, journal, clock = Store(), Journal(), Clock()
    adds, waiting = adds_of(TenantLimits(waiting=100), store, journal, clock)
    accepted = refused = 0
    for _ in range(50):
        clock.now += 2.0  # a count is due at every add
        try:
            accepted += len(await add(adds, 10))
        except OverWaiting:
            refused += 1
        await settle(waiting)
    assert store.counts > 10  # the counts did run during the burst
    assert accepted == len(journal.lines) == 100
    assert refused == 40


async def test_jobs_are_counted_until_the_count_holds_them() -> None:
    store, journal, clock = Store(), Journal(), Clock()
    adds, waiting = adds_of(TenantLimits(waiting=100), store, journal, clock)
    await add(adds, 100)
    # ingested: the store has them, the ingester says so; a count not yet taken
    store.waiting = 100
    waiting.stored(journal.lines)
    with pytest.raises(OverWaiting):
        await add(adds, 1)
    clock.now += 2.0
    with pytest.raises(OverWaiting):  # the count is begun by this add, not awaited
        await add(adds, 1)
    await settle(waiting)
    with pytest.raises(OverWaiting):  # the count holds them now: still 100
        await add(adds, 1)
    store.waiting = 40  # 60 ran
    clock.now += 2.0
    with pytest.raises(OverWaiting):
        await add(adds, 1)
    await settle(waiting)
    assert len(await add(adds, 60)) == 60
    with pytest.raises(OverWaiting):
        await add(adds, 1)


async def test_jobs_stored_while_a_count_runs_are_counted_until_the_next() -> None:
    store, journal, clock = Store(), Journal(), Clock()
    adds, waiting = adds_of(TenantLimits(waiting=10), store, journal, clock)
    await add(adds, 10)
    clock.now += 2.0
    with pytest.raises(OverWaiting):  # begins a count, which reads 0 (none stored yet)
        await add(adds, 1)
    store.waiting = 10
    waiting.stored(journal.lines)  # stored while that count runs: it may not hold them
    await settle(waiting)
    with pytest.raises(OverWaiting):
        await add(adds, 1)


async def test_a_journal_failure_gives_the_jobs_back() -> None:
    store, journal, clock = Store(), Journal(), Clock()
    adds, _ = adds_of(TenantLimits(waiting=10), store, journal, clock)
    journal.fail = True
    with pytest.raises(NotJournaled):
        await add(adds, 10)
    journal.fail = False
    assert len(await add(adds, 10)) == 10
    with pytest.raises(OverWaiting):
        await add(adds, 1)
    # follow-on jobs and ticks: admitted, then written
    adds.give_back("acme", 10)
    await adds.admit("acme", 10, 10)
    journal.fail = True
    with pytest.raises(JournalError):
        await adds.write(JobType("acme", "t"), ["x"] * 10)
    journal.fail = False
    await adds.admit("acme", 10, 10)  # given back by the failed write


async def test_the_quotas_in_order_and_what_never_fits() -> None:
    store, journal, clock = Store(), Journal(), Clock()
    adds, _ = adds_of(TenantLimits(rate=1, burst=5, waiting=3), store, journal, clock)
    with pytest.raises(NeverFits) as never:
        await add(adds, 6)
    assert never.value.quota == "rate"
    assert "over this tenant's burst of 5" in never.value.message
    with pytest.raises(NeverFits) as never:
        await add(adds, 4)  # within the burst, over the waiting limit
    assert never.value.quota == "waiting"
    assert "4 jobs in one request is over this tenant's waiting limit of 3" in str(never.value)
    assert len(await add(adds, 2)) == 2  # the refused 4 took nothing from the rate
    with pytest.raises(OverWaiting):
        await add(adds, 2)  # 3 tokens left, but 4 would wait
    assert len(await add(adds, 1)) == 1  # the refused 2 took no tokens either
    with pytest.raises(OverRate) as rate:
        await add(adds, 3)  # 2 tokens left: the rate is checked first
    assert rate.value.retry_after > 0
    with pytest.raises(NeverFits):
        adds.check("acme", 10 << 20)  # a body announced over the burst: before it is read
    assert len(journal.lines) == 3


async def test_an_add_cannot_depend_on_its_own_jobs() -> None:
    store, journal, clock = Store(), Journal(), Clock()
    adds, _ = adds_of(TenantLimits(), store, journal, clock)
    own = keyed_ids("acme", "k", 1)[0]
    with pytest.raises(BadDependencies, match="cannot depend on itself"):
        await add(adds, 1, key="k", options=JobOptions(after=(own,)))


def test_only_the_ids_a_daemon_made_are_added_once() -> None:
    """Ingestion copies a fresh batch straight in only when no other add can have
    journaled its ids (the keyed and tick ids of any add of that key or tick are
    the same)."""
    made = IdGenerator("7").next_ids(3) + IdGenerator("12").next_ids(20)
    assert all(added_once(i) for i in made)
    assert not added_once(keyed_ids("acme", "k", 1)[0])
    assert not added_once(tick_id("acme", "nightly", "v1", 1_700_000_000_000))
    assert not added_once("")
