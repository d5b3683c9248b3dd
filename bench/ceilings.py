"""Ceilings measured in the same run: the disk's fdatasync rate and PostgreSQL's COPY rate."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from bench import storefill
from queue_daemon.store.pg import PgStore

SCRATCH = "bench_copy_jobs_like"
COLUMNS = ("id", "type", "dt", "data", "create_dt")
LINE = b'{"ceiling": "fsync", "pad": "0123456789abcdef"}\n'


def fsync_ceiling(directory: Path, seconds: float) -> tuple[float, float]:
    """(fdatasyncs per second, mean ms each): a tight append + fdatasync loop."""
    path = directory / "fsync-ceiling.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(20):  # allocate the first blocks before the clock runs
            os.write(fd, LINE)
            os.fdatasync(fd)
        count = 0
        start = time.perf_counter()
        deadline = start + seconds
        now = start
        while now < deadline:
            os.write(fd, LINE)
            os.fdatasync(fd)
            count += 1
            now = time.perf_counter()
        elapsed = now - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return count / elapsed, 1000 * elapsed / count


async def copy_ceilings(dsn: str, rows: int, batches: list[int]) -> dict[int, float]:
    """COPY rows/s into an index-free scratch table with the jobs columns, per batch size.

    ``bench.storefill.copy_ceiling``: a temp table, so no WAL and no index either.
    """
    await (await PgStore.connect(dsn)).close()  # the schema, migrated
    conn = await asyncpg.connect(dsn)
    try:
        await storefill.copy_ceiling(conn, min(rows, 10_000), min(batches))  # warm up
        return {batch: await storefill.copy_ceiling(conn, rows, batch) for batch in batches}
    finally:
        await conn.close()


async def copy_into_jobs_like(dsn: str, rows: int, batches: list[int]) -> dict[int, float]:
    """COPY rows/s into a logged table built ``LIKE jobs INCLUDING ALL`` (its indexes too),
    one transaction per batch, ids ascending as the daemon makes them: what the
    ingester's insert costs PostgreSQL, Python apart. Needs the migrated schema."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE TABLE {SCRATCH} (LIKE jobs INCLUDING ALL)")
        now = datetime.now(UTC)
        records = [
            (f"{i:013x}-bench", "bench-ceiling", now, f'{{"n": {i}, "pad": "0123456789"}}', now)
            for i in range(rows)
        ]
        rates = {}
        for batch in batches:
            await conn.execute(f"TRUNCATE {SCRATCH}")
            start = time.perf_counter()
            for offset in range(0, rows, batch):
                await conn.copy_records_to_table(
                    SCRATCH, records=records[offset : offset + batch], columns=COLUMNS
                )
            rates[batch] = rows / (time.perf_counter() - start)
        return rates
    finally:
        try:
            await conn.execute(f"DROP TABLE IF EXISTS {SCRATCH}")
        finally:
            await conn.close()
