"""Ingest rows/s, journal → store, in-process: the daemon's own ``Ingester``.

A journal in the temp dir is filled first (1000-line writes, as the daemon
writes them); then the clock runs from the ingester's start until the
journal reports no unread line, against a freshly migrated database.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from bench.pg import count_jobs
from bench.procs import BenchError
from queue_daemon.engine.admit.ids import IdGenerator
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.journal import Journal
from queue_daemon.store.pg import PgStore

JOBTYPE = "bench-ingest"
WRITE_LINES = 1000
PARALLEL_WRITES = 8  # concurrent writes, so the journal's group commit batches them


@dataclass(frozen=True, slots=True)
class IngestResult:
    rows: int
    batch: int
    workers: int
    seconds: float
    write_seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds


async def _fill(journal: Journal, rows: int) -> None:
    ids = IdGenerator("bench")
    now = time.time_ns() // 1_000_000

    async def write(n: int) -> None:
        payloads = [f'{{"job": {i}, "pad": "0123456789abcdef"}}' for i in range(n)]
        await journal.write(JOBTYPE, ids.next_ids(n), payloads, create_ms=now, dt_ms=now)

    left = rows
    while left > 0:
        sizes = []
        for _ in range(PARALLEL_WRITES):
            n = min(WRITE_LINES, left)
            if n == 0:
                break
            sizes.append(n)
            left -= n
        await asyncio.gather(*(write(n) for n in sizes))


async def measure_ingest(
    dsn: str, directory: Path, *, rows: int, batch: int, workers: int, limit_s: float
) -> IngestResult:
    journal = await Journal.open(directory)
    try:
        start = time.perf_counter()
        await _fill(journal, rows)
        write_seconds = time.perf_counter() - start
        if journal.lag.unread_lines != rows:
            raise BenchError(f"journal holds {journal.lag.unread_lines} unread lines, not {rows}")
        store = await PgStore.connect(dsn)
        try:
            ingester = Ingester(journal, store, ingest_batch=batch, ingest_workers=workers)
            start = time.perf_counter()
            task = asyncio.create_task(ingester.run())
            try:
                while journal.lag.unread_lines > 0:
                    if task.done():
                        task.result()  # raises what stopped it
                        raise BenchError("the ingester returned with lines unread")
                    if time.perf_counter() - start > limit_s:
                        raise BenchError(
                            f"ingest of {rows} rows not done in {limit_s:.0f} s "
                            f"({journal.lag.unread_lines} lines unread)"
                        )
                    await asyncio.sleep(0.002)
                seconds = time.perf_counter() - start
            finally:
                ingester.stop()
                try:
                    await asyncio.wait_for(asyncio.shield(task), 5)
                except TimeoutError:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            await store.close()
    finally:
        await journal.close()
    stored = await count_jobs(dsn, JOBTYPE)
    if stored != rows:
        raise BenchError(f"the store holds {stored} ingested rows, not {rows}")
    return IngestResult(rows, batch, workers, seconds, write_seconds)
