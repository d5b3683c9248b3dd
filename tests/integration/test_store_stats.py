"""PgStore.stats from type_counts and the partial indexes: exact counts through
every change of a job, under concurrent releases, per tenant, without reading
done jobs."""

from __future__ import annotations

import asyncio
from dataclasses import fields
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from bench import storefill
from queue_daemon.domain.jobs import NewJob, Release, ReleaseHow
from queue_daemon.domain.views import TypeStats
from queue_daemon.store import queries
from queue_daemon.store.migrate import available_migrations
from queue_daemon.store.pg import PgStore
from tests.integration.plans import pages_read

LEASE = 600.0


def job(job_id: str, stored_type: str = "a-t", *, dt: datetime | None = None) -> NewJob:
    now = datetime.now(UTC)
    return NewJob(
        id=job_id, type=stored_type, dt=dt or now - timedelta(seconds=1), data="{}", create_dt=now
    )


# The old query: every job of the tenant, done ones included. The reference
# that the new one must agree with.
FULL_SCAN_STATS = """
SELECT substr(type, strpos(type, '-') + 1) AS type,
       count(*) FILTER (WHERE lock = '' AND dt <= now()) AS waiting,
       count(*) FILTER (WHERE lock = '' AND dt > now()) AS scheduled,
       count(*) FILTER (WHERE lock <> '' AND lock <> '__done') AS running,
       count(*) FILTER (WHERE lock = '__done' AND code = 'ok') AS done_ok,
       count(*) FILTER (WHERE lock = '__done' AND code = 'failed') AS done_failed,
       count(*) FILTER (WHERE lock = '__done' AND code = 'error') AS done_error
FROM all_jobs
WHERE split_part(type, '-', 1) = $1
GROUP BY type
"""


async def reference(conn: asyncpg.Connection, client: str) -> dict[str, TypeStats]:
    return {
        r["type"]: TypeStats(**{k: v for k, v in r.items() if k != "type"})
        for r in await conn.fetch(FULL_SCAN_STATS, client)
    }


async def check(store: PgStore, conn: asyncpg.Connection, client: str = "a") -> None:
    got = await store.stats(client)
    assert got == await reference(conn, client)
    assert all(type(getattr(s, f.name)) is int for s in got.values() for f in fields(s)), got
    # no counter ever goes negative, and every done job is counted under its code
    assert await conn.fetchval("SELECT count(*) FROM type_counts WHERE n < 0") == 0
    drift = await conn.fetch(
        "SELECT type, code, n, m FROM type_counts c FULL JOIN "
        "(SELECT type, coalesce(code, '') AS code, count(*) AS m FROM all_jobs "
        " WHERE lock = '__done' GROUP BY 1, 2) j USING (type, code) "
        "WHERE coalesce(n, 0) <> coalesce(m, 0)"
    )
    assert drift == []
    # the waiting counts (0012) agree with the jobs, before and after a fold
    for _ in range(2):
        assert await state_sums(conn) == await conn.fetch(ACTUAL_STATES)
        assert await store.fold_counts()
    assert await conn.fetchval("SELECT count(*) FROM job_state_moves") == 0
    assert await conn.fetchval("SELECT count(*) FROM job_states WHERE n <= 0") == 0


# Done jobs put back by hand, wherever they are (jobs, or jobs_done since 0013),
# under ``lock`` ('' waiting and due, or a sysid: running): all of them, or ``ids``.
RERUN_BY_HAND = """
WITH gone AS (
    DELETE FROM jobs_done WHERE $1::text[] IS NULL OR id = ANY($1::text[])
    RETURNING id, type, data, create_dt, attempts, code, exitcode, result
), back AS (
    INSERT INTO jobs (id, type, dt, lock, data, create_dt, attempts, code, exitcode, result)
    SELECT id, type, now(), $2, data, create_dt, attempts, code, exitcode, result FROM gone
)
UPDATE jobs SET lock = $2, dt = now()
WHERE lock = '__done' AND ($1::text[] IS NULL OR id = ANY($1::text[]))
"""


async def rerun_by_hand(
    conn: asyncpg.Connection, ids: list[str] | None = None, *, lock: str = ""
) -> None:
    await conn.execute(RERUN_BY_HAND, ids, lock)


ACTUAL_STATES = """
SELECT type, count(*) FILTER (WHERE dt <> 'infinity') AS queued,
       count(*) FILTER (WHERE dt = 'infinity') AS blocked
FROM jobs WHERE lock = '' GROUP BY type ORDER BY type
"""


async def state_sums(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    sums = queries.counts.STATE_SUMS.format(scope="true")
    return await conn.fetch(f"SELECT type, queued, blocked FROM ({sums}) s ORDER BY type")


def release(job_id: str, how: ReleaseHow, code: str | None = None) -> Release:
    exitcode = {"ok": 200, "failed": 404, "error": 500, "retry": 503}.get(code or "")
    return Release(id=job_id, how=how, code=code, exitcode=exitcode, result="r")


async def test_migration_0003_is_shipped() -> None:
    assert 3 in [m.version for m in available_migrations()]


async def test_counts_through_every_change(store: PgStore, conn: asyncpg.Connection) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    await store.add_jobs(
        [job(f"j{i:02d}") for i in range(12)]
        + [job("s1", dt=future), job("u1", "a-u"), job("u2", "a-u"), job("other", "b-t")]
    )
    assert await store.stats("a") == {
        "t": TypeStats(waiting=12, scheduled=1),
        "u": TypeStats(waiting=2),
    }
    await check(store, conn)

    claimed = [j.id for j in await store.claim("a-t", 10, sysid="s1", lease=LEASE)]
    assert len(claimed) == 10
    assert (await store.stats("a"))["t"] == TypeStats(waiting=2, scheduled=1, running=10)
    await check(store, conn)

    j = sorted(claimed)
    applied = await store.release(
        [
            release(j[0], ReleaseHow.ARCHIVE, "ok"),
            release(j[1], ReleaseHow.ARCHIVE, "ok"),
            release(j[2], ReleaseHow.ARCHIVE, "failed"),
            release(j[3], ReleaseHow.ARCHIVE, "error"),
            release(j[4], ReleaseHow.ARCHIVE, "retry"),  # attempts ran out
            release(j[5], ReleaseHow.RETRY, "error"),  # scheduled again
            release(j[6], ReleaseHow.UNGET),
            release(j[7], ReleaseHow.ARCHIVE),  # no code: NULL, counted under ''
        ],
        sysid="s1",
    )
    assert applied == set(j[:8])
    # waiting 2 + unget; the retry's delay is 0 so it is eligible at once
    assert (await store.stats("a"))["t"] == TypeStats(
        waiting=4, scheduled=1, running=2, done_ok=2, done_failed=1, done_error=1
    )
    await check(store, conn)

    # a release that does not apply (not ours any more) changes nothing
    assert await store.release([release(j[0], ReleaseHow.ARCHIVE, "error")], sysid="s1") == set()
    assert await store.release([release(j[8], ReleaseHow.ARCHIVE, "ok")], sysid="s2") == set()
    await check(store, conn)

    await store.cancel_job("a", "s1")
    await store.cancel_job("a", "u1")
    stats = await store.stats("a")
    assert stats["t"] == TypeStats(waiting=4, running=2, done_ok=2, done_failed=2, done_error=1)
    assert stats["u"] == TypeStats(waiting=1, done_failed=1)
    await check(store, conn)

    # an operator re-running done jobs by hand is counted too
    await rerun_by_hand(conn, [j[0], j[3]])
    assert (await store.stats("a"))["t"].done_ok == 1
    await check(store, conn)

    # purge: the cancelled and archived jobs, all done before now
    purged = await store.purge(-60)
    assert sum(purged.values()) == 6  # j1 j2 j4 j7 (archived), s1 u1 (cancelled)
    stats = await store.stats("a")
    assert stats["t"] == TypeStats(waiting=6, running=2)
    assert stats["u"] == TypeStats(waiting=1)
    await check(store, conn)
    assert await store.stats("b") == {"t": TypeStats(waiting=1)}


async def test_types_with_only_zero_counts_are_omitted(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    await store.add_jobs([job("x1", "a-x"), job("y1", "a-y")])
    await store.claim("a-x", 1, sysid="s1", lease=LEASE)
    await store.claim("a-y", 1, sysid="s1", lease=LEASE)
    await store.release(
        [release("x1", ReleaseHow.ARCHIVE, "ok"), release("y1", ReleaseHow.ARCHIVE, "retry")],
        sysid="s1",
    )
    # a type whose only job is done with another code is listed, as before
    assert await store.stats("a") == {"x": TypeStats(done_ok=1), "y": TypeStats()}
    await check(store, conn)
    assert await store.purge(-60) == {"a-x": 1, "a-y": 1}
    assert await store.stats("a") == {}
    assert await conn.fetchval("SELECT count(*) FROM type_counts WHERE n <> 0") == 0


async def test_concurrent_releases_exact(store: PgStore, conn: asyncpg.Connection) -> None:
    types = ["a-t0", "a-t1", "a-t2"]
    await store.add_jobs([job(f"j{i:05d}", types[i % 3]) for i in range(3000)])
    claimed: list[str] = []
    for t in types:
        claimed += [c.id for c in await store.claim(t, 1000, sysid="s1", lease=LEASE)]
    assert len(claimed) == 3000
    codes = ["ok", "failed", "error", "retry"]
    # ten disjoint batches, each over every type and code, in opposite orders
    batches = [claimed[k::10] for k in range(10)]

    async def run(k: int, ids: list[str]) -> int:
        rel = [release(i, ReleaseHow.ARCHIVE, codes[(n + k) % 4]) for n, i in enumerate(ids)]
        return len(await store.release(rel[::-1] if k % 2 else rel, sysid="s1"))

    for _ in range(2):  # archive, then (after a re-run by hand) archive again
        assert sum(await asyncio.gather(*(run(k, b) for k, b in enumerate(batches)))) == 3000
        await check(store, conn)
        await rerun_by_hand(conn, lock="s1")
    await conn.execute("UPDATE jobs SET lock = '__done'")
    await check(store, conn)
    total = sum(s.done_ok + s.done_failed + s.done_error for s in (await store.stats("a")).values())
    retry = await conn.fetchval("SELECT count(*) FROM jobs WHERE code = 'retry'")
    assert total + retry == 3000

    # concurrent purges and cancels with releases
    await store.add_jobs([job(f"w{i:04d}", types[i % 3]) for i in range(300)])
    await asyncio.gather(
        store.purge(-60),
        *(store.cancel_job("a", f"w{i:04d}") for i in range(0, 300, 3)),
        store.purge(-60),
    )
    await check(store, conn)


async def test_tenant_isolation(store: PgStore, conn: asyncpg.Connection) -> None:
    await store.add_jobs(
        [
            *(job(i, t) for i, t in [("a1", "a-x"), ("a2", "a-x"), ("ab1", "ab-x")]),
            *(job(i, t) for i, t in [("ab2", "ab-y"), ("b1", "b-x"), ("a_1", "a_-x")]),
            job("aa", "aa-x"),
        ]
    )
    await store.claim("ab-x", 1, sysid="s1", lease=LEASE)
    await store.release([release("ab1", ReleaseHow.ARCHIVE, "ok")], sysid="s1")
    await store.claim("a-x", 1, sysid="s1", lease=LEASE)
    assert await store.stats("a") == {"x": TypeStats(waiting=1, running=1)}
    assert await store.stats("ab") == {"x": TypeStats(done_ok=1), "y": TypeStats(waiting=1)}
    assert await store.stats("a_") == {"x": TypeStats(waiting=1)}
    assert await store.stats("nobody") == {}
    for client in ("a", "ab", "a_", "aa", "b"):
        await check(store, conn, client)


@pytest.mark.timeout(300)
async def test_stats_reads_no_waiting_jobs_one_by_one(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    await storefill.fill_one_type(conn, "a-deep", 200_000)
    await store.add_jobs([job("s1", "a-deep", dt=datetime.now(UTC) + timedelta(hours=1))])
    await conn.execute("VACUUM ANALYZE jobs")
    assert await pages_read(conn, queries.jobs.STATS, "a") < 200
    assert (await store.stats("a"))["deep"] == TypeStats(waiting=200_000, scheduled=1)
    assert await store.count_waiting("a") == 200_001
    await check(store, conn)


@pytest.mark.timeout(300)
async def test_stats_plan_reads_no_done_jobs(store: PgStore, conn: asyncpg.Connection) -> None:
    await storefill.fill(conn, 1000, 50_000, 10)
    await conn.execute(
        "UPDATE jobs SET lock = 's1', dt = now() + interval '1 minute' "
        "WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE lock = '' LIMIT 50))"
    )
    await conn.execute("VACUUM ANALYZE jobs")
    await conn.execute("ANALYZE type_counts")
    for mode in ["auto", "force_generic_plan"]:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for client in ["bench", "nobody"]:
            rows = await conn.fetch("EXPLAIN " + queries.jobs.STATS, client)
            plan = "\n".join(r[0] for r in rows)
            assert "Seq Scan on jobs" not in plan, plan
            assert "jobs_waiting_idx" in plan and "jobs_running_idx" in plan, plan
    for client in ["bench", "nobody"]:  # and the real plan reads few pages, not the jobs
        assert await pages_read(conn, queries.jobs.STATS, client) < 500
    stats = await store.stats("bench")
    assert len(stats) == 10
    assert sum(s.done_ok for s in stats.values()) == 50_000
    assert sum(s.waiting for s in stats.values()) == 950
    assert sum(s.running for s in stats.values()) == 50
    await check(store, conn, "bench")


@pytest.mark.timeout(300)
async def test_a_fold_reads_what_moved_not_every_type(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    await storefill.fill_types(conn, "b", 20_000, 100, per_type=1)
    assert await store.fold_counts()
    await conn.execute("VACUUM ANALYZE job_states, job_state_moves")  # as autovacuum keeps them
    await store.add_jobs([job("x1", "a-x"), job("y1", "a-y")])
    await store.claim("a-x", 1, sysid="s1", lease=LEASE)  # a-x falls back to 0 waiting
    async with conn.transaction():
        assert await pages_read(conn, queries.counts.FOLD_STATES) < 100
        assert await pages_read(conn, queries.counts.DROP_EMPTY_STATES) < 20
    assert await conn.fetchval("SELECT count(*) FROM job_states WHERE type LIKE 'a-%'") == 1
    await check(store, conn, "a")
