"""PgStore's claim path against a real PostgreSQL: claim, renew, release, expiry,
purge, waiting jobtypes, their plans, LISTEN/NOTIFY and handler versions."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from bench import storefill
from queue_daemon.domain.jobs import (
    ExpiredLock,
    JobState,
    NewJob,
    Release,
    ReleaseHow,
    UnhandledRound,
)
from queue_daemon.engine.backoff import Backoff
from queue_daemon.store import pg_release, queries
from queue_daemon.store.errors import NotFound
from queue_daemon.store.migrate import available_migrations
from queue_daemon.store.pg import PgStore
from queue_daemon.store.pg_release import release_params

LEASE = 60.0


def job(job_id: str, stored_type: str = "a-t", *, dt: datetime | None = None) -> NewJob:
    now = datetime.now(UTC)
    return NewJob(id=job_id, type=stored_type, dt=dt or now, data=f"p-{job_id}", create_dt=now)


async def row(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record:
    r = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    assert r is not None
    return r


async def eventually(check: Callable[[], bool], within: float = 1.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.01)


# --- claim --------------------------------------------------------------------


async def test_claim_takes_only_eligible_jobs(store: PgStore, conn: asyncpg.Connection) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    await store.add_jobs(
        [
            job("e1"),
            job("e2"),
            job("future", dt=future),
            job("locked"),
            job("done"),
            job("other", "a-u"),
        ]
    )
    await conn.execute("UPDATE jobs SET lock = 'x9' WHERE id = 'locked'")
    await conn.execute("UPDATE jobs SET lock = '__done' WHERE id = 'done'")

    claimed = await store.claim("a-t", 10, sysid="s1", lease=LEASE)
    assert sorted(j.id for j in claimed) == ["e1", "e2"]
    assert {(j.type, j.attempts, j.data) for j in claimed} == {
        ("a-t", 1, "p-e1"),
        ("a-t", 1, "p-e2"),
    }
    r = await row(conn, "e1")
    assert r["lock"] == "s1"
    lease_left = (r["dt"] - datetime.now(UTC)).total_seconds()
    assert LEASE - 5 < lease_left <= LEASE
    assert await store.claim("a-t", 10, sysid="s1", lease=LEASE) == []
    assert await store.claim("a-t", 0, sysid="s1", lease=LEASE) == []
    assert [j.id for j in await store.claim("a-u", 10, sysid="s2", lease=LEASE)] == ["other"]
    assert (await row(conn, "future"))["lock"] == ""
    assert (await row(conn, "locked"))["lock"] == "x9"


async def test_nothing_is_claimed_under_a_lapsed_or_released_sysid(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    """Other daemons take back the jobs of a sysid whose lease ran out, whatever the
    jobs' own lease: a daemon back from a store outage claims again only once it has
    renewed its sysid, so no job runs under two owners at once."""
    await store.add_jobs([job("j1"), job("j2")])
    await conn.execute(
        "INSERT INTO sysids (sysid, holder, host, data_dir, expires) "
        "VALUES ('77', 'h', 'host', '/d', now() - interval '1 second')"
    )
    assert await store.claim("a-t", 10, sysid="77", lease=LEASE) == []
    assert {(await row(conn, i))["lock"] for i in ("j1", "j2")} == {""}
    await store.renew_sysid("77", holder="h", lease=LEASE)
    assert len(await store.claim("a-t", 1, sysid="77", lease=LEASE)) == 1
    await conn.execute("UPDATE sysids SET released_at = now() WHERE sysid = '77'")
    assert await store.claim("a-t", 10, sysid="77", lease=LEASE) == []
    assert (await row(conn, "j2"))["lock"] == ""


async def test_claim_takes_oldest_dt_first_up_to_limit(store: PgStore) -> None:
    base = datetime.now(UTC) - timedelta(minutes=10)
    await store.add_jobs([job(f"j{i}", dt=base + timedelta(seconds=10 - i)) for i in range(10)])
    claimed = await store.claim("a-t", 3, sysid="s1", lease=LEASE)
    assert sorted(j.id for j in claimed) == ["j7", "j8", "j9"]


async def test_claim_returns_since_when_each_job_was_due(store: PgStore) -> None:
    """max(creation, dt before the claim): the queue log measures the wait from it."""
    now = datetime.now(UTC)
    created = now - timedelta(minutes=10)
    delayed = now - timedelta(minutes=5)  # scheduled after its creation
    backdated = now - timedelta(hours=1)  # a dt in the past counts from the creation
    await store.add_jobs(
        [
            NewJob(id="delayed", type="a-t", dt=delayed, data="", create_dt=created),
            NewJob(id="backdated", type="a-t", dt=backdated, data="", create_dt=created),
        ]
    )
    claimed = await store.claim("a-t", 5, sysid="s1", lease=LEASE)

    def ms(when: datetime) -> int:
        return int(when.timestamp() * 1000)

    assert {j.id: j.due_ms for j in claimed} == {"delayed": ms(delayed), "backdated": ms(created)}


async def test_concurrent_claims_are_disjoint_and_complete(pg_dsn: str) -> None:
    stores = [await PgStore.connect(pg_dsn, min_size=1, max_size=2) for _ in range(4)]
    try:
        total = 600
        await stores[0].add_jobs([job(f"j{i:04d}") for i in range(total)])

        async def drain(s: PgStore, sysid: str) -> list[str]:
            got: list[str] = []
            while batch := await s.claim("a-t", 25, sysid=sysid, lease=LEASE):
                got += [j.id for j in batch]
            return got

        results = await asyncio.gather(*(drain(s, f"s{n}") for n, s in enumerate(stores)))
        everything = [i for r in results for i in r]
        assert len(everything) == len(set(everything)) == total
        assert sum(1 for r in results if r) >= 2  # they really competed
    finally:
        for s in stores:
            await s.close()


# --- renew and release --------------------------------------------------------


async def test_renew_only_own_jobs(store: PgStore, conn: asyncpg.Connection) -> None:
    await store.add_jobs([job("a"), job("b")])
    await store.claim("a-t", 1, sysid="s1", lease=LEASE)
    await store.claim("a-t", 1, sysid="s2", lease=LEASE)
    mine = await conn.fetchval("SELECT id FROM jobs WHERE lock = 's1'")
    theirs = await conn.fetchval("SELECT id FROM jobs WHERE lock = 's2'")
    before = (await row(conn, theirs))["dt"]
    assert await store.renew([mine, theirs, "missing"], sysid="s1", lease=3600) == 1
    assert (await row(conn, mine))["dt"] > datetime.now(UTC) + timedelta(minutes=50)
    assert (await row(conn, theirs))["dt"] == before
    assert await store.renew([], sysid="s1", lease=3600) == 0


async def test_release_each_way(store: PgStore, conn: asyncpg.Connection) -> None:
    await store.add_jobs([job(n) for n in ("retry", "unget", "ok", "failed", "refund", "foreign")])
    assert len(await store.claim("a-t", 6, sysid="s1", lease=LEASE)) == 6
    await conn.execute("UPDATE jobs SET lock = 's2' WHERE id = 'foreign'")
    releases = [
        Release(id="retry", how=ReleaseHow.RETRY, code="error", exitcode=500, result="boom",
                delay=120),
        Release(id="unget", how=ReleaseHow.UNGET),
        Release(id="ok", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="x" * 100_000),
        Release(id="failed", how=ReleaseHow.ARCHIVE, code="failed", exitcode=404, result="no"),
        Release(id="refund", how=ReleaseHow.UNGET, refund_attempt=True),
        Release(id="foreign", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200),
    ]  # fmt: skip
    assert await store.release(releases, sysid="s1") == {r.id for r in releases} - {"foreign"}
    now = datetime.now(UTC)

    r = await row(conn, "retry")
    assert (r["lock"], r["code"], r["exitcode"], r["result"]) == ("", "error", 500, "boom")
    assert now + timedelta(seconds=100) < r["dt"] < now + timedelta(seconds=121)
    r = await row(conn, "unget")
    assert r["lock"] == "" and r["dt"] <= now and r["code"] is None
    attempts = {
        rec["id"]: rec["attempts"] for rec in await conn.fetch("SELECT id, attempts FROM jobs")
    }
    assert attempts["refund"] == attempts["unget"] - 1

    ok = await store.get_job("a", "ok")
    assert (ok.state, ok.code, ok.exitcode, ok.result) == (JobState.DONE, "ok", 200, "x" * 100_000)
    assert ok.done_dt is not None
    assert ok.dt > ok.done_dt + timedelta(days=365 * 999)
    failed = await store.get_job("a", "failed")
    assert (failed.state, failed.code, failed.exitcode) == (JobState.DONE, "failed", 404)
    assert (await row(conn, "foreign"))["lock"] == "s2"

    # not ours any more: nothing applies
    assert await store.release([Release(id="ok", how=ReleaseHow.UNGET)], sysid="s1") == set()
    assert await store.release([Release(id="foreign", how=ReleaseHow.UNGET)], sysid="s1") == set()
    assert await store.release([], sysid="s1") == set()


async def test_a_release_alone_or_with_spaces_in_its_result_keeps_each_column(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    """The releases travel as texts joined by spaces (release_params): one release
    whose code and exit code are NULL, and results that hold spaces, commas and
    quotes, come out as they went in."""
    await store.add_jobs([job("alone"), job("a"), job("b")])
    assert len(await store.claim("a-t", 3, sysid="s1", lease=LEASE)) == 3
    put_back = Release(id="alone", how=ReleaseHow.UNGET, refund_attempt=True)
    assert await store.release([put_back], sysid="s1") == {"alone"}
    r = await row(conn, "alone")
    assert (r["lock"], r["code"], r["exitcode"], r["attempts"]) == ("", None, None, 0)
    texts = {"a": 'one two, "three"\n', "b": " "}
    done = [
        Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=201, result=t)
        for i, t in texts.items()
    ]
    assert await store.release(done, sysid="s1") == set(texts)
    for i, text in texts.items():
        got = await store.get_job("a", i)
        assert (got.code, got.exitcode, got.result) == ("ok", 201, text)


async def test_a_release_of_big_results_goes_in_several_statements_of_one_transaction(
    store: PgStore, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's results are sent RELEASE_TEXT characters a statement (1,000
    results of 1 MiB would pass PostgreSQL's 1 GB message), all in one
    transaction: every release applies, or none."""
    monkeypatch.setattr(pg_release, "RELEASE_TEXT", 10)
    await store.add_jobs([job(f"r{i}") for i in range(5)])
    assert len(await store.claim("a-t", 5, sysid="s1", lease=LEASE)) == 5
    done = [
        Release(id=f"r{i}", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result=f"{i}" * 6)
        for i in range(4)
    ] + [Release(id="r4", how=ReleaseHow.RETRY, code="error", exitcode=500, delay=60)]
    assert await store.release(done, sysid="s1") == {f"r{i}" for i in range(5)}
    for i in range(4):
        assert (await store.get_job("a", f"r{i}")).result == f"{i}" * 6
    assert (await row(conn, "r4"))["code"] == "error"


async def test_retry_then_archive_without_result_clears_old_result(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    await store.add_jobs([job("j")])
    await store.claim("a-t", 1, sysid="s1", lease=LEASE)
    await store.release(
        [Release(id="j", how=ReleaseHow.RETRY, code="error", exitcode=500, result="trace")],
        sysid="s1",
    )
    assert [j.attempts for j in await store.claim("a-t", 1, sysid="s1", lease=LEASE)] == [2]
    await store.release(
        [Release(id="j", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200)],
        sysid="s1",
    )
    done = await store.get_job("a", "j")
    assert (done.code, done.exitcode, done.result, done.attempts) == ("ok", 200, None, 2)


# --- expiry and purge ---------------------------------------------------------


async def test_expire_locks_after_lease(store: PgStore, conn: asyncpg.Connection) -> None:
    await store.add_jobs([job("short"), job("long"), job("done")])
    await store.claim("a-t", 3, sysid="s1", lease=LEASE)
    await conn.execute("UPDATE jobs SET dt = now() - interval '1 second' WHERE id = 'short'")
    await conn.execute("UPDATE jobs SET lock = '__done', dt = now() - interval '1 s' "
                       "WHERE id = 'done'")  # fmt: skip
    assert await store.expire_locks() == [ExpiredLock("short", "a-t", 1)]
    assert (await row(conn, "short"))["lock"] == ""
    assert (await row(conn, "long"))["lock"] == "s1"
    assert (await row(conn, "done"))["lock"] == "__done"
    assert [j.id for j in await store.claim("a-t", 5, sysid="s2", lease=LEASE)] == ["short"]
    assert await store.expire_locks() == []


async def test_expire_locks_of_dead_sysids_at_once(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    live = await store.reserve_sysid(None, holder="h1", host="x", data_dir="/a", lease=600)
    released = await store.reserve_sysid(None, holder="h2", host="x", data_dir="/b", lease=600)
    lapsed = await store.reserve_sysid(None, holder="h3", host="x", data_dir="/c", lease=600)
    await store.add_jobs([job(f"j{i}") for i in range(6)])
    for sysid in (live, released, lapsed):
        assert len(await store.claim("a-t", 2, sysid=sysid, lease=3600)) == 2
    await store.release_sysid(released, holder="h2")
    await conn.execute("UPDATE sysids SET expires = now() - interval '1 s' WHERE sysid = $1",
                       lapsed)  # fmt: skip

    assert len(await store.expire_locks()) == 4
    locks = [r["lock"] for r in await conn.fetch("SELECT lock FROM jobs ORDER BY lock")]
    assert locks == ["", "", "", "", live, live]
    assert len(await store.claim("a-t", 10, sysid=live, lease=60)) == 4


async def test_purge_only_old_archived_jobs(store: PgStore, conn: asyncpg.Connection) -> None:
    await store.add_jobs([job(f"j{i}") for i in range(5)])
    await conn.execute(
        "UPDATE jobs SET lock = '__done', dt = now() + interval '1000 years', "
        "done_dt = now() - interval '2 hours' WHERE id IN ('j0', 'j1')"
    )
    await conn.execute(
        "UPDATE jobs SET lock = '__done', dt = now() + interval '1000 years', "
        "done_dt = now() - interval '10 minutes' WHERE id = 'j2'"
    )
    await conn.execute("UPDATE jobs SET lock = 's1', done_dt = now() - interval '1 day' "
                       "WHERE id = 'j3'")  # fmt: skip
    assert await store.purge(3600) == {"a-t": 2}
    ids = [r["id"] for r in await conn.fetch("SELECT id FROM jobs ORDER BY id")]
    assert ids == ["j2", "j3", "j4"]
    assert await store.purge(3600) == {}


async def test_purge_goes_in_chunks(
    store: PgStore, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("queue_daemon.store.pg_queue.PURGE_CHUNK", 7)
    await store.add_jobs([job(f"j{i:02d}") for i in range(30)])
    await conn.execute(
        "UPDATE jobs SET lock = '__done', done_dt = now() - interval '1 day' WHERE id < 'j21'"
    )
    assert await store.purge(60) == {"a-t": 21}  # 7 + 7 + 7 + 0
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 9


# --- waiting jobtypes -----------------------------------------------------------


async def test_waiting_jobtypes_capped_and_eligible_only(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    await store.add_jobs(
        [job(f"a{i}", "a-many") for i in range(50)]
        + [job("b1", "b-one"), job("b2", "b-one", dt=future)]
        + [job("f1", "c-future", dt=future)]
        + [job("l1", "c-locked"), job("d1", "c-done")]
    )
    await conn.execute("UPDATE jobs SET lock = 's1' WHERE id = 'l1'")
    await conn.execute("UPDATE jobs SET lock = '__done' WHERE id = 'd1'")
    # only the types daemons run are listed: a handler, not a pull worker's
    await store.add_jobs(
        [job("i1", "x-idle"), job("p1", "x-pulled"), job("g1", "x-gone")]
        + [job(f"n{i}", f"x-n{i}") for i in range(30)]  # many idle types
    )
    for jobtype in ("a-many", "b-one", "c-future", "c-locked", "c-done", "x-gone"):
        await store.put_handler(jobtype, {"lang": "python", "body": "x"})
    await store.put_handler("x-pulled", {"lang": "worker"})
    await store.delete_handler("x-gone")
    assert await store.waiting_jobtypes(limit_per_type=20) == {"a-many": 20, "b-one": 1}
    assert await store.waiting_jobtypes() == {"a-many": 50, "b-one": 1}
    await store.claim("a-many", 45, sysid="s1", lease=LEASE)
    assert await store.waiting_jobtypes(limit_per_type=20) == {"a-many": 5, "b-one": 1}


async def test_waiting_jobtypes_empty(store: PgStore) -> None:
    assert await store.waiting_jobtypes() == {}


async def test_the_types_no_daemon_runs_are_swept_by_their_oldest_due_job(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    await store.add_jobs(
        [
            job("o1", "a-idle", dt=hour_ago),
            job("y1", "a-idle"),
            job("o2", "a-pulled", dt=hour_ago),
            job("o3", "a-run", dt=hour_ago),
            job("y2", "a-young"),
        ]
    )
    await conn.execute("UPDATE jobs SET create_dt = dt")
    await store.put_handler("a-pulled", {"lang": "worker"})
    await store.put_handler("a-run", {"lang": "python", "body": "x"})
    swept = await store.unhandled_types(600)
    assert swept == UnhandledRound(expired=[("a-idle", False), ("a-pulled", True)], next_after=None)
    assert await store.unhandled_types(7200) == UnhandledRound(expired=[], next_after=None)
    assert await store.expire_waiting("a-idle", 600, "too old") == ["o1"]  # not y1
    # a round looks at `steps` types and says where the next one goes on
    first = await store.unhandled_types(600, steps=2)
    assert first == UnhandledRound(expired=[("a-pulled", True)], next_after="a-pulled")
    rest = await store.unhandled_types(600, after="a-pulled", steps=2)  # a-run, a-young
    assert rest == UnhandledRound(expired=[], next_after="a-young")
    last = await store.unhandled_types(600, after="a-young", steps=2)
    assert last == UnhandledRound(expired=[], next_after=None)  # the end: from the start again
    # one daemon sweeps at a time: while another holds the sweep, None
    async with conn.transaction():
        assert await conn.fetchval(queries.queue.UNHANDLED_LOCK)
        assert await store.unhandled_types(600) is None


async def test_ingest_statements_commit_without_waiting_for_the_flush(
    conn: asyncpg.Connection,
) -> None:
    """A few jobs' insert, dispatched or not, turns synchronous_commit off for its
    own transaction: the ingester's flush makes them durable (docs/guarantees.md)."""
    now = datetime.now(UTC)
    columns = (["s1"], ["a-t"], [now], ["p"], [now])
    dispatched = (*columns, [True], "nobody", LEASE, "", False, False)
    for sql, args in (
        (queries.intake.INSERT_FEW, (*columns, "")),
        (queries.intake.INSERT_DISPATCHED, dispatched),
    ):
        async with conn.transaction():
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            await conn.fetch(sql, *args)
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
        await conn.execute("DELETE FROM jobs")
        assert await conn.fetchval("SHOW synchronous_commit") == "on"


# --- plans ----------------------------------------------------------------------


async def _plan(conn: asyncpg.Connection, sql: str, *args: object) -> str:
    rows = await conn.fetch("EXPLAIN " + sql, *args)
    return "\n".join(r[0] for r in rows)


@pytest.mark.timeout(300)
async def test_hot_path_plans_avoid_full_scans(store: PgStore, conn: asyncpg.Connection) -> None:
    await storefill.fill(conn, 50_000, 200_000, 20)
    await conn.execute(
        "UPDATE jobs SET lock = 's' || (random() * 5)::int, dt = now() + interval '1 minute' "
        "WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE lock = '' LIMIT 500))"
    )
    await conn.execute(
        "INSERT INTO sysids (sysid, expires, released_at) "
        "SELECT 'dead' || i, now(), now() FROM generate_series(1, 200) i"
    )
    await conn.execute("VACUUM ANALYZE jobs")
    await conn.execute("VACUUM ANALYZE jobs_done")
    await conn.execute("ANALYZE sysids")

    claim = await _plan(conn, queries.queue.CLAIM_IDS, "bench-t3", 100)
    assert "jobs_waiting_idx" in claim, claim
    whole_claim = await _plan(conn, queries.queue.CLAIM, "bench-t3", 100, "s1", 60.0, None)
    assert "jobs_waiting_idx" in whole_claim and "jobs_pkey" in whole_claim, whole_claim
    assert "handlers_live_idx" in whole_claim, whole_claim
    for n in range(20):
        await store.put_handler(f"bench-t{n}", {"lang": "python", "body": "x"})
    await conn.execute("ANALYZE handlers")
    waiting = await _plan(conn, queries.queue.WAITING_JOBTYPES, 1000)
    assert "jobs_waiting_idx" in waiting and "handlers_live_idx" in waiting, waiting
    unhandled = await _plan(conn, queries.queue.UNHANDLED_TYPES, 3600.0, "", 5000)
    assert "jobs_waiting_idx" in unhandled, unhandled
    old = await _plan(conn, queries.queue.EXPIRE_WAITING, "bench-t3", 3600.0, "r", 1000)
    assert "jobs_waiting_idx" in old, old
    expire = await _plan(conn, queries.queue.EXPIRE_LOCKS)
    assert "jobs_running_idx" in expire, expire
    # the retention of a store whose oldest done jobs are younger (the common case)
    purge = await _plan(conn, queries.queue.PURGE_CHUNK, 7200.0, 10_000)
    assert "jobs_done_idx" in purge and "jobs_done_dt_idx" in purge, purge
    # a tenant's listing: the live jobs' index (waiting and done rows) and the
    # running ones apart, merged in order with the archive's
    listing = await _plan(conn, queries.jobs.LIST_JOBS_FIRST, "bench", None, None, 51, 1 << 20)
    assert "jobs_client_created_idx" in listing and "jobs_running_idx" in listing, listing
    assert "jobs_done_client_created_idx" in listing and "Merge Append" in listing, listing
    # a release of a whole batch: each id looked up by primary key (the planner,
    # told of 1,000 ids, hashed the whole table instead)
    ids = [r[0] for r in await conn.fetch("SELECT id FROM jobs ORDER BY id LIMIT 1000")]
    plain = [Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for i in ids]
    archive_ok = await _plan(conn, queries.release.ARCHIVE_OK, " ".join(ids), "s1")
    archive = await _plan(conn, queries.release.ARCHIVE, *release_params(plain, "s1"))
    again = [Release(id=i, how=ReleaseHow.RETRY, code="error", exitcode=500) for i in ids]
    release = await _plan(conn, queries.release.RELEASE, *release_params(again, "s1"))
    pulled = await _plan(
        conn, queries.release.ARCHIVE_PULLED, *release_params(plain, "s1"), "bench", "w1"
    )
    for plan in (archive_ok, archive, release, pulled):
        # no hash or merge join (an aggregate of the few keyed rows may hash)
        assert "jobs_pkey" in plan and "Hash Cond" not in plan and "Merge Cond" not in plan, plan
    plans = (
        claim,
        whole_claim,
        waiting,
        unhandled,
        old,
        expire,
        purge,
        listing,
        archive_ok,
        archive,
    )
    for plan in plans:
        assert "Seq Scan on jobs" not in plan, plan


@pytest.mark.timeout(300)
async def test_plans_read_the_index_when_one_type_holds_the_whole_queue(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    """The statistics of a store where one idle type holds nearly every waiting job
    say that any type matches every row: a count capped by LIMIT without the index's
    order was planned as a scan of the whole table, read each time the daemon looked
    for work (74 ms a time at 1,000,000 waiting; end to end fell to 0.55 of an empty
    store). Ordered by dt, each is a walk of jobs_waiting_idx."""
    await storefill.fill_one_type(conn, "b-backlog", 200_000)
    await conn.execute("VACUUM ANALYZE jobs")
    # a type that came after the statistics (as a tenant's first jobs do)
    await store.add_jobs([job(f"j{i}") for i in range(50)])
    await store.put_handler("a-t", {"lang": "python", "body": "x"})
    await conn.execute("ANALYZE handlers")
    plans = {
        "waiting": await _plan(conn, queries.queue.WAITING_JOBTYPES, 1000),
        "old": await _plan(conn, queries.queue.EXPIRE_WAITING, "a-t", 3600.0, "r", 1000),
        "depths": await _plan(conn, queries.dashboard.QUEUE_DEPTHS_ALL, 200, 10_000),
        "client depths": await _plan(conn, queries.dashboard.QUEUE_DEPTHS_CLIENT, "a", 200, 10_000),
    }
    for name, plan in plans.items():
        assert "Seq Scan on jobs" not in plan, (name, plan)
        assert "jobs_waiting_idx" in plan, (name, plan)


# --- notify / listen ------------------------------------------------------------


async def test_listen_gets_jobs_and_handler_changes(store: PgStore, pg_dsn: str) -> None:
    jobs_seen: list[dict[str, int] | None] = []
    handlers_seen: list[str] = []
    task = asyncio.create_task(
        store.listen(jobs_seen.append, handlers_seen.append, retry=Backoff(0.1, 5.0))
    )
    try:
        await eventually(lambda: len(jobs_seen) == 1, within=5)  # the call on connecting
        assert jobs_seen == [None]  # anything may have been added meanwhile
        later = datetime.now(UTC) + timedelta(hours=1)
        await store.add_jobs([job("j1"), job("j2", "b-u"), job("j3", "b-u"), job("j4", dt=later)])
        await eventually(lambda: len(jobs_seen) == 2)
        assert jobs_seen[1] == {"a-t": 1, "b-u": 2}  # the due ones, per type
        await store.add_jobs([job("j1")])  # nothing new: no notification
        await store.notify_jobs()
        await eventually(lambda: len(jobs_seen) == 3)
        assert jobs_seen == [None, {"a-t": 1, "b-u": 2}, None]
        await store.add_jobs([job("j1"), job("j5")])  # one new, through the slow path
        await eventually(lambda: len(jobs_seen) == 4)
        assert jobs_seen[3] is None
        await store.put_handler("a-t", {"lang": "python", "body": "x"})
        await eventually(lambda: handlers_seen == ["a-t"])
        await store.delete_handler("a-t")
        await eventually(lambda: handlers_seen == ["a-t", "a-t"])
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # cancelling closed the listening connection
    c = await asyncpg.connect(pg_dsn)
    try:
        listening: list[int] = [1]

        async def count_listeners() -> None:
            listening[0] = await c.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = 'queue_daemon_listen' AND datname = current_database()"
            )

        deadline = time.monotonic() + 5
        await count_listeners()
        for _ in range(500):
            if listening[0] == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
            await count_listeners()
        assert listening[0] == 0
    finally:
        await c.close()


async def test_listen_reconnects_and_ends_on_close(pg_dsn: str) -> None:
    store = await PgStore.connect(pg_dsn, min_size=1, max_size=2)
    calls: list[int] = []
    task = asyncio.create_task(
        store.listen(lambda _a: calls.append(1), lambda _t: None, retry=Backoff(0.1, 5.0))
    )
    try:
        await eventually(lambda: len(calls) == 1, within=5)
        admin = await asyncpg.connect(pg_dsn)
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'queue_daemon_listen' AND datname = current_database()"
            )
        finally:
            await admin.close()
        assert killed == 1
        await eventually(lambda: len(calls) == 2, within=5)  # reconnected: on_jobs again
        await store.add_jobs([job("j1")])
        await eventually(lambda: len(calls) == 3, within=5)
    finally:
        await store.close()
    async with asyncio.timeout(5):
        await task  # close() ends it without an error


async def test_listen_keeps_retrying_while_unreachable(
    store: PgStore, caplog: pytest.LogCaptureFixture
) -> None:
    # a store whose DSN points at a port where nothing listens
    unreachable = PgStore(store._pool, acquire_timeout=1.0, dsn="postgresql://u@127.0.0.1:1/x")
    calls: list[int] = []
    with caplog.at_level(logging.WARNING, logger="queue_daemon.store.listen"):
        task = asyncio.create_task(
            unreachable.listen(lambda _a: calls.append(1), lambda _t: None, retry=Backoff(0.1, 5.0))
        )
        await eventually(
            lambda: (
                sum(1 for r in caplog.records if getattr(r, "action", "") == "listen_lost") >= 2
            ),
            within=5,
        )
        assert not task.done() and calls == []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# --- handlers -------------------------------------------------------------------


async def test_handler_versions(store: PgStore, conn: asyncpg.Connection) -> None:
    with pytest.raises(NotFound):
        await store.get_handler("a-t")
    first = await store.put_handler("a-t", {"lang": "python", "body": "v1", "timeout": 30})
    second = await store.put_handler("a-t", {"lang": "python", "body": "v2"})
    assert second.id != first.id and second.id > first.id
    got = await store.get_handler("a-t")
    assert (got.id, got.type, got.data) == (second.id, "a-t", {"lang": "python", "body": "v2"})
    assert (await store.get_handler("a-t")).dt == second.dt
    await store.put_handler("a-u", {"lang": "shell", "body": "cat"})
    await store.put_handler("ab-t", {"lang": "shell", "body": "cat"})
    assert await store.count_handlers("a") == 2
    assert await store.count_handlers("ab") == 1
    assert await store.count_handlers("zz") == 0

    await store.delete_handler("a-t")
    with pytest.raises(NotFound):
        await store.get_handler("a-t")
    with pytest.raises(NotFound):
        await store.delete_handler("a-t")
    with pytest.raises(NotFound):
        await store.delete_handler("a-never")
    assert await store.count_handlers("a") == 1
    # old versions stay for audit, marked deleted
    assert await conn.fetchval("SELECT count(*) FROM handlers WHERE type = 'a-t'") == 2

    third = await store.put_handler("a-t", {"lang": "node", "body": "v3"})
    assert third.id > second.id
    assert (await store.get_handler("a-t")).data["body"] == "v3"
    assert await store.count_handlers("a") == 2


async def test_claim_reads_the_live_handler_version_with_the_jobs(store: PgStore) -> None:
    await store.add_jobs([job(f"j{n}") for n in range(3)])
    got = await store.claim("a-t", 1, sysid="s1", lease=60)
    assert [j.handler for j in got] == [None]  # no handler yet
    first = await store.put_handler("a-t", {"lang": "python", "body": "v1"})
    await store.put_handler("a-u", {"lang": "python", "body": "other type"})
    assert [j.handler for j in await store.claim("a-t", 1, sysid="s1", lease=60)] == [first.id]
    second = await store.put_handler("a-t", {"lang": "python", "body": "v2"})
    assert [j.handler for j in await store.claim("a-t", 5, sysid="s1", lease=60)] == [second.id]
    await store.delete_handler("a-t")
    await store.add_jobs([job("k0"), job("k1")])
    assert [j.handler for j in await store.claim("a-t", 5, sysid="s1", lease=60)] == [None, None]


async def test_migration_0002_is_shipped() -> None:
    assert 2 in [m.version for m in available_migrations()]


async def test_expire_waiting_archives_only_old_waiting_jobs_of_the_type(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    now = datetime.now(UTC)
    old = NewJob(
        id="old",
        type="a-t",
        dt=now - timedelta(hours=3),
        data="p",
        create_dt=now - timedelta(hours=3),
    )
    other_type = NewJob(
        id="other",
        type="a-u",
        dt=now - timedelta(hours=3),
        data="p",
        create_dt=now - timedelta(hours=3),
    )
    future = NewJob(
        id="future",
        type="a-t",
        dt=now + timedelta(hours=1),
        data="p",
        create_dt=now - timedelta(hours=3),
    )
    await store.add_jobs([old, other_type, future, job("young")])
    assert await store.expire_waiting("a-t", 3600, "no handler") == ["old"]
    done = await store.get_job("a", "old")
    assert (done.state, done.code, done.exitcode, done.result) == (
        JobState.DONE,
        "error",
        503,
        "no handler",
    )
    for waiting in ("other", "future", "young"):
        assert (await store.get_job("a", waiting)).state == JobState.WAITING
    assert await store.expire_waiting("a-t", 3600, "no handler") == []


@pytest.mark.timeout(300)
async def test_a_release_looks_its_jobs_up_by_id_whatever_the_statistics_say(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    """Analyzed while nothing ran, the statistics call jobs_running_idx empty: a
    release must still look each job up by id, never join every entry of that
    index against every release (60 ms a batch of 200 with 1,000 running)."""
    await storefill.fill(conn, 50_000, 0, 1)
    await conn.execute("VACUUM ANALYZE jobs")
    claimed = []
    for _ in range(5):
        claimed += await store.claim("bench-t0", 200, sysid="s1", lease=600.0)
    ids = sorted(c.id for c in claimed)[:200]
    done = [Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for i in ids]
    for mode in ["auto", "force_generic_plan"]:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for statement in (queries.release.RELEASE, queries.release.ARCHIVE):
            plan = await _plan(conn, statement, *release_params(done, "s1"))
            assert "jobs_running_idx" not in plan and "jobs_pkey" in plan, plan


@pytest.mark.timeout(300)
async def test_a_pull_workers_statements_look_their_jobs_up_by_id_with_stale_statistics(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    """Analyzed while the table was empty (as while a backlog is drained): a
    complete (either way), renew, hand-back or existence check of a pull worker's jobs must
    look each id up, never scan the tenant's jobs (38 ms a complete of 1,000
    with 100,000 waiting)."""
    await conn.execute("VACUUM ANALYZE jobs")
    await conn.execute(storefill.FILL_WAITING, 50_000, 1)  # (fill would analyze)
    lock = "w:" + "a" * 32 + ":wk"
    rows = await conn.fetch(queries.pulled.CLAIM, "bench-t0", 500, lock, 60.0, "bench", "wk", None)
    ids = [r["id"] for r in rows if r["id"] is not None]
    assert len(ids) == 500
    locks = [lock] * len(ids)
    done = [Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for i in ids]
    statements = [
        (queries.pulled.HELD_FOR_UPDATE, (ids, locks, "bench")),
        (queries.pulled.RENEW, (ids, locks, "bench", "wk", 60.0)),
        (queries.pulled.HAND_BACK, (ids, locks, "bench", "wk")),
        (queries.pulled.EXISTING, (ids, "bench")),
        (queries.release.ARCHIVE_PULLED, (*release_params(done, locks), "bench", "wk")),
    ]
    for mode in ["auto", "force_generic_plan"]:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for statement, args in statements:
            plan = await _plan(conn, statement, *args)
            assert "jobs_pkey" in plan, plan
            assert "jobs_client_created_idx" not in plan and "Seq Scan on jobs " not in plan, plan
