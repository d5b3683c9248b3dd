"""SQL only the bench (and the tests of cost at depth) uses, kept out of the
production store: a bare COPY ceiling, and filling the jobs table with many
waiting and archived jobs in one statement each. It writes the store's tables
directly, so it follows their schema (``store/migrations``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import asyncpg

COPY_COLUMNS = ("id", "type", "dt", "data", "create_dt")  # the store's COPY columns
CEILING_TABLE = "jobs_copy_ceiling"
CEILING_CREATE = f"""
CREATE TEMP TABLE IF NOT EXISTS {CEILING_TABLE}
    (LIKE jobs INCLUDING DEFAULTS) ON COMMIT DELETE ROWS
"""
CEILING_DROP = f"DROP TABLE IF EXISTS {CEILING_TABLE}"
FILL_WAITING = """
INSERT INTO jobs (id, type, dt, data, create_dt)
SELECT 'w' || lpad(i::text, 9, '0'), 'bench-t' || (i % $2),
       now() - interval '1 hour' + i * interval '1 microsecond',
       '{"n": ' || i || '}', now() - interval '1 hour'
FROM generate_series(1, $1::int) AS i
"""
# Done by a release, as a release leaves them (in jobs_done, 0013, whose
# triggers count them).
FILL_ARCHIVED = """
INSERT INTO jobs_done (id, type, data, create_dt, done_dt, attempts, code, exitcode,
                       run_dt, ran_by)
SELECT 'a' || lpad(i::text, 9, '0'), 'bench-t' || (i % $2), '{"n": ' || i || '}',
       now() - interval '2 hours', now() - interval '1 hour' + i * interval '1 microsecond',
       1, 'ok', 200, now() - interval '1 hour', '1'
FROM generate_series(1, $1::int) AS i
"""

# $1 the stored type, $2 how many: due an hour ago, one microsecond apart
FILL_ONE_TYPE = """
INSERT INTO jobs (id, type, dt, data, create_dt)
SELECT 'o' || lpad(i::text, 9, '0'), $1,
       now() - interval '1 hour' + i * interval '1 microsecond', '{}', now() - interval '1 hour'
FROM generate_series(1, $2::int) AS i
"""
# $1 types over $2 tenants ('bt0000'... or $4 for the first), $3 jobs a type
FILL_TYPES = """
INSERT INTO jobs (id, type, dt, data, create_dt)
SELECT 'm' || lpad(t::text, 7, '0') || '-' || k,
       CASE WHEN t % $2 = 0 THEN $4 ELSE 'bt' || lpad((t % $2)::text, 4, '0') END
           || '-idle' || t,
       now() - interval '1 hour', '{}', now() - interval '1 hour'
FROM generate_series(0, $1::int - 1) AS t, generate_series(1, $3::int) AS k
"""


async def fill_one_type(conn: asyncpg.Connection, jobtype: str, n: int) -> None:
    """``n`` due jobs of the stored ``jobtype``."""
    await conn.execute(FILL_ONE_TYPE, jobtype, n, timeout=3600)


async def fill_types(
    conn: asyncpg.Connection, client: str, types: int, tenants: int, *, per_type: int
) -> None:
    """``types`` waiting types spread over ``tenants`` tenants (``client`` is one of
    them), ``per_type`` due jobs each."""
    await conn.execute(FILL_TYPES, types, tenants, per_type, client, timeout=3600)


async def copy_ceiling(conn: asyncpg.Connection, n: int, batch: int) -> float:
    """Rows/s of bare COPY of ``n`` job rows, ``batch`` at a time, into an
    index-free temp table with the jobs columns: what the store's adds can reach."""
    now = datetime.now(UTC)
    rows = [(f"ceiling-{i:09d}", "bench-ceiling", now, f'{{"n": {i}}}', now) for i in range(n)]
    await conn.execute(CEILING_CREATE)
    try:
        start = time.perf_counter()
        for offset in range(0, n, batch):
            await conn.copy_records_to_table(
                CEILING_TABLE, records=rows[offset : offset + batch], columns=COPY_COLUMNS
            )
        elapsed = time.perf_counter() - start
    finally:
        await conn.execute(CEILING_DROP)
    return n / elapsed if elapsed > 0 else float("inf")


async def fill(conn: asyncpg.Connection, waiting: int, archived: int, types: int) -> None:
    """Insert ``waiting`` eligible and ``archived`` done jobs spread over ``types``
    jobtypes ``bench-t0``... in SQL, then ANALYZE."""
    await conn.execute(FILL_WAITING, waiting, types, timeout=3600)
    await conn.execute(FILL_ARCHIVED, archived, types, timeout=3600)
    await conn.execute("ANALYZE jobs", timeout=3600)
    await conn.execute("ANALYZE jobs_done", timeout=3600)
