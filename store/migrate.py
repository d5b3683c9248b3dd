"""Numbered schema migrations, applied at start-up.

Files ``store/migrations/NNNN_name.sql`` are applied in order, each in its own
transaction together with its row in ``schema_migrations``. A session-level
advisory lock serialises daemons that start at the same time: the first applies
what is missing, the others then find nothing left to do.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, TypeAlias

from queue_daemon.store import queries

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    from queue_daemon.store.pg import PgStore

    Connection: TypeAlias = asyncpg.Connection | PoolConnectionProxy[asyncpg.Record]

logger = logging.getLogger(__name__)

# Fixed key of the advisory lock taken while migrating ("qd-migr" in ASCII).
MIGRATION_LOCK_KEY = 0x71642D6D696772

# Waiting for another daemon's migrations and running ours may take longer than
# the pool's command_timeout (an index build on a big table); still bounded.
MIGRATION_TIMEOUT = 600.0

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations() -> list[Migration]:
    """The migration files shipped in ``store/migrations``, by version."""
    found: list[Migration] = []
    for entry in (resources.files("queue_daemon.store") / "migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(
                Migration(version=int(match[1]), name=entry.name, sql=entry.read_text("utf-8"))
            )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions in {versions}")
    return found


async def _versions(conn: Connection) -> list[int]:
    if not await conn.fetchval(queries.migrations.MIGRATIONS_TABLE_EXISTS):
        return []
    return [row["version"] for row in await conn.fetch(queries.migrations.MIGRATIONS_APPLIED)]


async def applied_migrations(target: Connection | PgStore) -> list[int]:
    """Versions recorded in ``schema_migrations`` (empty before the first run)."""
    from queue_daemon.store.pg import PgStore  # pg imports this module

    if isinstance(target, PgStore):
        return await target.applied_migrations()
    return await _versions(target)


async def migrate(conn: Connection) -> list[int]:
    """Apply every missing migration on ``conn`` (outside a transaction).

    Return the versions this call applied. Raises asyncpg errors; the caller
    translates them.
    """
    await conn.execute(
        queries.migrations.MIGRATION_LOCK, MIGRATION_LOCK_KEY, timeout=MIGRATION_TIMEOUT
    )
    try:
        await conn.execute(queries.migrations.MIGRATIONS_TABLE)
        done = set(await _versions(conn))
        applied: list[int] = []
        for migration in available_migrations():
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql, timeout=MIGRATION_TIMEOUT)
                await conn.execute(queries.migrations.MIGRATION_RECORD, migration.version)
            applied.append(migration.version)
            logger.info(
                "migration %s applied",
                migration.name,
                extra={"action": "migration_applied", "version": migration.version},
            )
        return applied
    finally:
        if not conn.is_closed():
            await conn.execute(queries.migrations.MIGRATION_UNLOCK, MIGRATION_LOCK_KEY)
