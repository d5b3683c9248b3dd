"""A store of the layout before the archive (migration 0013) upgrades in place:
its waiting, delayed, blocked, running and done jobs each end once after it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.domain.views import TypeStats
from queue_daemon.store import queries
from queue_daemon.store.migrate import available_migrations, migrate
from queue_daemon.store.pg import PgStore

ARCHIVE = 13
LISTING = 14  # the listing index without running jobs
PAUSED = 15  # the paused types and tenants
DISPATCHED = 16  # the early insert as a function
BLOBS = 17  # blobs
PRIORITY = 18  # job priorities
PROGRESS = 19  # a running job's progress
KEYS = 20  # concurrency keys
TRACE = 21  # a job's trace
LOG = 22  # a job's log excerpt
LEASE = 600.0

# The jobs of a store before 0013, written as its statements left them: w1
# waiting, d1 due in a moment, r1 running (under sysid s1) with b1 blocked on
# it, x1 done an hour ago (with its run in ``runs``, as releases wrote it).
OLD_JOBS = """
INSERT INTO jobs (id, type, dt, lock, data, create_dt, done_dt, attempts, code, exitcode,
                  result, run_dt, runs, deps, deps_dt, dependents)
VALUES
  ('w1', 'a-t', now() - interval '1 second', '', 'w', now(), NULL, 0, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, false),
  ('d1', 'a-t', now() + interval '1 second', '', 'd', now(), NULL, 0, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, false),
  ('r1', 'a-t', now() + interval '10 minutes', 's1', 'r', now(), NULL, 1, NULL, NULL, NULL,
   now(), NULL, NULL, NULL, true),
  ('b1', 'a-t', 'infinity', '', 'b', now(), NULL, 0, NULL, NULL, NULL,
   NULL, NULL, 1, now(), false),
  ('x1', 'a-t', now() + interval '1000 years', '__done', 'x', now() - interval '2 hours',
   now() - interval '1 hour', 1, 'ok', 200, 'old', now() - interval '1 hour',
   '[{"by": "sysid:s0", "code": "ok", "ended": 1, "reason": "completed", "started": 1,
      "exitcode": 200}]', NULL, NULL, false)
"""


async def _migrate_to(conn: asyncpg.Connection, last: int) -> None:
    await conn.execute(queries.migrations.MIGRATIONS_TABLE)
    for migration in available_migrations():
        if migration.version <= last:
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(queries.migrations.MIGRATION_RECORD, migration.version)


def _ok(job_id: str) -> Release:
    return Release(id=job_id, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="done")


async def test_a_store_of_the_layout_before_0013_upgrades_in_place(pg_empty_dsn: str) -> None:
    conn = await asyncpg.connect(pg_empty_dsn)
    try:
        await _migrate_to(conn, ARCHIVE - 1)
        await conn.execute(OLD_JOBS)
        await conn.execute("INSERT INTO job_deps (dep, job) VALUES ('r1', 'b1')")
        # (the triggers count the waiting jobs, not a job inserted done)
        await conn.execute(
            "INSERT INTO type_counts (type, code, n, archived) VALUES ('a-t', 'ok', 1, 1)"
        )
        await conn.execute(
            "INSERT INTO sysids (sysid, holder, expires)"
            " VALUES ('s1', 'h', now() + interval '1 hour')"
        )
        assert await migrate(conn) == [
            ARCHIVE,
            LISTING,
            PAUSED,
            DISPATCHED,
            BLOBS,
            PRIORITY,
            PROGRESS,
            KEYS,
            TRACE,
            LOG,
        ]
    finally:
        await conn.close()

    store = await PgStore.connect(pg_empty_dsn, min_size=1, max_size=4)
    try:
        assert (await store.stats("a"))["t"] == TypeStats(
            waiting=1, scheduled=1, blocked=1, running=1, done_ok=1
        )
        # every job listed, the running one too (the listing index leaves it out)
        listed = await store.list_jobs("a", limit=10)
        assert sorted(j.id for j in listed.jobs) == ["b1", "d1", "r1", "w1", "x1"]
        # the running job's release (claimed before the upgrade) frees the blocked one
        assert await store.release([_ok("r1")], sysid="s1") == {"r1"}
        ran = {"r1"}
        deadline = datetime.now(UTC) + timedelta(seconds=30)
        while len(ran) < 4:
            assert datetime.now(UTC) < deadline, f"only {sorted(ran)} ran"
            claimed = [j.id for j in await store.claim("a-t", 10, sysid="s1", lease=LEASE)]
            assert not ran & set(claimed), claimed  # each job runs once
            ran |= set(claimed)
            assert await store.release([_ok(i) for i in claimed], sysid="s1") == set(claimed)
            if not claimed:
                await asyncio.sleep(0.1)  # d1 becomes due a second after it was written
        assert ran == {"r1", "w1", "d1", "b1"}
        assert await store.claim("a-t", 10, sysid="s1", lease=LEASE) == []
        assert (await store.stats("a"))["t"] == TypeStats(done_ok=5)
        old = await store.get_job("a", "x1")
        assert (old.code, old.result, old.runs) == (
            "ok",
            "old",
            [
                {
                    "by": "sysid:s0",
                    "code": "ok",
                    "ended": 1,
                    "reason": "completed",
                    "started": 1,
                    "exitcode": 200,
                }
            ],
        )
        for job_id in ran:
            job = await store.get_job("a", job_id)
            assert (job.code, job.result) == ("ok", "done"), job
            assert job.runs is not None and len(job.runs) == 1, job.runs
            assert job.runs[0]["by"] == "sysid:s1" and job.runs[0]["reason"] == "completed"
        # the archive and the old done rows are purged alike
        assert await store.purge(0) == {"a-t": 5}
        assert (await store.stats("a")) == {}
    finally:
        await store.close()
