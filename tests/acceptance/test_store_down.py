"""The store can be down (docs/architecture.md invariant 6): adds go on, ingestion resumes.

Each test has a PostgreSQL server of its own, which it stops and starts again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import Api, Reply, assert_error, until
from harness.daemons import DaemonFactory, DaemonProcess, add_tenant
from harness.pgserver import PgServer
from tests.acceptance.storecheck import duplicates, payloads, wait_all_stored

INGEST_WITHIN = 60.0


@pytest.fixture
def own_pg(tmp_path: Path) -> Iterator[PgServer]:
    server = PgServer(tmp_path / "own-pg")
    (tmp_path / "own-pg").mkdir()
    try:
        yield server
    finally:
        server.stop()


def _serve(
    own_pg: PgServer,
    daemons: DaemonFactory,
    data_dir: Path,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> tuple[str, DaemonProcess, Api]:
    """Start the server, add tenant ``t`` and start a daemon on it: the store's DSN,
    the daemon, and the tenant's client."""
    dsn = own_pg.start()
    token = add_tenant("t", store=dsn, data_dir=data_dir, cwd=tmp_path)
    daemon = daemons.start(data_dir, dsn)
    return dsn, daemon, Api(session, daemon.url, "t", token)


async def _wait_unready(api: Api) -> Reply:
    async def probe() -> Reply | None:
        reply = await api.readyz()
        return reply if reply.status == 503 else None

    return await until(probe, 20, "readyz 503 while PostgreSQL is down")


async def _add_while_down(api: Api, acked: dict[str, str]) -> None:
    """Several hundred jobs over a few requests, text and JSON: each must be a 200."""
    for request in range(4):
        lines = [f"down-{request}-{k}" for k in range(100)]
        acked.update(zip(await api.add("down", lines), lines, strict=True))
    reply = await api.add_raw("down", '["j1", {"j": 2}]', content_type="application/json")
    assert reply.status == 200, reply
    acked.update(zip(reply.json["ids"], ['"j1"', '{"j":2}'], strict=True))


async def test_adds_succeed_while_postgresql_is_down_and_reach_it_later(
    own_pg: PgServer,
    daemons: DaemonFactory,
    data_dir: Path,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    dsn, daemon, api = _serve(own_pg, daemons, data_dir, tmp_path, session)
    acked: dict[str, str] = {}
    [first] = await api.add("down", ["before"])
    acked[first] = "before"
    await api.wait_job(first)
    assert (await api.healthz()).status == 200
    assert (await api.readyz()).status == 200

    own_pg.stop()
    body = assert_error(await _wait_unready(api), 503, "unavailable")
    assert not body["checks"]["store"]["ok"], body
    await _add_while_down(api, acked)
    reply = await api.healthz()  # docs/api.md: 503 while the store cannot be reached
    assert_error(reply, 503, "unavailable")
    assert reply.json["store"] == "unreachable", reply
    live = await api.request("GET", "/livez")  # the daemon serves (adds succeed) meanwhile
    assert live.status == 200 and live.json["store"] == "unreachable", live
    assert reply.json["ingest_lag"]["lines"] >= len(acked) - 1, reply
    # reads need the store: a clean 503, not a hang or a 500
    assert_error(await api.get_job(first), 503, "unavailable")

    assert own_pg.start() == dsn, "the restarted server has another address"
    await wait_all_stored(dsn, acked, INGEST_WITHIN)
    caught_up = await api.wait_caught_up(INGEST_WITHIN)
    assert caught_up["ingest_lag"]["lines"] == 0
    assert await duplicates(dsn) == []
    assert await payloads(dsn, acked) == acked
    job = await api.wait_job(list(acked)[-1])
    assert job["state"] == "waiting"
    assert daemon.running()
    assert daemon.terminate() == 0


async def test_kill_9_while_postgresql_is_down_then_restart_loses_nothing(
    own_pg: PgServer,
    daemons: DaemonFactory,
    data_dir: Path,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    """Acked jobs that only the dead daemon's journal holds reach the store via the next one."""
    dsn, daemon, api = _serve(own_pg, daemons, data_dir, tmp_path, session)
    own_pg.stop()
    acked: dict[str, str] = {}
    await _add_while_down(api, acked)
    daemon.kill()

    assert own_pg.start() == dsn
    daemons.start(data_dir, dsn)
    await wait_all_stored(dsn, acked, INGEST_WITHIN)
    assert await duplicates(dsn) == []
    assert await payloads(dsn, acked) == acked


async def test_a_daemon_started_while_postgresql_is_down_comes_up_when_it_returns(
    own_pg: PgServer,
    daemons: DaemonFactory,
    data_dir: Path,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    dsn = own_pg.start()
    token = add_tenant("t", store=dsn, data_dir=data_dir, cwd=tmp_path)
    own_pg.stop()
    daemon = daemons.spawn(data_dir, dsn)

    async def waiting() -> bool | None:
        assert daemon.running(), daemon.stderr_text()[-3000:]
        return True if "waiting for the store" in daemon.stderr_text() else None

    await until(waiting, 20, "the daemon to wait for the store")
    assert own_pg.start() == dsn
    await asyncio.to_thread(daemon.wait_ready)
    api = Api(session, daemon.url, "t", token)
    [job_id] = await api.add("late", ["x"])
    await api.wait_job(job_id)


async def test_postgresql_crashing_mid_ingest_loses_no_acked_job(
    own_pg: PgServer,
    daemons: DaemonFactory,
    data_dir: Path,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    """The ingest's commits do not wait for the WAL flush (its rows are seen and
    notified at once), so a crash of PostgreSQL can lose them; the journal's read
    point moves only once the WAL is flushed, so the daemon ingests them again."""
    dsn, daemon, api = _serve(own_pg, daemons, data_dir, tmp_path, session)
    acked: dict[str, str] = {}
    stop = asyncio.Event()

    async def keep_adding() -> None:
        batch = 0
        while not stop.is_set():
            lines = [f"crash-{batch}-{k}" for k in range(200)]
            acked.update(zip(await api.add("crash", lines), lines, strict=True))
            batch += 1

    adder = asyncio.create_task(keep_adding())
    try:

        async def ingesting() -> bool | None:
            return True if len(acked) >= 20_000 else None

        await until(ingesting, 60, "20,000 acked jobs")
        await asyncio.to_thread(own_pg.crash)
        crashed_at = len(acked)

        async def adding_while_down() -> bool | None:
            return True if len(acked) >= crashed_at + 2_000 else None

        await until(adding_while_down, 30, "adds into the journal while PostgreSQL is down")
        assert own_pg.start() == dsn
    finally:
        stop.set()
        await adder
    await wait_all_stored(dsn, acked, INGEST_WITHIN)
    assert await duplicates(dsn) == []
    assert await payloads(dsn, acked) == acked
    assert daemon.running()
    assert daemon.terminate() == 0


async def test_a_daemon_that_died_while_postgresql_was_down_has_its_jobs_ingested_by_another(
    own_pg: PgServer,
    daemons: DaemonFactory,
    data_dir: Path,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    """Its journal holds every job it acknowledged; a daemon still running on the
    same data directory takes the journal's lock (which proves its holder dead)
    and ingests them within a lease, without waiting for the dead one's restart."""
    dsn, dying, api = _serve(own_pg, daemons, data_dir, tmp_path, session)
    survivor = daemons.start(data_dir, dsn, "--lease", "3")
    own_pg.stop()
    acked: dict[str, str] = {}
    await _add_while_down(api, acked)
    dying.kill()

    assert own_pg.start() == dsn
    await wait_all_stored(dsn, acked, 20)
    assert await duplicates(dsn) == []
    assert await payloads(dsn, acked) == acked
    assert "whose daemon died" in survivor.stderr_text()
    assert survivor.running()
    assert survivor.terminate() == 0
