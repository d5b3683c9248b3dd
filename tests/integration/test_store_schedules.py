"""Schedules in the store (migration 0009): add, replace, list, delete, the
tenant's limit, and the hold by which one daemon adds a due tick."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from queue_daemon.domain.jobs import NewJob
from queue_daemon.domain.schedules import Schedule, TickAdded
from queue_daemon.store.errors import LimitReached, NotFound
from queue_daemon.store.pg import PgStore


def schedule(
    name: str = "nightly",
    *,
    client: str = "acme",
    version: str = "v1",
    next_fire: datetime | None = None,
) -> Schedule:
    return Schedule(
        client=client,
        name=name,
        type="report",
        cron="0 3 * * *",
        tz="Europe/Berlin",
        payload='{"full":true}',
        version=version,
        created_at=datetime.now(UTC),
        next_fire=next_fire or datetime.now(UTC) + timedelta(hours=1),
    )


async def _past_due(store: PgStore, name: str = "tick", version: str = "v1") -> datetime:
    fire = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    await store.put_schedule(schedule(name, version=version, next_fire=fire), 1000)
    return fire


async def test_add_list_replace_delete(store: PgStore) -> None:
    stored = await store.put_schedule(schedule("b"), 1000)
    assert (stored.name, stored.type, stored.tz, stored.last_tick) == (
        "b",
        "report",
        "Europe/Berlin",
        None,
    )
    await store.put_schedule(schedule("a"), 1000)
    await store.put_schedule(schedule("a", client="other"), 1000)
    replaced = await store.put_schedule(schedule("b", version="v2"), 1000)
    assert replaced.version == "v2"
    assert [s.name for s in await store.list_schedules("acme")] == ["a", "b"]
    assert [s.version for s in await store.list_schedules("acme")] == ["v1", "v2"]
    await store.delete_schedule("acme", "a")
    with pytest.raises(NotFound):
        await store.delete_schedule("acme", "a")
    with pytest.raises(NotFound):  # another tenant's of the same name is not ours
        await store.delete_schedule("nobody", "b")
    assert [s.name for s in await store.list_schedules("acme")] == ["b"]
    assert [s.name for s in await store.list_schedules("other")] == ["a"]


async def test_the_tenants_limit_counts_new_schedules_only(store: PgStore) -> None:
    await store.put_schedule(schedule("a"), 2)
    await store.put_schedule(schedule("b"), 2)
    with pytest.raises(LimitReached):
        await store.put_schedule(schedule("c"), 2)
    await store.put_schedule(schedule("b", version="v2"), 2)  # a replacement fits
    await store.put_schedule(schedule("c", client="other"), 2)  # another tenant's count
    # concurrent adds of new schedules cannot pass the limit together
    results = await asyncio.gather(
        *(store.put_schedule(schedule(f"n{i}", client="race"), 3) for i in range(8)),
        return_exceptions=True,
    )
    assert sum(not isinstance(r, Exception) for r in results) == 3
    assert all(isinstance(r, LimitReached) for r in results if isinstance(r, Exception))


async def test_a_due_schedule_is_held_by_one_daemon_until_its_tick_is_recorded(
    store: PgStore,
) -> None:
    fire = await _past_due(store)
    await store.put_schedule(schedule("later"), 1000)  # not due
    [due] = await store.claim_schedules(sysid="1", limit=10, hold=30)
    assert (due.name, due.next_fire, due.version) == ("tick", fire, "v1")
    assert due.firing_at <= due.now and due.now - due.firing_at < timedelta(seconds=1)
    assert await store.claim_schedules(sysid="2", limit=10, hold=30) == []
    seconds = await store.next_schedule_due()
    assert seconds is not None and 25 < seconds <= 30  # the hold
    nxt = fire + timedelta(hours=1)
    # another daemon's record, or one for an older version, changes nothing
    await store.record_ticks([TickAdded("acme", "tick", "v1", fire, nxt, "s1")], sysid="2")
    await store.record_ticks([TickAdded("acme", "tick", "v0", fire, nxt, "s1")], sysid="1")
    [listed] = [s for s in await store.list_schedules("acme") if s.name == "tick"]
    assert (listed.next_fire, listed.last_tick) == (fire, None)
    await store.record_ticks([TickAdded("acme", "tick", "v1", fire, nxt, "s1")], sysid="1")
    [listed] = [s for s in await store.list_schedules("acme") if s.name == "tick"]
    assert (listed.next_fire, listed.last_tick, listed.last_job) == (nxt, fire, "s1")
    assert await store.claim_schedules(sysid="2", limit=10, hold=30) == []


async def test_a_lapsed_hold_is_taken_over_for_the_same_tick(store: PgStore) -> None:
    await _past_due(store)
    [first] = await store.claim_schedules(sysid="1", limit=10, hold=0.3)
    deadline = time.monotonic() + 10
    while not (taken := await store.claim_schedules(sysid="2", limit=10, hold=30)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    [second] = taken
    # the same moment fixes the tick: the daemon taking over adds the same one
    assert second.firing_at == first.firing_at and second.now > first.now
    # the first daemon's late record is refused: the row is the second's now
    nxt = first.next_fire + timedelta(hours=1)
    await store.record_ticks(
        [TickAdded("acme", "tick", "v1", first.next_fire, nxt, "s1")], sysid="1"
    )
    [listed] = await store.list_schedules("acme")
    assert listed.last_tick is None


async def test_a_deferred_tick_is_due_again_for_the_same_moment(store: PgStore) -> None:
    await _past_due(store)
    [first] = await store.claim_schedules(sysid="1", limit=10, hold=30)
    await store.defer_ticks([first], sysid="1", delay=0.3)
    seconds = await store.next_schedule_due()
    assert seconds is not None and seconds <= 0.3
    deadline = time.monotonic() + 10
    while not (taken := await store.claim_schedules(sysid="2", limit=10, hold=30)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert taken[0].firing_at == first.firing_at


async def test_replacing_a_held_schedule_drops_the_hold(store: PgStore) -> None:
    fire = await _past_due(store)
    [held] = await store.claim_schedules(sysid="1", limit=10, hold=30)
    await _past_due(store, version="v2")
    [again] = await store.claim_schedules(sysid="2", limit=10, hold=30)
    assert again.version == "v2" and again.firing_at > held.firing_at
    # the old version's tick, added by the first daemon, is not recorded on the new
    nxt = fire + timedelta(hours=1)
    await store.record_ticks([TickAdded("acme", "tick", "v1", fire, nxt, "s1")], sysid="1")
    [listed] = await store.list_schedules("acme")
    assert listed.last_job is None


async def test_no_schedules_no_due_time(store: PgStore) -> None:
    assert await store.next_schedule_due() is None
    assert await store.claim_schedules(sysid="1", limit=10, hold=30) == []
    await store.record_ticks([], sysid="1")
    await store.defer_ticks([], sysid="1", delay=1)


async def test_a_tick_journaled_again_after_its_job_ran_adds_nothing(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    # a daemon that takes over a tick journals its job again: ingestion keeps the
    # first, whether it still waits or has already run
    now = datetime.now(UTC)
    job = NewJob(id="sabc", type="acme-report", dt=now, data="p", create_dt=now)
    assert await store.add_jobs([job]) == 1
    await conn.execute("UPDATE jobs SET lock = '__done', done_dt = now(), code = 'ok'")
    assert await store.add_jobs([job, job]) == 0
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 1
    assert await conn.fetchval("SELECT lock FROM jobs") == "__done"
