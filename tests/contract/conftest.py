"""The ``rig`` fixture: a store of each kind (``fake``: tests/fakes/store, ``pg``:
``PgStore`` on a fresh database) with the few moves a test makes behind the
store's back, as River's riverdrivertest does: age a job's times, read a row,
let a sysid's lease lapse, age a pull worker or a schedule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import asyncpg
import pytest

from queue_daemon.domain.jobs import NewJob
from queue_daemon.store.pg import PgStore
from queue_daemon.store.ports import Store
from tests.fakes.store import FakeStore

COLUMNS = ("dt", "create_dt", "done_dt", "deadline", "run_dt")


def new(job_id: str, type: str = "a-t", *, ago: float = 1.0, data: str = "p") -> NewJob:
    """A job due ``ago`` seconds ago (in the future when negative), created then."""
    at = datetime.now(UTC) - timedelta(seconds=ago)
    return NewJob(job_id, type, at, data, min(at, datetime.now(UTC)))


@dataclass(frozen=True, slots=True)
class Row:
    """What a test reads of a job's row beyond what the ports return."""

    lock: str
    attempts: int
    code: str | None
    exitcode: int | None
    result: str | None
    dependents: bool
    due: bool  # lock '' and dt <= now
    blocked: bool  # dt is 'infinity'


class Rig(Protocol):
    kind: str  # "fake" or "pg"

    @property
    def store(self) -> Store: ...

    async def age(self, job_id: str, **seconds_ago: float) -> None:
        """Set the named times of a job (``COLUMNS``) to now minus the seconds."""

    async def row(self, job_id: str) -> Row | None: ...

    async def lapse_sysid(self, sysid: str) -> None: ...

    async def age_worker(self, client: str, name: str, seconds_ago: float) -> None: ...

    async def make_due(self, client: str, name: str) -> None:
        """A schedule (held or not) is due now."""


class FakeRig:
    kind = "fake"

    def __init__(self) -> None:
        self.fake = FakeStore()
        self.store = self.fake

    async def age(self, job_id: str, **seconds_ago: float) -> None:
        row = self.fake.rows[job_id]
        now = self.fake.now()
        for column, seconds in seconds_ago.items():
            assert column in COLUMNS
            setattr(row, column, now - timedelta(seconds=seconds))

    async def row(self, job_id: str) -> Row | None:
        r = self.fake.rows.get(job_id)
        if r is None:
            return None
        blocked = r.dt.year == 9999
        return Row(
            lock=r.lock,
            attempts=r.attempts,
            code=r.code,
            exitcode=r.exitcode,
            result=r.result,
            dependents=r.dependents,
            due=r.lock == "" and r.dt <= self.fake.now(),
            blocked=blocked,
        )

    async def lapse_sysid(self, sysid: str) -> None:
        self.fake.sysids[sysid].expires = self.fake.now() - timedelta(seconds=1)

    async def age_worker(self, client: str, name: str, seconds_ago: float) -> None:
        seen = self.fake.workers_seen[(client, name)]
        seen.last_seen = self.fake.now() - timedelta(seconds=seconds_ago)

    async def make_due(self, client: str, name: str) -> None:
        self.fake.schedules[(client, name)].due_at = self.fake.now() - timedelta(seconds=1)


class PgRig:
    kind = "pg"

    def __init__(self, store: PgStore, conn: asyncpg.Connection) -> None:
        self.store = store
        self.conn = conn

    async def age(self, job_id: str, **seconds_ago: float) -> None:
        for column, seconds in seconds_ago.items():
            assert column in COLUMNS  # a validated identifier
            # a job done by a release is in jobs_done (0013), which has no dt
            tables = ("jobs",) if column == "dt" else ("jobs", "jobs_done")
            for table in tables:
                await self.conn.execute(
                    f"UPDATE {table} SET {column} = now() - make_interval(secs => $2)"
                    " WHERE id = $1",
                    job_id,
                    float(seconds),
                )

    async def row(self, job_id: str) -> Row | None:
        r: Any = await self.conn.fetchrow(
            "SELECT lock, attempts, code, exitcode, result, dependents,"
            " lock = '' AND dt <= now() AS due, dt = 'infinity' AS blocked"
            " FROM all_jobs WHERE id = $1",
            job_id,
        )
        return None if r is None else Row(**dict(r.items()))

    async def lapse_sysid(self, sysid: str) -> None:
        await self.conn.execute(
            "UPDATE sysids SET expires = now() - interval '1 second' WHERE sysid = $1", sysid
        )

    async def age_worker(self, client: str, name: str, seconds_ago: float) -> None:
        await self.conn.execute(
            "UPDATE workers SET last_seen = now() - make_interval(secs => $3)"
            " WHERE client = $1 AND name = $2",
            client,
            name,
            float(seconds_ago),
        )

    async def make_due(self, client: str, name: str) -> None:
        await self.conn.execute(
            "UPDATE schedules SET due_at = now() - interval '1 second'"
            " WHERE client = $1 AND name = $2",
            client,
            name,
        )


@pytest.fixture(params=["fake", "pg"])
def rig_dsn(request: pytest.FixtureRequest) -> str | None:
    """None for the fake; a fresh database's DSN for PostgreSQL (a sync fixture:
    the database is made outside the test's event loop)."""
    if request.param == "fake":
        return None
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


@pytest.fixture
async def rig(rig_dsn: str | None) -> AsyncIterator[Rig]:
    if rig_dsn is None:
        yield FakeRig()
        return
    store = await PgStore.connect(rig_dsn, min_size=1, max_size=4)
    conn = await asyncpg.connect(rig_dsn)
    try:
        yield PgRig(store, conn)
    finally:
        await conn.close()
        await store.close()
