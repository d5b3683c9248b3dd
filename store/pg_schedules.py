"""Periodic jobs (``ScheduleStore``): the tenants' schedules, and the due ticks
that daemons take, add and record; see migration 0009 for the columns."""

from __future__ import annotations

from collections.abc import Sequence

from queue_daemon.domain.schedules import DueSchedule, Schedule, TickAdded
from queue_daemon.store import queries
from queue_daemon.store.errors import LimitReached, NotFound
from queue_daemon.store.pg_base import Db, row_as


class SchedulesPart:
    """Periodic jobs (``ScheduleStore``)."""

    def __init__(self, db: Db) -> None:
        self._db = db

    async def put_schedule(self, schedule: Schedule, max_schedules: int) -> Schedule:
        """Add or replace; ``LimitReached`` when new and the tenant has ``max_schedules``."""
        q = queries.schedules
        s = schedule
        async with self._db.conn() as conn, conn.transaction():
            await conn.execute(q.LOCK_CLIENT_SCHEDULES, s.client)
            if not await conn.fetchval(q.SCHEDULE_EXISTS, s.client, s.name):
                count = await conn.fetchval(q.COUNT_SCHEDULES, s.client)
                if count >= max_schedules:
                    raise LimitReached(f"{s.client} has {count} schedules, its limit")
            row = await conn.fetchrow(
                q.PUT_SCHEDULE,
                s.client,
                s.name,
                s.type,
                s.cron,
                s.tz,
                s.payload,
                s.version,
                s.next_fire,
            )
        assert row is not None  # INSERT ... RETURNING
        return row_as(Schedule, row)

    async def list_schedules(self, client: str) -> list[Schedule]:
        return [
            row_as(Schedule, r)
            for r in await self._db.fetch(queries.schedules.LIST_SCHEDULES, client)
        ]

    async def delete_schedule(self, client: str, name: str) -> None:
        if not await self._db.fetch(queries.schedules.DELETE_SCHEDULE, client, name):
            raise NotFound(f"no schedule {name!r}")

    async def claim_schedules(self, *, sysid: str, limit: int, hold: float) -> list[DueSchedule]:
        rows = await self._db.fetch(queries.schedules.CLAIM_DUE, limit, sysid, hold)
        return [row_as(DueSchedule, r) for r in rows]

    async def next_schedule_due(self) -> float | None:
        async with self._db.conn() as conn:
            seconds: float | None = await conn.fetchval(queries.schedules.NEXT_DUE)
        return seconds

    async def record_ticks(self, ticks: Sequence[TickAdded], *, sysid: str) -> None:
        if not ticks:
            return
        async with self._db.conn() as conn:
            columns = map(list, zip(*ticks, strict=True))
            await conn.execute(queries.schedules.RECORD_TICKS, *columns, sysid)

    async def defer_ticks(
        self, schedules: Sequence[DueSchedule], *, sysid: str, delay: float
    ) -> None:
        if not schedules:
            return
        async with self._db.conn() as conn:
            await conn.execute(
                queries.schedules.DEFER_TICKS,
                [s.client for s in schedules],
                [s.name for s in schedules],
                [s.version for s in schedules],
                sysid,
                delay,
            )
