"""Fixtures of the acceptance tests: real daemons, real PostgreSQL, real files."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.daemons import DaemonFactory, reachable_dir
from tests.conftest import scratch_database, stop_first


@pytest.fixture
def daemons(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DaemonFactory]:
    """Start daemons with ``daemons.start(...)``; every one is stopped as the
    test's teardown begins (before its database and directories go)."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    factory = DaemonFactory(log_dir)
    stop_first(request, factory.close)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        yield s


@pytest.fixture(scope="module")
def module_dsn(pg_admin_dsn: str, pg_template: str) -> Iterator[str]:
    """A fresh migrated database shared by the tests of one module (one daemon for all)."""
    with scratch_database(pg_admin_dsn, "m_", pg_template) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def module_daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path_factory.mktemp("logs"))
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """Like ``tmp_path``, but reachable by handler processes (see ``reachable_dir``)."""
    path = reachable_dir("qd-run-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_open_tmp() -> Iterator[Path]:
    """``open_tmp`` for a whole module (a daemon shared by its tests)."""
    path = reachable_dir("qd-run-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
