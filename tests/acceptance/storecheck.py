"""Looking straight into the store, to check what the API cannot show (duplicates)."""

from __future__ import annotations

import time
from collections.abc import Collection

import asyncpg

from harness.api import until


async def fetch_counts(dsn: str) -> dict[str, int]:
    """id -> number of rows with that id in ``jobs``."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT id, count(*) AS n FROM all_jobs GROUP BY id")
    finally:
        await conn.close()
    return {row["id"]: row["n"] for row in rows}


async def duplicates(dsn: str) -> list[tuple[str, int]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT id, count(*) AS n FROM all_jobs GROUP BY id HAVING count(*) > 1"
        )
    finally:
        await conn.close()
    return [(row["id"], row["n"]) for row in rows]


async def payloads(dsn: str, ids: Collection[str]) -> dict[str, str]:
    """id -> stored payload (``jobs.data``) for the given ids that are stored."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT id, data FROM all_jobs WHERE id = ANY($1::text[])", list(ids)
        )
    finally:
        await conn.close()
    return {row["id"]: row["data"] for row in rows}


async def wait_all_stored(dsn: str, ids: Collection[str], within: float) -> dict[str, int]:
    """Poll the store until every id in ``ids`` is in it; return id -> row count."""
    wanted = set(ids)
    missing: set[str] = set(wanted)
    started = time.monotonic()

    async def probe() -> dict[str, int] | None:
        nonlocal missing
        try:
            counts = await fetch_counts(dsn)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return None  # the server may still be coming back
        missing = wanted - counts.keys()
        return counts if not missing else None

    try:
        return await until(probe, within, "acknowledged jobs in the store", interval=0.2)
    except AssertionError:
        sample = sorted(missing)[:5]
        raise AssertionError(
            f"{len(missing)} of {len(wanted)} acknowledged jobs not in the store after "
            f"{time.monotonic() - started:.0f} s, e.g. {sample}"
        ) from None
