"""The ingester hands a batch on once its rows are in, and advances the journal's
read point over it only once they are flushed: one flush for every batch that
came meanwhile, and rows a store crash took before their flush are put in again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import asyncpg

from queue_daemon.domain.jobs import NewJob
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.journal import Journal
from queue_daemon.store.errors import StoreUnavailable
from queue_daemon.store.pg import PgStore
from queue_daemon.store.ports import Store


class FlushStore:
    """The real store; ``flush`` waits for ``gate``, and the first ``lose`` flushes
    delete the jobs inserted so far and fail (rows a crash took before their flush)."""

    def __init__(self, store: PgStore, conn: asyncpg.Connection, *, lose: int = 0) -> None:
        self._store = store
        self._conn = conn
        self.gate = asyncio.Event()
        self.gate.set()
        self.flushing = asyncio.Event()
        self.flushes = 0
        self.lose = lose
        self.inserted: list[bool] = []  # durable= of each add_jobs
        self.fresh: list[bool] = []  # fresh= of each add_jobs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def add_jobs(
        self, jobs: Sequence[NewJob], *, durable: bool = True, fresh: bool = False
    ) -> int:
        self.inserted.append(durable)
        self.fresh.append(fresh)
        return await self._store.add_jobs(jobs, durable=durable, fresh=fresh)

    async def flush(self) -> str:
        self.flushes += 1
        self.flushing.set()
        await self.gate.wait()
        if self.lose:
            self.lose -= 1
            await self._conn.execute("DELETE FROM jobs")
            raise StoreUnavailable("the server went away")
        return await self._store.flush()


async def _count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM jobs"))


async def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _write(journal: Journal, prefix: str, n: int) -> None:
    now_ms = time.time_ns() // 1_000_000
    ids = [f"{prefix}{i}" for i in range(n)]
    await journal.write("calm-clock", ids, ["p"] * n, create_ms=now_ms, dt_ms=now_ms)


async def test_the_read_point_passes_a_batch_once_its_rows_are_flushed(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    flushing = FlushStore(store, conn)
    flushing.gate.clear()
    journal = await Journal.open(tmp_path / "j")
    ingester = Ingester(journal, cast(Store, flushing), ingest_batch=5000, ingest_workers=1)
    task = asyncio.create_task(ingester.run())
    try:
        await _write(journal, "a", 3)
        await asyncio.wait_for(flushing.flushing.wait(), 10)
        for i in range(4):  # more batches while the first one's flush hangs
            await _write(journal, f"b{i}-", 2)

        async def all_in() -> bool:
            return await _count(conn) == 11

        await _until(all_in, "the rows were not in before their flush")
        assert journal.lag.unread_lines == 11, "the read point passed rows not flushed"
        flushing.gate.set()

        async def settled() -> bool:
            return journal.lag.unread_lines == 0

        await _until(settled, "the read point did not advance after the flush")
        assert flushing.flushes <= 2  # one for the first batch, one for all the rest
        assert not any(flushing.inserted)  # the pipeline never waited for a flush itself
        assert ingester.ingested == 11
    finally:
        flushing.gate.set()
        ingester.stop()
        await asyncio.wait_for(task, 10)
        await journal.close()


async def test_rows_lost_before_their_flush_are_inserted_again(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    flushing = FlushStore(store, conn, lose=1)
    journal = await Journal.open(tmp_path / "j")
    ingester = Ingester(journal, cast(Store, flushing), ingest_batch=5000, ingest_workers=1)
    task = asyncio.create_task(ingester.run())
    try:
        await _write(journal, "a", 5)

        async def settled() -> bool:
            return journal.lag.unread_lines == 0

        await _until(settled, "the batch was not settled")
        assert await _count(conn) == 5  # in again, not lost
        assert flushing.lose == 0
        assert flushing.flushes == 2  # the second insert waited for a flush of its own
        # the first insert of a batch this journal wrote is fresh; the one again is
        # not (its jobs may have run and moved to jobs_done meanwhile)
        assert flushing.fresh == [True, False]
        assert ingester.ingested == 5  # counted once
    finally:
        ingester.stop()
        await asyncio.wait_for(task, 10)
        await journal.close()


DONE_ALREADY = """
INSERT INTO jobs_done (id, type, data, create_dt, done_dt, attempts, code, exitcode)
VALUES ($1, 'calm-clock', 'p', now(), now(), 1, 'ok', 200)
"""


async def _ingest_all(journal: Journal, flushing: FlushStore) -> Ingester:
    ingester = Ingester(journal, cast(Store, flushing), ingest_batch=5000, ingest_workers=1)
    task = asyncio.create_task(ingester.run())
    try:

        async def settled() -> bool:
            return journal.lag.unread_lines == 0

        await _until(settled, "the batch was not settled")
    finally:
        ingester.stop()
        await asyncio.wait_for(task, 10)
    return ingester


async def test_an_id_of_a_key_or_a_tick_done_already_is_not_inserted_again(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Every add of an Idempotency-Key (or a schedule's tick) journals the same
    ids, on any daemon: the one that ran first is in jobs_done, and a later add
    of it, in a batch of its own journal, must not run it again."""
    flushing = FlushStore(store, conn)
    flushing.gate.set()
    await conn.execute(DONE_ALREADY, "ikey-0")
    await conn.execute(DONE_ALREADY, "stick")
    journal = await Journal.open(tmp_path / "j")
    try:
        now_ms = time.time_ns() // 1_000_000
        await journal.write(
            "calm-clock", ["0001-1", "ikey-0", "stick"], ["p"] * 3, create_ms=now_ms, dt_ms=now_ms
        )
        ingester = await _ingest_all(journal, flushing)
    finally:
        await journal.close()
    assert flushing.fresh == [False]
    assert ingester.ingested == 1
    assert [r[0] for r in await conn.fetch("SELECT id FROM jobs")] == ["0001-1"]


async def test_a_batch_found_at_start_up_skips_what_is_done_already(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """A daemon that crashed after its batch went in (and ran) but before its read
    point passed it finds the batch at start-up: inserted again, it must skip
    the jobs done since."""
    journal = await Journal.open(tmp_path / "j")
    await _write(journal, "a", 3)
    await journal.close()
    await conn.execute(DONE_ALREADY, "a1")  # the others were lost with the crash
    flushing = FlushStore(store, conn)
    flushing.gate.set()
    journal = await Journal.open(tmp_path / "j")
    try:
        ingester = await _ingest_all(journal, flushing)
    finally:
        await journal.close()
    assert flushing.fresh == [False]
    assert ingester.ingested == 2
    assert sorted(r[0] for r in await conn.fetch("SELECT id FROM jobs")) == ["a0", "a2"]
