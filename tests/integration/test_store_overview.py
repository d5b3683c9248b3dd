"""The dashboard's store reads (migration 0006): depths, running jobs, recent
failures, sysid leases and the monotonic archive counters, per tenant and for
all; and their plans on a table with many archived jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from bench import storefill
from queue_daemon.domain.jobs import NewJob, Release, ReleaseHow
from queue_daemon.domain.views import QueueDepth
from queue_daemon.store import queries
from queue_daemon.store.pg import PgStore
from tests.integration.plans import pages_read

LEASE = 600.0


def job(job_id: str, stored_type: str, *, dt: datetime | None = None) -> NewJob:
    now = datetime.now(UTC)
    return NewJob(
        id=job_id, type=stored_type, dt=dt or now - timedelta(seconds=1), data="{}", create_dt=now
    )


async def archive(store: PgStore, stored_type: str, codes: dict[str, str | None]) -> None:
    """Claim the given jobs of ``stored_type`` and archive each with its code and result."""
    await store.claim(stored_type, len(codes), sysid="s1", lease=LEASE)
    await store.release(
        [
            Release(id=i, how=ReleaseHow.ARCHIVE, code=code, exitcode=500, result=f"r {i}")
            for i, code in codes.items()
        ],
        sysid="s1",
    )


async def test_depths_running_failures_per_tenant_and_all(store: PgStore) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    await store.add_jobs(
        [job(f"a{i}", "a-t") for i in range(5)]
        + [job("as", "a-t", dt=future), job("ab1", "ab-x"), job("b1", "b-y"), job("b2", "b-y")]
    )
    await archive(store, "a-t", {"a0": "ok", "a1": "failed"})
    await archive(store, "b-y", {"b1": "error"})
    await store.claim("a-t", 1, sysid="s7", lease=LEASE)

    assert await store.queue_depths("a", 100, 1000) == [
        QueueDepth(type="a-t", waiting=2, scheduled=1, running=1, done_ok=1, done_failed=1)
    ]
    everything = await store.queue_depths(None, 100, 1000)
    assert [d.type for d in everything] == ["a-t", "ab-x", "b-y"]
    assert everything[2] == QueueDepth(type="b-y", waiting=1, done_error=1)
    assert [d.type for d in await store.queue_depths(None, 2, 1000)] == ["a-t", "ab-x"]
    # a deep queue is counted up to the cap, and says so
    assert await store.queue_depths("a", 100, 2) == [
        QueueDepth(
            type="a-t", waiting=2, scheduled=1, capped=True, running=1, done_ok=1, done_failed=1
        )
    ]

    running = await store.running_jobs("a", 50)
    assert running.total == 1 and running.oldest[0].sysid == "s7"
    assert running.oldest[0].type == "a-t"
    assert (await store.running_jobs("b", 50)).total == 0
    assert (await store.running_jobs(None, 50)).total == 1

    failures = await store.recent_failures("a", 50, 500)
    assert [(f.id, f.code, f.result) for f in failures] == [("a1", "failed", "r a1")]
    assert [f.id for f in await store.recent_failures(None, 50, 500)] == ["b1", "a1"]
    assert [f.id for f in await store.recent_failures(None, 1, 500)] == ["b1"]
    assert await store.recent_failures("ab", 50, 500) == []


async def test_failure_results_are_cut(store: PgStore) -> None:
    await store.add_jobs([job("x1", "c-t"), job("x2", "c-t")])
    await store.claim("c-t", 2, sysid="s1", lease=LEASE)
    await store.release(
        [
            Release(id="x1", how=ReleaseHow.ARCHIVE, code="failed", exitcode=400, result="é" * 600),
            Release(id="x2", how=ReleaseHow.ARCHIVE, code="error", exitcode=500, result=None),
        ],
        sysid="s1",
    )
    by_id = {f.id: f for f in await store.recent_failures("c", 10, 500)}
    assert by_id["x1"].result == "é" * 500 and by_id["x1"].result_cut
    assert by_id["x2"].result is None and not by_id["x2"].result_cut


async def test_archived_counts_only_grow(store: PgStore) -> None:
    await store.add_jobs([job(f"j{i}", "a-t") for i in range(4)] + [job("k1", "a-u")])
    assert await store.archived_counts() == {}
    await archive(store, "a-t", {"j0": "ok", "j1": "failed", "j2": "retry"})
    await store.cancel_job("a", "k1")
    assert await store.archived_counts() == {"a-t": 3, "a-u": 1}
    assert sum((await store.purge(-60)).values()) == 4  # every done job goes; the counters stay
    assert await store.archived_counts() == {"a-t": 3, "a-u": 1}
    assert await store.queue_depths("a", 10, 1000) == [QueueDepth(type="a-t", waiting=1)]


async def test_daemon_leases(store: PgStore) -> None:
    live = await store.reserve_sysid(None, holder="h1", host="m1", data_dir="/d1", lease=60)
    gone = await store.reserve_sysid(None, holder="h2", host="m2", data_dir="/d2", lease=60)
    await store.release_sysid(gone, holder="h2")
    leases = await store.daemon_leases(10)
    assert [(d.sysid, d.state) for d in leases] == [(live, "live"), (gone, "released")]
    assert leases[0].expires is not None
    assert 0 < (leases[0].expires - leases[0].now).total_seconds() <= 60
    assert leases[0].host == "m1"
    assert len(await store.daemon_leases(1)) == 1


@pytest.mark.timeout(300)
async def test_plans_read_indexes_not_archived_jobs(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    """200,000 archived jobs (a tenth of them failed), 20,000 waiting, 200 running."""
    await storefill.fill(conn, 20_000, 200_000, 20)
    await conn.execute("UPDATE jobs_done SET code = 'failed', result = 'no' WHERE id LIKE '%0'")
    await conn.execute(
        "UPDATE jobs SET lock = 's1', dt = now() + interval '1 minute' "
        "WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE lock = '' LIMIT 200))"
    )
    await conn.execute("ANALYZE jobs")
    await conn.execute("ANALYZE jobs_done")
    await conn.execute("ANALYZE type_counts")
    statements = [
        (queries.dashboard.QUEUE_DEPTHS_ALL, (1001, 100_000), "jobs_waiting_idx"),
        (queries.dashboard.QUEUE_DEPTHS_CLIENT, ("bench", 1001, 100_000), "jobs_waiting_idx"),
        (queries.dashboard.RUNNING_JOBS_ALL, (50,), "jobs_running_idx"),
        (queries.dashboard.RUNNING_JOBS_CLIENT, ("bench", 50), "jobs_running_idx"),
        (queries.dashboard.RECENT_FAILURES_ALL, (50, 500), "jobs_done_failed_idx"),
        (queries.dashboard.RECENT_FAILURES_CLIENT, ("bench", 50, 500), "jobs_done_failed_idx"),
    ]
    for mode in ["auto", "force_generic_plan"]:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for sql, args, index in statements:
            rows = await conn.fetch("EXPLAIN " + sql, *args)
            plan = "\n".join(r[0] for r in rows)
            assert "Seq Scan on jobs" not in plan, plan
            assert index in plan, plan
    failures = await store.recent_failures("bench", 50, 500)
    assert len(failures) == 50
    assert all(f.code == "failed" for f in failures)
    running = await store.running_jobs(None, 50)
    assert running.total == 200 and len(running.oldest) == 50
    depths = await store.queue_depths("bench", 1000, 100_000)
    assert sum(d.waiting for d in depths) == 20_000 - 200
    assert sum(d.running for d in depths) == 200


@pytest.mark.timeout(300)
async def test_the_depths_read_does_not_grow_with_the_types_in_the_store(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    await storefill.fill_types(conn, "bench", 20_000, 1_000, per_type=2)
    assert await store.fold_counts()
    await conn.execute("VACUUM ANALYZE jobs")
    await conn.execute("ANALYZE job_states")
    pages = {
        "all": await pages_read(conn, queries.dashboard.QUEUE_DEPTHS_ALL, 51, 10_000),
        "one": await pages_read(conn, queries.dashboard.QUEUE_DEPTHS_CLIENT, "bench", 51, 10_000),
    }
    assert pages["all"] < 1_000 and pages["one"] < 1_000, pages  # 40,000 jobs, 20,000 types
    depths = await store.queue_depths(None, 51, 10_000)
    assert len(depths) == 51 and all(d.waiting == 2 for d in depths)
    assert [d.type for d in depths] == sorted(d.type for d in depths)
    mine = await store.queue_depths("bench", 51, 10_000)
    assert len(mine) == 20 and all(d.type.startswith("bench-") for d in mine)
