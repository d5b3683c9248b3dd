"""The embedded PostgreSQL default: started on demand, password-protected, stopped by
the last user."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from queue_daemon.store.embedded import EmbeddedPostgres, stop_server


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # short and outside pytest's 0700 tmp tree: the server runs as its own user
    root = Path(tempfile.mkdtemp(prefix="qd-emb-"))
    try:
        yield root / "data"
    finally:
        stop_server(root / "data" / "pg")
        shutil.rmtree(root, ignore_errors=True)


async def test_the_embedded_server_requires_its_password(data_dir: Path) -> None:
    first = EmbeddedPostgres(data_dir)
    dsn = await asyncio.to_thread(first.start)  # as the daemon does: it blocks
    secret = data_dir / "pg.secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_text().strip() in dsn
    conn = await asyncpg.connect(dsn)
    assert await conn.fetchval("SELECT 1") == 1
    await conn.close()
    without = dsn.replace(secret.read_text().strip(), "", 1)
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(without)
    # starting again (as a second CLI command would) reuses the server and password
    second = EmbeddedPostgres(data_dir)
    assert await asyncio.to_thread(second.start) == dsn
    # sharing between daemons is tested with real processes in tests/acceptance;
    # in one process both are one user, and each lets go of its lock file
    assert second.stop_if_last() is True
    assert first.stop_if_last() is True
    assert not (data_dir / "pg" / "postmaster.pid").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the server's data lives apart only as root")
async def test_a_data_dir_deleted_and_made_again_gets_a_server_of_its_own(data_dir: Path) -> None:
    first = EmbeddedPostgres(data_dir)
    await asyncio.to_thread(first.start)
    home = (data_dir / "pg").resolve().parent
    assert first.stop_if_last() is True
    shutil.rmtree(data_dir)  # its link and password go; the server's data stays in home
    again = EmbeddedPostgres(data_dir)
    dsn = await asyncio.to_thread(again.start)  # was: password authentication failed
    try:
        conn = await asyncpg.connect(dsn)
        assert await conn.fetchval("SELECT 1") == 1
        await conn.close()
        assert any(p.name.startswith("pg.left-") for p in home.iterdir())
    finally:
        again.stop_if_last()
        for left in home.glob("pg.left-*"):
            shutil.rmtree(left, ignore_errors=True)
