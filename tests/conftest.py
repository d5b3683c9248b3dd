"""Shared fixtures: one real PostgreSQL per session, a fresh database per test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import pytest

from harness.databases import with_database
from harness.pgserver import PgServer
from queue_daemon.store.embedded import SERVER_HOME
from queue_daemon.store.homes import sweep_homes

TEMPLATE = "qd_template"
_STOP_FIRST = pytest.StashKey[list[Callable[[], None]]]()


def stop_first(request: pytest.FixtureRequest, stop: Callable[[], None]) -> None:
    """Call ``stop`` as the test's teardown begins, before any fixture's: the
    processes a test started stop before the databases and directories they
    use are dropped (else each waits out its drain timeout against a store
    that is gone)."""
    request.node.stash.setdefault(_STOP_FIRST, []).append(stop)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    stops: list[Callable[[], None]] = item.stash.get(_STOP_FIRST, [])
    for stop in reversed(stops):
        # a failure here would skip pytest's own teardown of the fixtures; the
        # fixture that registered ``stop`` calls it again there, and reports it
        with contextlib.suppress(Exception):
            stop()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never inherit the operator's QUEUE_DAEMON_* settings."""
    for key in list(os.environ):
        if key.startswith("QUEUE_DAEMON_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session", autouse=True)
def _server_homes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """As root, daemons and CLI commands keep the embedded server's data (and
    handlers' directories) below ``SERVER_HOME``, outside the tests' temp
    directories. Those of data directories that are gone are swept before and
    after the session, and at its end those of this session's own temporary data
    directories too (pytest keeps them a while; the servers' data goes now). A
    concurrent run's, whose data directories exist, are left alone. What this
    session made and the sweep could not remove fails the session's last test."""
    if os.geteuid() != 0:
        yield
        return
    sweep_homes(SERVER_HOME)
    began = time.time()
    yield
    ours = tmp_path_factory.getbasetemp().resolve()

    def made_here(home: Path, owner: Path) -> bool:
        """Made by this session: for its temporary data directories, or for a
        directory of its own (``mkdtemp``) since it began."""
        marker = home / "data_dir"
        return owner.is_relative_to(ours) or (marker.exists() and marker.stat().st_mtime >= began)

    left = [
        f"{o.home} ({o.owner}): {o.reason}"
        for o in sweep_homes(SERVER_HOME, also_gone=lambda owner: owner.is_relative_to(ours))
        if not o.removed
        and o.owner is not None
        and not o.owner.exists()
        and made_here(o.home, o.owner)
    ]
    assert left == [], "directories below SERVER_HOME outlived their data directories"


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
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_dsn(pg_server: PgServer | None) -> str:
    """DSN of the maintenance database, where tests create their own databases."""
    external = os.environ.get("QUEUE_TEST_DSN")
    if external:
        return external
    assert pg_server is not None
    return pg_server.dsn()


async def _admin(admin_dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.contextmanager
def scratch_database(admin_dsn: str, prefix: str, template: str | None = None) -> Iterator[str]:
    """A new database (a copy of ``template`` if given) for the block; dropped after it."""
    name = prefix + uuid.uuid4().hex[:16]
    clone = f" TEMPLATE {template}" if template else ""
    asyncio.run(_admin(admin_dsn, f"CREATE DATABASE {name}{clone}"))
    try:
        yield with_database(admin_dsn, name)
    finally:
        asyncio.run(_admin(admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(scope="session")
def pg_template(pg_admin_dsn: str) -> str:
    """A database with every migration applied, cloned by each test."""
    from queue_daemon.store.pg import PgStore

    async def build() -> None:
        conn = await asyncpg.connect(pg_admin_dsn)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
            await conn.execute(f"CREATE DATABASE {TEMPLATE}")
        finally:
            await conn.close()
        store = await PgStore.connect(with_database(pg_admin_dsn, TEMPLATE))
        await store.close()

    asyncio.run(build())
    return TEMPLATE


@pytest.fixture
def pg_dsn(pg_admin_dsn: str, pg_template: str) -> Iterator[str]:
    """DSN of a fresh, migrated database for this test alone."""
    with scratch_database(pg_admin_dsn, "t_", pg_template) as dsn:
        yield dsn


@pytest.fixture
def pg_empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """DSN of an empty (unmigrated) database, for migration and start-up tests."""
    with scratch_database(pg_admin_dsn, "e_") as dsn:
        yield dsn
