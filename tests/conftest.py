"""Shared fixtures: one real PostgreSQL per session, a fresh database per test."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.pgserver import PgServer

TEMPLATE = "qd_template"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never inherit the operator's QUEUE_DAEMON_* settings."""
    for key in list(os.environ):
        if key.startswith("QUEUE_DAEMON_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer | None]:
    """The session's PostgreSQL; None when QUEUE_TEST_DSN names an external one."""
    if os.environ.get("QUEUE_TEST_DSN"):
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="qd-pg-"))
    server = PgServer(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_admin_dsn(pg_server: PgServer | None) -> str:
    """DSN of the maintenance database, where tests create their own databases."""
    external = os.environ.get("QUEUE_TEST_DSN")
    if external:
        return external
    assert pg_server is not None
    return pg_server.dsn()


def _with_database(dsn: str, database: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


@pytest.fixture(scope="session")
def pg_template(pg_admin_dsn: str) -> str:
    """A database with every migration applied, cloned by each test."""
    from store.pg import PgStore

    async def build() -> None:
        conn = await asyncpg.connect(pg_admin_dsn)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
            await conn.execute(f"CREATE DATABASE {TEMPLATE}")
        finally:
            await conn.close()
        store = await PgStore.connect(_with_database(pg_admin_dsn, TEMPLATE))
        await store.close()

    asyncio.run(build())
    return TEMPLATE


@pytest.fixture
async def pg_dsn(pg_admin_dsn: str, pg_template: str) -> AsyncIterator[str]:
    """DSN of a fresh, migrated database for this test alone."""
    name = "t_" + uuid.uuid4().hex[:16]
    conn = await asyncpg.connect(pg_admin_dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name} TEMPLATE {pg_template}")
    finally:
        await conn.close()
    yield _with_database(pg_admin_dsn, name)
    conn = await asyncpg.connect(pg_admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()


@pytest.fixture
def pg_empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """DSN of an empty (unmigrated) database, for migration and start-up tests."""
    name = "e_" + uuid.uuid4().hex[:16]

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(pg_admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f"CREATE DATABASE {name}"))
    yield _with_database(pg_admin_dsn, name)
    asyncio.run(run(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
