"""Periodic jobs (``ScheduleStore``): schedules, and the due ticks daemons take."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from queue_daemon.domain.schedules import DueSchedule, Schedule, TickAdded
from queue_daemon.store.errors import LimitReached, NotFound
from tests.fakes.store.tenants import Tenants


@dataclass(slots=True)
class ScheduleRow:
    schedule: Schedule
    due_at: datetime
    firing_by: str | None = None
    firing_at: datetime | None = None


class Schedules(Tenants):
    def __init__(self) -> None:
        super().__init__()
        self.schedules: dict[tuple[str, str], ScheduleRow] = {}

    async def put_schedule(self, schedule: Schedule, max_schedules: int) -> Schedule:
        self._call("put_schedule")
        key = (schedule.client, schedule.name)
        old = self.schedules.get(key)
        if old is None:
            count = sum(1 for c, _ in self.schedules if c == schedule.client)
            if count >= max_schedules:
                raise LimitReached(f"{schedule.client} has {count} schedules, its limit")
        # a replaced schedule keeps its last tick and job
        stored = replace(
            schedule,
            created_at=self.now(),
            last_tick=None if old is None else old.schedule.last_tick,
            last_job=None if old is None else old.schedule.last_job,
        )
        self.schedules[key] = ScheduleRow(stored, due_at=schedule.next_fire)
        return stored

    async def list_schedules(self, client: str) -> list[Schedule]:
        self._call("list_schedules")
        return [row.schedule for (c, _), row in sorted(self.schedules.items()) if c == client]

    async def delete_schedule(self, client: str, name: str) -> None:
        self._call("delete_schedule")
        if self.schedules.pop((client, name), None) is None:
            raise NotFound(f"no schedule {name!r}")

    async def claim_schedules(self, *, sysid: str, limit: int, hold: float) -> list[DueSchedule]:
        self._call("claim_schedules")
        now = self.now()
        due = sorted(
            (row for row in self.schedules.values() if row.due_at <= now),
            key=lambda row: row.due_at,
        )[: max(0, limit)]
        taken = []
        for row in due:
            row.due_at, row.firing_by = now + timedelta(seconds=hold), sysid
            row.firing_at = row.firing_at or now
            s = row.schedule
            tenant = self.tenants.get(s.client)
            taken.append(
                DueSchedule(
                    client=s.client,
                    name=s.name,
                    type=s.type,
                    cron=s.cron,
                    tz=s.tz,
                    payload=s.payload,
                    version=s.version,
                    next_fire=s.next_fire,
                    firing_at=row.firing_at,
                    now=now,
                    revoked=tenant is not None and tenant.revoked_at is not None,
                )
            )
        return taken

    async def next_schedule_due(self) -> float | None:
        self._call("next_schedule_due")
        if not self.schedules:
            return None
        soonest = min(row.due_at for row in self.schedules.values())
        return (soonest - self.now()).total_seconds()

    def _holding(self, client: str, name: str, version: str, sysid: str) -> ScheduleRow | None:
        row = self.schedules.get((client, name))
        if row is None or row.schedule.version != version or row.firing_by != sysid:
            return None
        return row

    async def record_ticks(self, ticks: Sequence[TickAdded], *, sysid: str) -> None:
        self._call("record_ticks")
        for tick in ticks:
            row = self._holding(tick.client, tick.name, tick.version, sysid)
            if row is None:
                continue
            row.schedule = replace(
                row.schedule, next_fire=tick.next_fire, last_tick=tick.tick, last_job=tick.job
            )
            row.due_at, row.firing_by, row.firing_at = tick.next_fire, None, None

    async def defer_ticks(
        self, schedules: Sequence[DueSchedule], *, sysid: str, delay: float
    ) -> None:
        self._call("defer_ticks")
        for s in schedules:
            row = self._holding(s.client, s.name, s.version, sysid)
            if row is not None:
                row.due_at = self.now() + timedelta(seconds=delay)
