"""A line added behind a batch whose insert is slow is not held up by it: a
second ingest pipeline moves it meanwhile (the journal's read point still
advances only over what is in the store)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest

import queue_daemon.engine.ingest.ingester as ingester_module
from queue_daemon.domain.jobs import NewJob
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.journal import Journal
from queue_daemon.store.pg import PgStore
from queue_daemon.store.ports import Store


class SlowBatchStore:
    """The real store; inserts of batches holding ``slow`` wait for ``gate``."""

    def __init__(self, store: PgStore, slow: str) -> None:
        self._store = store
        self.slow = slow
        self.gate = asyncio.Event()
        self.slow_waiting = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def add_jobs(
        self, jobs: Sequence[NewJob], *, durable: bool = True, fresh: bool = False
    ) -> int:
        if any(job.type == self.slow for job in jobs):
            self.slow_waiting.set()
            await self.gate.wait()
        return await self._store.add_jobs(jobs, durable=durable, fresh=fresh)


async def _stored(conn: asyncpg.Connection, job_id: str) -> bool:
    return bool(await conn.fetchval("SELECT count(*) FROM jobs WHERE id = $1", job_id))


async def test_a_line_behind_a_slow_batch_is_moved_by_another_pipeline(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    await _moved_behind_a_slow_batch(store, conn, tmp_path)


async def test_a_line_behind_a_large_batch_is_moved_at_once(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a batch of BIG_BATCH lines or more a helper does not wait for the batch
    to turn out slow (HELP_AFTER, made endless here): it moves the line at once."""
    monkeypatch.setattr(ingester_module, "HELP_AFTER", 3600.0)
    assert ingester_module.BIG_BATCH <= 1000
    await _moved_behind_a_slow_batch(store, conn, tmp_path)


async def _moved_behind_a_slow_batch(
    store: PgStore, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    slow = SlowBatchStore(store, "flood-busy")
    journal = await Journal.open(tmp_path / "j")
    ingester = Ingester(journal, cast(Store, slow), ingest_batch=5000, ingest_workers=2)
    task = asyncio.create_task(ingester.run())
    try:
        now_ms = time.time_ns() // 1_000_000
        ids = [f"f{i}" for i in range(1000)]
        await journal.write("flood-busy", ids, ["p"] * 1000, create_ms=now_ms, dt_ms=now_ms)
        await asyncio.wait_for(slow.slow_waiting.wait(), 10)  # the flood's batch hangs
        await journal.write("calm-clock", ["c1"], ["p"], create_ms=now_ms, dt_ms=now_ms)
        deadline = time.monotonic() + 10
        while not await _stored(conn, "c1"):
            assert time.monotonic() < deadline, "the line behind the slow batch was not moved"
            await asyncio.sleep(0.01)
        assert not await _stored(conn, "f0")
        assert journal.lag.unread_lines > 0, "the read point passed a batch not in the store"
        slow.gate.set()
        deadline = time.monotonic() + 10
        while journal.lag.unread_lines:
            assert time.monotonic() < deadline, f"{journal.lag.unread_lines} lines left"
            await asyncio.sleep(0.01)
        assert await _stored(conn, "f999")
        assert ingester.ingested == 1001  # both pipelines' rows are counted
    finally:
        slow.gate.set()
        ingester.stop()
        await asyncio.wait_for(task, 10)
        await journal.close()
