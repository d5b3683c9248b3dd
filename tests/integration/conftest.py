"""Fixtures shared by the integration tests: a store on a fresh database, a raw
connection to it, and a work root that handler processes can reach."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from queue_daemon.store.pg import PgStore


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PgStore]:
    s = await PgStore.connect(pg_dsn, min_size=1, max_size=12)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def conn(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(pg_dsn)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def work_root() -> Iterator[Path]:
    # not below pytest's tmp_path: handler users must reach it (its parents are 0700)
    root = Path(tempfile.mkdtemp(prefix="qd-runner-"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)
