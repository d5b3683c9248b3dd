"""The store fails over: a primary and a standby (``harness.pgpair``), the primary
killed with ``kill -9`` and the standby promoted, daemons and the ingester on a
DSN naming both hosts (``target_session_attrs=read-write``).

The whole-system checks (three daemons, a pull worker, every invariant, with a
synchronous and an asynchronous standby) are in ``tests/faults/test_failover.py``.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import aiohttp
import asyncpg
import pytest

from harness.api import Api, Handlers, post_json, until
from harness.daemons import DaemonFactory, add_tenant
from harness.pgpair import PgPair
from queue_daemon.domain.jobs import NewJob
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.journal import Journal
from queue_daemon.store.errors import StoreError
from queue_daemon.store.pg import PgStore
from queue_daemon.store.ports import Store

pytestmark = pytest.mark.timeout(120)


def _pair(synchronous: bool) -> Iterator[PgPair]:
    pair = PgPair(synchronous=synchronous)
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


@pytest.fixture
def sync_pair() -> Iterator[PgPair]:
    yield from _pair(synchronous=True)


@pytest.fixture
def async_pair() -> Iterator[PgPair]:
    yield from _pair(synchronous=False)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def _post(api: Api, path: str, body: dict[str, Any]) -> Any:
    reply = await post_json(api, path, body)
    assert reply.status == 200, reply
    return reply.json


async def test_held_claims_and_gets_resume_and_claims_keep_fencing_across_a_failover(
    sync_pair: PgPair,
    daemons: DaemonFactory,
    data_dir: Path,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    """A claim held while the primary dies and the standby is promoted gets the job
    added afterwards; GETs held on a job meanwhile (one asked while there was no
    primary) answer when it is done; the claim made before the failover still
    holds its job (and only it does)."""
    dsn = sync_pair.dsn()
    token = add_tenant("t", store=dsn, data_dir=data_dir, cwd=tmp_path)
    daemon = daemons.start(data_dir, dsn)
    api = Api(session, daemon.url, "t", token)
    handlers = Handlers(api)
    for jobtype in ("held", "empty", "late"):
        assert (await handlers.add_raw(jobtype, {"lang": "worker"})).status == 200
    [job_id] = await api.add("held", ["before"])
    await api.wait_caught_up()
    [job] = (await _post(api, "/job/held/claim", {"worker": "w1", "wait": 5}))["jobs"]
    assert job["id"] == job_id

    held_claim = asyncio.create_task(_post(api, "/job/empty/claim", {"worker": "w2", "wait": 40}))
    held_get = asyncio.create_task(api.request("GET", f"/t/job/{job_id}?wait=40"))
    await asyncio.sleep(0.3)  # both held, not a synchronisation: they hold either way
    killed = time.monotonic()
    await asyncio.to_thread(sync_pair.kill_primary)

    async def unready() -> bool | None:
        return True if (await api.readyz()).status == 503 else None

    await until(unready, 20, "readyz 503 while there is no primary")
    # asked while there is no primary: held too, not answered 503 (the type of
    # the claim never claimed before: its handler is not known here yet)
    get_in_outage = asyncio.create_task(api.request("GET", f"/t/job/{job_id}?wait=40"))
    claim_in_outage = asyncio.create_task(
        _post(api, "/job/late/claim", {"worker": "w3", "wait": 40})
    )
    await asyncio.sleep(1.5)  # the claim's loop meets the store away more than once
    await asyncio.to_thread(sync_pair.promote)
    holding = (held_claim, held_get, get_in_outage, claim_in_outage)
    assert not any(task.done() for task in holding)

    [added] = await api.add("empty", ["after"])
    claimed = await asyncio.wait_for(held_claim, 40)
    assert [j["id"] for j in claimed["jobs"]] == [added]
    [late] = await api.add("late", ["after"])
    claimed = await asyncio.wait_for(claim_in_outage, 40)
    assert [j["id"] for j in claimed["jobs"]] == [late]
    assert time.monotonic() - killed < 40

    stale = {"claim": "0" * 32, "worker": "w1", "exitcode": 200}
    reply = await post_json(api, f"/job/{job_id}/complete", stale)
    assert reply.status == 409, reply  # a claim never made holds nothing
    done = {"claim": job["claim"], "worker": "w1", "exitcode": 200, "result": "r"}
    await _post(api, f"/job/{job_id}/complete", done)  # the claim survived the switch
    for held in (held_get, get_in_outage):
        got = await asyncio.wait_for(held, 40)
        assert got.status == 200 and got.json["state"] == "done", got
    assert daemon.terminate() == 0


class GatedFlush:
    """The real store; ``flush`` waits for ``gate`` (the rows stay unflushed)."""

    def __init__(self, store: PgStore) -> None:
        self._store = store
        self.gate = asyncio.Event()
        self.gate.set()
        self.flushed: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def add_jobs(
        self, jobs: Sequence[NewJob], *, durable: bool = True, fresh: bool = False
    ) -> int:
        return await self._store.add_jobs(jobs, durable=durable, fresh=fresh)

    async def flush(self) -> str:
        await self.gate.wait()
        epoch = await self._store.flush()
        self.flushed.append(epoch)
        return epoch


async def _write(journal: Journal, prefix: str, n: int) -> None:
    now_ms = time.time_ns() // 1_000_000
    ids = [f"{prefix}{i}" for i in range(n)]
    await journal.write("calm-clock", ids, ["p"] * n, create_ms=now_ms, dt_ms=now_ms)


async def _settled(journal: Journal) -> bool | None:
    return True if journal.lag.unread_lines == 0 else None


async def _count(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM jobs"))
    finally:
        await conn.close()


async def test_an_ingest_batch_the_standby_never_got_is_inserted_again(
    async_pair: PgPair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows inserted (committed asynchronously) on a primary whose standby is cut
    off, then the primary killed and the standby promoted: the flush on the new
    primary names another history, so the batch goes in again before the
    journal's read point passes it."""
    dsn = async_pair.dsn()
    store = await PgStore.connect(dsn, min_size=1, max_size=1)
    gated = GatedFlush(store)
    journal = await Journal.open(tmp_path / "j")
    ingester = Ingester(journal, cast(Store, gated), ingest_batch=5000, ingest_workers=1)
    task = asyncio.create_task(ingester.run())
    try:
        await _write(journal, "b", 1)  # a batch flushed on the first primary
        await until(lambda: _settled(journal), 20, "the first batch was not settled")
        before = await store.epoch()
        await asyncio.to_thread(async_pair.cut_standby)
        gated.gate.clear()
        await _write(journal, "f", 5)

        async def inserted() -> bool | None:
            return True if await _count(dsn) == 6 else None

        await until(inserted, 20, "the batch was not inserted")
        assert journal.lag.unread_lines == 5  # not flushed: the read point waits
        await asyncio.to_thread(async_pair.kill_primary)
        await asyncio.to_thread(async_pair.promote)
        assert await _count(dsn) == 1  # the new primary never got the five

        async def answers() -> bool | None:
            try:
                await store.ping()
            except StoreError:
                return None
            return True

        await until(answers, 20, "the store did not answer on the new primary")
        gated.gate.set()

        await until(lambda: _settled(journal), 20, "the batch was not settled")
        assert await _count(dsn) == 6  # inserted again, not lost
        assert gated.flushed[-1] != before  # the promoted standby is another history
        assert " tl00000002" in gated.flushed[-1]  # its new timeline is part of it
        noted = [r for r in caplog.records if getattr(r, "action", "") == "store_history"]
        assert len(noted) == 1, caplog.records  # the operator is told, once
    finally:
        gated.gate.set()
        ingester.stop()
        await asyncio.wait_for(task, 10)
        await journal.close()
        await store.close()


async def test_batches_settled_on_a_primary_the_standby_lacked_are_inserted_again(
    async_pair: PgPair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows inserted and flushed on a primary whose asynchronous standby is cut
    off (the journal's read point passed them), then the primary killed and the
    standby promoted with no add after it: the ingester sees the new history on
    its own and inserts what it settled lately again; rows the new primary has
    (a job done there) are left as they are."""
    dsn = async_pair.dsn()
    store = await PgStore.connect(dsn, min_size=1, max_size=2)
    journal = await Journal.open(tmp_path / "j")
    ingester = Ingester(journal, cast(Store, store), ingest_batch=5000, ingest_workers=1)
    task = asyncio.create_task(ingester.run())
    try:
        await _write(journal, "old", 2)
        await until(lambda: _settled(journal), 20, "the first batch was not settled")
        conn = await asyncpg.connect(dsn)
        try:  # one of them done and archived, the standby sees it
            await conn.execute(
                "INSERT INTO jobs_done (id, type, data, create_dt, done_dt, attempts, code,"
                " exitcode) SELECT id, type, data, create_dt, now(), 1, 'ok', 200"
                " FROM jobs WHERE id = 'old0'"
            )
            await conn.execute("DELETE FROM jobs WHERE id = 'old0'")
        finally:
            await conn.close()
        await asyncio.to_thread(async_pair.wait_caught_up)
        await asyncio.to_thread(async_pair.cut_standby)
        await _write(journal, "new", 5)
        await until(lambda: _settled(journal), 20, "the second batch was not settled")
        assert await _count(dsn) == 6  # flushed on the primary: the read point passed it
        standby_has = await asyncio.to_thread(async_pair.psql, "SELECT count(*) FROM jobs", on=1)
        assert standby_has == "1"  # old1 only: the standby lacks the five
        await asyncio.to_thread(async_pair.kill_primary)
        await asyncio.to_thread(async_pair.promote)

        async def all_back() -> bool | None:
            return True if await _count(dsn) == 6 else None

        await until(all_back, 20, "the settled rows did not come back")
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM jobs WHERE id = 'old0'") == 0
            assert await conn.fetchval("SELECT count(*) FROM jobs_done") == 1
        finally:
            await conn.close()
        actions = [getattr(r, "action", "") for r in caplog.records]
        assert actions.count("store_history") == 1, actions
        [replay] = [r for r in caplog.records if getattr(r, "action", "") == "ingest_replay"]
        assert "again the 7 jobs" in replay.getMessage()  # old0 too: done there, left so

    finally:
        ingester.stop()
        await asyncio.wait_for(task, 10)
        await journal.close()
        await store.close()


async def test_a_first_host_that_does_not_answer_makes_way_for_the_next(
    sync_pair: PgPair,
) -> None:
    """A dead machine drops the packets: a connection to it neither fails nor
    answers. Each host gets the whole connect timeout, so the next one is tried
    (asyncpg alone gives all of them one, which the first would use up)."""
    with socket.socket() as silent:  # accepts at the kernel, never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hosts = f"127.0.0.1:{silent.getsockname()[1]},127.0.0.1:{sync_pair.ports[0]}"
        dsn = f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
        began = time.monotonic()
        store = await PgStore.connect(
            dsn, min_size=1, max_size=1, migrate=False, connect_timeout=1.0
        )
        try:
            await store.ping()
            assert 1.0 <= time.monotonic() - began < 5.0
        finally:
            await store.close()
