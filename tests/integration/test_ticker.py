"""The ticker on a real store and real journals: a daemon that dies after
journaling a tick, before recording it, leaves it to another daemon, which
journals the same job id; ingesting both journals keeps one job."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from queue_daemon.domain.jobs import NewJob
from queue_daemon.domain.schedules import Schedule, TickAdded
from queue_daemon.engine.admit.adds import Adds
from queue_daemon.engine.admit.ids import IdGenerator, tick_id
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits, TenantLimits
from queue_daemon.engine.admit.quotas import RateLimiter, WaitingLimiter
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.engine.schedule.ticker import Ticker
from queue_daemon.journal import Journal
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.store.errors import StoreUnavailable
from queue_daemon.store.pg import PgStore

YEARLY = "0 0 1 1 *"


class DiesBeforeRecording:
    """A daemon's view of the store that fails when the tick would be recorded."""

    def __init__(self, store: PgStore) -> None:
        self.real = store
        self.claim_schedules = store.claim_schedules
        self.next_schedule_due = store.next_schedule_due
        self.defer_ticks = store.defer_ticks

    async def record_ticks(self, ticks: Sequence[TickAdded], *, sysid: str) -> None:
        raise StoreUnavailable("the daemon died here")


async def _ticker(
    store: PgStore | DiesBeforeRecording,
    tmp_path: Path,
    sysid: str,
    *,
    waiting: WaitingLimiter | None = None,
    limits: TenantLimits | None = None,
) -> tuple[Ticker, Journal, QueueLog]:
    """A daemon's ticker; with no ``waiting`` limiter, no waiting limit (none is counted)."""
    journal = await Journal.open(tmp_path / f"journal-{sysid}")
    queuelog = QueueLog(tmp_path / f"queue-{sysid}.log", sysid=sysid)
    metrics = Metrics()
    real = store if isinstance(store, PgStore) else store.real
    adds = Adds(
        intake=Intake(journal=journal, ids=IdGenerator(sysid), queuelog=queuelog, metrics=metrics),
        limits=Limits(limits or TenantLimits(waiting=0)),
        rates=RateLimiter(0, 1),
        waiting=waiting or WaitingLimiter(real),
        jobs=real,
        queuelog=queuelog,
        metrics=metrics,
    )
    ticker = Ticker(
        store=store,  # type: ignore[arg-type]  # the ScheduleStore calls only
        adds=adds,
        queuelog=queuelog,
        metrics=metrics,
        sysid=sysid,
        hold=0.3,
    )
    return ticker, journal, queuelog


def yearly(client: str, fire: datetime) -> Schedule:
    return Schedule(
        client=client,
        name="yearly",
        type="report",
        cron=YEARLY,
        tz="UTC",
        payload="p",
        version="v1",
        created_at=fire,
        next_fire=fire,
    )


async def _ingest(journal: Journal, store: PgStore) -> None:
    ingester = Ingester(journal, store, ingest_batch=100, ingest_workers=1)
    task = asyncio.create_task(ingester.run())
    try:
        assert await ingester.drain(10)
    finally:
        ingester.stop()
        await asyncio.wait_for(task, 10)


async def test_a_tick_journaled_by_a_daemon_that_died_is_added_once(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    fire = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=2)
    await store.put_schedule(yearly("acme", fire), 1000)
    dying, journal1, log1 = await _ticker(DiesBeforeRecording(store), tmp_path, "1")
    taking_over, journal2, log2 = await _ticker(store, tmp_path, "2")
    try:
        with pytest.raises(StoreUnavailable):
            await dying.step()  # journaled, not recorded
        assert journal1.lag.unread_lines == 1
        assert await taking_over.step() > 0.05  # held by the first for its hold
        deadline = time.monotonic() + 10
        while journal2.lag.unread_lines == 0:
            assert time.monotonic() < deadline, "the tick was not taken over"
            await asyncio.sleep(await taking_over.step())
        [listed] = await store.list_schedules("acme")
        job = tick_id("acme", "yearly", "v1", int(fire.timestamp() * 1000))
        assert (listed.last_tick, listed.last_job) == (fire, job)
        assert listed.next_fire == datetime(datetime.now(UTC).year + 1, 1, 1, tzinfo=UTC)
        await _ingest(journal1, store)
        await _ingest(journal2, store)
        rows = await conn.fetch("SELECT id, type, data FROM jobs")
        assert [tuple(r) for r in rows] == [(job, "acme-report", "p")]
        assert await taking_over.step() == 1.0  # nothing due for a year: the poll
    finally:
        for journal, log in ((journal1, log1), (journal2, log2)):
            await journal.close()
            await log.close()


async def test_a_revoked_tenants_schedule_adds_nothing_until_it_is_back(
    store: PgStore, tmp_path: Path
) -> None:
    fire = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=2)
    await store.add_tenant("gone", b"h1")
    await store.revoke_tenant("gone")
    await store.put_schedule(yearly("gone", fire), 1000)
    ticker, journal, log = await _ticker(store, tmp_path, "1")
    try:
        assert await ticker.step() == 0.0  # taken, and held back
        assert await ticker.step() == 1.0  # not due again within the poll
        seconds = await store.next_schedule_due()
        assert seconds is not None and 50 < seconds <= 60
        assert journal.lag.unread_lines == 0
        [listed] = await store.list_schedules("gone")
        assert (listed.next_fire, listed.last_tick) == (fire, None)
    finally:
        await journal.close()
        await log.close()


async def test_a_tick_over_the_waiting_limit_waits_and_is_added_when_it_fits(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    fire = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=2)
    await store.put_schedule(yearly("acme", fire), 1000)
    await store.add_jobs([NewJob(id="w1", type="acme-other", dt=fire, data="p", create_dt=fire)])
    waiting = WaitingLimiter(store, interval=0.2)
    ticker, journal, log = await _ticker(
        store,
        tmp_path,
        "1",
        waiting=waiting,
        limits=TenantLimits(waiting=1),
    )
    try:
        assert await ticker.step() == 0.0  # taken, over the limit: given back
        assert journal.lag.unread_lines == 0
        seconds = await store.next_schedule_due()
        assert seconds is not None and 0 < seconds <= 1.0
        await conn.execute("DELETE FROM jobs")  # the waiting job is gone
        deadline = time.monotonic() + 10
        while journal.lag.unread_lines == 0:
            assert time.monotonic() < deadline, "the deferred tick was never added"
            await asyncio.sleep(await ticker.step())
        [listed] = await store.list_schedules("acme")
        # the same tick, late, not a later one
        assert listed.last_tick == fire
        assert listed.last_job == tick_id("acme", "yearly", "v1", int(fire.timestamp() * 1000))
    finally:
        await waiting.close()
        await journal.close()
        await log.close()
