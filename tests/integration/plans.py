"""What a statement costs, read from PostgreSQL's own account of running it."""

from __future__ import annotations

import asyncpg


async def pages_read(conn: asyncpg.Connection, sql: str, *args: object) -> int:
    """Shared buffers (hit + read) running ``sql`` touched, from EXPLAIN
    (ANALYZE, BUFFERS) of the whole statement: what grows if it reads row by row."""
    plan = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *args)
    for line in (r[0] for r in plan):
        if "Buffers: shared" in line:
            return sum(int(part.split("=")[1]) for part in line.split() if "=" in part)
    return 0
