"""ScheduleStore: schedules, and the due ticks that daemons take, add and record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queue_daemon.domain.schedules import Schedule, TickAdded
from queue_daemon.store.errors import LimitReached, NotFound
from tests.contract.conftest import Rig

NOW = datetime.now(UTC).replace(microsecond=0)


def schedule(name: str, *, version: str = "v1", fire: float = -1.0, client: str = "a") -> Schedule:
    return Schedule(
        client=client,
        name=name,
        type="t",
        cron="* * * * *",
        tz="UTC",
        payload="{}",
        version=version,
        created_at=NOW,
        next_fire=datetime.now(UTC) + timedelta(seconds=fire),
    )


async def test_schedules_are_added_replaced_listed_and_deleted(rig: Rig) -> None:
    s = rig.store
    put = await s.put_schedule(schedule("b"), 2)
    assert (put.name, put.version, put.last_tick) == ("b", "v1", None)
    await s.put_schedule(schedule("a"), 2)
    with pytest.raises(LimitReached):
        await s.put_schedule(schedule("c"), 2)
    await s.put_schedule(schedule("a", version="v2"), 2)  # a replacement is not new
    assert [(x.name, x.version) for x in await s.list_schedules("a")] == [("a", "v2"), ("b", "v1")]
    assert await s.list_schedules("other") == []
    await s.delete_schedule("a", "a")
    with pytest.raises(NotFound):
        await s.delete_schedule("a", "a")


async def test_a_due_schedule_is_held_by_one_daemon_then_recorded(rig: Rig) -> None:
    s = rig.store
    assert await s.next_schedule_due() is None
    await s.put_schedule(schedule("due"), 9)
    await s.put_schedule(schedule("later", fire=3600), 9)
    due = await s.next_schedule_due()
    assert due is not None and due <= 0
    assert await s.claim_schedules(sysid="1", limit=0, hold=60) == []
    (taken,) = await s.claim_schedules(sysid="1", limit=5, hold=60)
    assert (taken.name, taken.version, taken.revoked) == ("due", "v1", False)
    assert await s.claim_schedules(sysid="2", limit=5, hold=60) == []  # held by 1
    nxt = datetime.now(UTC) + timedelta(hours=2)
    tick = TickAdded("a", "due", "v1", taken.firing_at, nxt, "job1")
    await s.record_ticks([tick], sysid="2")  # not its hold: left alone
    await s.record_ticks([], sysid="1")
    await s.record_ticks([tick], sysid="1")
    (recorded, _) = await s.list_schedules("a")
    assert recorded.last_job == "job1" and recorded.next_fire == nxt
    assert await s.claim_schedules(sysid="2", limit=5, hold=60) == []


async def test_a_takeover_after_the_hold_keeps_the_tick(rig: Rig) -> None:
    s = rig.store
    await s.add_tenant("a", b"t")
    await s.put_schedule(schedule("due"), 9)
    (first,) = await s.claim_schedules(sysid="1", limit=5, hold=60)
    await rig.make_due("a", "due")
    (again,) = await s.claim_schedules(sysid="2", limit=5, hold=60)
    assert again.firing_at == first.firing_at
    stale = TickAdded("a", "due", "v1", first.firing_at, datetime.now(UTC), "j")
    await s.record_ticks([stale], sysid="1")  # 1 lost its hold
    assert (await s.list_schedules("a"))[0].last_job is None
    await s.revoke_tenant("a")
    await rig.make_due("a", "due")
    (revoked,) = await s.claim_schedules(sysid="3", limit=5, hold=60)
    assert revoked.revoked


async def test_deferred_ticks_come_back_after_the_delay(rig: Rig) -> None:
    s = rig.store
    await s.put_schedule(schedule("due"), 9)
    taken = await s.claim_schedules(sysid="1", limit=5, hold=60)
    await s.defer_ticks([], sysid="1", delay=0)
    await s.defer_ticks(taken, sysid="2", delay=0)  # not its hold: nothing
    assert await s.claim_schedules(sysid="2", limit=5, hold=60) == []
    await s.defer_ticks(taken, sysid="1", delay=0)
    (again,) = await s.claim_schedules(sysid="2", limit=5, hold=60)
    assert again.firing_at == taken[0].firing_at
    await s.put_schedule(schedule("due", version="v2"), 9)  # a new version drops the hold
    (fresh,) = await s.claim_schedules(sysid="3", limit=5, hold=60)
    assert fresh.version == "v2"
