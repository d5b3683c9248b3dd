"""Jobs that end move from jobs to jobs_done (migration 0013): an id inserted
again (a batch ingested twice) never brings back a job that moved meanwhile."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from queue_daemon.domain.jobs import NewJob, Release, ReleaseHow
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.store import queries
from queue_daemon.store.pg import PgStore
from queue_daemon.store.pg_release import release_params, write_releases


def job(job_id: str) -> NewJob:
    now = datetime.now(UTC)
    return NewJob(id=job_id, type="a-t", dt=now - timedelta(seconds=1), data="p", create_dt=now)


async def _waits_on_a_lock(conn: asyncpg.Connection, what: str) -> None:
    deadline = time.monotonic() + 10
    while not await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    ):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("how", ["few", "many", "opted"])
async def test_an_id_inserted_again_while_its_job_moves_to_jobs_done_is_skipped(
    store: PgStore, conn: asyncpg.Connection, pg_dsn: str, how: str
) -> None:
    """The insert's snapshot must not predate the move: it would find the job in
    neither table and store it a second time (and run it again)."""
    extra = [job(f"y{i}") for i in range(200 if how == "many" else 0)]
    assert await store.add_jobs([job("x1"), *extra], fresh=True) == 1 + len(extra)
    claimed = await store.claim("a-t", 1000, sysid="s1", lease=600.0)
    assert "x1" in {c.id for c in claimed}
    mover = await asyncpg.connect(pg_dsn)
    try:
        moving = mover.transaction()
        await moving.start()
        done = Release(id="x1", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="r")
        moved = await mover.fetch(queries.release.RELEASE, *release_params([done], "s1"))
        assert [r[0] for r in moved if r[0] is not None] == ["x1"]  # (None: the note's row)
        if how == "opted":
            again: asyncio.Task[int] = asyncio.create_task(
                store.add_opted([OptedJobs(jobs=[job("x1")], after=[], resolve_any=False)])
            )
        else:
            again = asyncio.create_task(store.add_jobs([job("x1"), *extra], fresh=False))
        await _waits_on_a_lock(conn, "the insert did not wait for the move")
        assert not again.done()
        await moving.commit()
        assert await asyncio.wait_for(again, 10) == 0
    finally:
        await mover.close()
    assert await conn.fetchval("SELECT count(*) FROM all_jobs WHERE id = 'x1'") == 1
    assert await conn.fetchval("SELECT count(*) FROM jobs_done WHERE id = 'x1'") == 1


async def test_a_batch_inserted_again_skips_its_live_and_its_done_jobs(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    batch = [job(f"z{i:03d}") for i in range(300)]
    assert await store.add_jobs(batch, fresh=True) == 300
    claimed = await store.claim("a-t", 100, sysid="s1", lease=600.0)
    ok = [Release(id=c.id, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for c in claimed]
    assert len(await store.release(ok, sysid="s1")) == 100
    assert await store.add_jobs(batch, fresh=False) == 0  # 200 live, 100 done
    assert await store.add_jobs(batch[:10], fresh=False) == 0  # the few rows' statement too
    assert await conn.fetchval("SELECT count(*) FROM all_jobs") == 300
    assert await conn.fetchval("SELECT count(*) FROM jobs_done") == 100


@pytest.mark.parametrize("how", [ReleaseHow.ARCHIVE, ReleaseHow.RETRY])
async def test_a_release_of_an_id_done_already_keeps_the_first(
    store: PgStore, conn: asyncpg.Connection, how: ReleaseHow
) -> None:
    """The release statements have no arbiter (it costs an archive 15%): an id in
    jobs_done already (stored twice by a race) makes them fail, and the release
    is made again with the statements that keep the first row."""
    assert await store.add_jobs([job("d1"), job("d2")], fresh=True) == 2
    claimed = await store.claim("a-t", 10, sysid="s1", lease=600.0)
    assert {c.id for c in claimed} == {"d1", "d2"}
    await conn.execute(
        "INSERT INTO jobs_done (id, type, data, create_dt, done_dt, attempts, code, exitcode,"
        " result) VALUES ('d1', 'a-t', 'p', now(), now(), 1, 'ok', 200, 'first')"
    )
    done = [
        Release(id="d1", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="second"),
        Release(id="d2", how=how, code="error", exitcode=500, result="r", delay=30.0),
    ]
    assert await store.release(done, sysid="s1") == {"d1", "d2"}
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE id = 'd1'") == 0
    assert await conn.fetchval("SELECT result FROM jobs_done WHERE id = 'd1'") == "first"
    in_jobs = await conn.fetchval("SELECT count(*) FROM jobs WHERE id = 'd2'")
    assert in_jobs == (1 if how == ReleaseHow.RETRY else 0)


async def test_a_plain_ok_batch_is_archived_where_its_claim_holds(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    """Runs that all ended ok, 200, without a result (queries.release.ARCHIVE_OK):
    archived with that outcome and their run, counted; a job another claim holds
    now is left as it is; an id done already keeps its first row."""
    assert await store.add_jobs([job(f"p{i}") for i in range(4)], fresh=True) == 4
    assert len(await store.claim("a-t", 10, sysid="s1", lease=600.0)) == 4
    await conn.execute("UPDATE jobs SET lock = 's9' WHERE id = 'p2'")  # claimed again elsewhere
    await conn.execute(
        "INSERT INTO jobs_done (id, type, data, create_dt, done_dt, attempts, code, exitcode,"
        " result) VALUES ('p3', 'a-t', 'p', now(), now(), 1, 'ok', 200, 'first')"
    )
    plain = [Release(id=f"p{i}", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for i in range(4)]
    assert await store.release(plain, sysid="s1") == {"p0", "p1", "p3"}
    rows = await conn.fetch(
        "SELECT id, code, exitcode, result, attempts, ran_by, run_dt IS NOT NULL AS ran"
        " FROM jobs_done ORDER BY id"
    )
    assert [tuple(r) for r in rows] == [
        ("p0", "ok", 200, None, 1, "s1", True),
        ("p1", "ok", 200, None, 1, "s1", True),
        ("p3", "ok", 200, "first", 1, None, False),
    ]
    assert await conn.fetchval("SELECT lock FROM jobs WHERE id = 'p2'") == "s9"
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE id <> 'p2'") == 0
    job_runs = await conn.fetchval("SELECT runs FROM all_jobs WHERE id = 'p0'")
    assert '"by": "sysid:s1"' in job_runs and '"code": "ok"' in job_runs, job_runs
    counted = "SELECT n FROM type_counts WHERE type = 'a-t' AND code = 'ok'"
    assert await conn.fetchval(counted) == 3


class _Sent:
    """A connection that records the statements sent through it."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.sent: list[str] = []

    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        self.sent.append(query)
        return await self.conn.fetch(query, *args)

    def transaction(self) -> object:
        return self.conn.transaction()


@pytest.mark.parametrize(
    ("release", "locks", "statement"),
    [
        (Release(id="q0", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200), "s1", "ARCHIVE_OK"),
        (Release(id="q0", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result=""), "s1",
         "ARCHIVE"),
        (Release(id="q0", how=ReleaseHow.ARCHIVE, code="ok", exitcode=201), "s1", "ARCHIVE"),
        (Release(id="q0", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, refund_attempt=True),
         "s1", "ARCHIVE"),
        (Release(id="q0", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200), {"q0": "s1"},
         "ARCHIVE"),
        (Release(id="q0", how=ReleaseHow.RETRY, code="error", exitcode=500, delay=1.0), "s1",
         "RELEASE"),
    ],
)  # fmt: skip
async def test_only_a_plain_ok_batch_under_one_lock_takes_the_short_statement(
    store: PgStore, conn: asyncpg.Connection, release: Release, locks: object, statement: str
) -> None:
    assert await store.add_jobs([job("q0")], fresh=True) == 1
    assert len(await store.claim("a-t", 10, sysid="s1", lease=600.0)) == 1
    sent = _Sent(conn)
    rows = await write_releases(sent, [release], locks, keep_first=False)  # type: ignore[arg-type]
    assert [r[0] for r in rows if r[0] is not None] == ["q0"]
    assert sent.sent == [getattr(queries.release, statement)]
