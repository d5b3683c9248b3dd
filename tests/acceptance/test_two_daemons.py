"""Several daemons on one machine, started at the same moment; and SIGTERM draining.

Nothing may assume a single daemon (docs/architecture.md "Scale"): two daemons racing on
the same data directory and an empty store both come up with distinct sysids
and migrate the store exactly once, on an external store and on the embedded one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from harness.api import Api, until
from harness.daemons import (
    DaemonFactory,
    DaemonProcess,
    add_tenant,
    journal_dirs,
    only_journal,
)
from queue_daemon.runners.sandbox.cpuplace import DAEMON, PREFIX, _v1_cpu_dir
from queue_daemon.store.embedded import stop_server
from tests.acceptance.storecheck import duplicates, fetch_counts, payloads, wait_all_stored

MIGRATIONS = sorted(
    int(p.name[:4]) for p in (Path(__file__).parents[2] / "store" / "migrations").glob("*.sql")
)


def _migration_log_lines(daemon: DaemonProcess) -> list[str]:
    return [
        line
        for line in daemon.stderr_text().splitlines()
        if " INFO " in line and "migration" in line.lower()
    ]


async def _sysids(session: aiohttp.ClientSession, pair: list[DaemonProcess]) -> list[str]:
    out = []
    for daemon in pair:
        reply = await Api(session, daemon.url, "x", None).healthz()
        assert reply.status == 200, reply
        out.append(reply.json["sysid"])
    return out


async def _shared_store_roundtrip(
    session: aiohttp.ClientSession, pair: list[DaemonProcess], token: str
) -> None:
    """A job added on one daemon is readable on the other (one store behind both)."""
    first, second = (Api(session, d.url, "both", token) for d in pair)

    async def accepted() -> bool | None:
        # a tenant created after the daemons started: wait for both token caches
        statuses = [(await api.stats()).status for api in (first, second)]
        return True if statuses == [200, 200] else None

    await until(accepted, 10, "the new tenant's token to be accepted by both daemons")
    [job_id] = await first.add("t", ["via first"])
    job = await second.wait_job(job_id)
    assert job["state"] == "waiting"


async def test_two_daemons_started_together_on_an_empty_store(
    pg_empty_dsn: str, daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    pair = [daemons.spawn(data_dir, pg_empty_dsn) for _ in range(2)]
    for daemon in pair:
        daemon.wait_ready()
    sysids = await _sysids(session, pair)
    assert sysids[0] != sysids[1], sysids
    for sysid in sysids:
        assert (data_dir / f"journal-{sysid}").is_dir()

    conn = await asyncpg.connect(pg_empty_dsn)
    try:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    finally:
        await conn.close()
    assert [row["version"] for row in rows] == MIGRATIONS

    logged = [_migration_log_lines(d) for d in pair]
    assert sum(1 for lines in logged if lines) == 1, f"migration log lines: {logged}"
    assert sum(len(lines) for lines in logged) == len(MIGRATIONS), logged

    token = add_tenant("both", store=pg_empty_dsn, data_dir=data_dir, cwd=data_dir.parent)
    await _shared_store_roundtrip(session, pair, token)
    for daemon in pair:
        assert daemon.terminate() == 0, daemon.stderr_text()[-3000:]


async def test_two_daemons_race_to_adopt_an_orphaned_journal(
    pg_dsn: str, daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("orphan", store=pg_dsn, data_dir=data_dir, cwd=data_dir.parent)
    dead = daemons.start(data_dir, pg_dsn)
    api = Api(session, dead.url, "orphan", token)
    acked: dict[str, str] = {}
    for n in range(5):
        lines = [f"o{n}-{k}" for k in range(20)]
        acked.update(zip(await api.add("t", lines), lines, strict=True))
    dead.kill()
    orphan = only_journal(data_dir)

    pair = [daemons.spawn(data_dir, pg_dsn) for _ in range(2)]
    for daemon in pair:
        daemon.wait_ready()
    sysids = await _sysids(session, pair)
    assert sysids[0] != sysids[1], sysids
    assert orphan.name.removeprefix("journal-") in sysids, f"nobody adopted {orphan}: {sysids}"
    assert len(journal_dirs(data_dir)) == 2
    await wait_all_stored(pg_dsn, acked, 30)
    assert await duplicates(pg_dsn) == []
    assert await payloads(pg_dsn, acked) == acked
    for daemon in pair:
        assert daemon.terminate() == 0


def _postgres_processes(pgdata: Path) -> list[int]:
    """Pids of processes whose command line names ``pgdata`` and whose name is postgres
    (as root ``DATA_DIR/pg`` links to the server's own directory: its real path)."""
    pgdata = pgdata.resolve()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            comm = (proc / "comm").read_text().strip()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if comm.startswith("postgres") and str(pgdata) in cmdline:
                found.append(int(proc.name))
    return found


async def test_two_daemons_share_the_embedded_store(
    daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    pgdata = data_dir / "pg"  # tmp_path is absolute and resolved
    pair: list[DaemonProcess] = []
    try:
        pair += [daemons.spawn(data_dir, None) for _ in range(2)]
        for daemon in pair:
            daemon.wait_ready()
        sysids = await _sysids(session, pair)
        assert sysids[0] != sysids[1], sysids
        assert _postgres_processes(pgdata), "no embedded server runs in DATA_DIR/pg"
        logged = [_migration_log_lines(d) for d in pair]
        assert sum(1 for lines in logged if lines) == 1, f"migration log lines: {logged}"

        token = add_tenant("both", store=None, data_dir=data_dir, cwd=data_dir.parent)
        assert _postgres_processes(pgdata), "the CLI stopped the server the daemons use"
        await _shared_store_roundtrip(session, pair, token)

        for daemon in pair:
            daemon.sigterm()  # SIGTERM both at once
        for daemon in pair:
            assert daemon.terminate() == 0, daemon.stderr_text()[-3000:]

        async def stopped() -> bool | None:
            return True if not _postgres_processes(pgdata) else None

        await until(stopped, 15, f"the embedded server in {pgdata} to stop")
    finally:
        for daemon in pair:
            daemon.close()  # before their server goes
        stop_server(pgdata)


async def test_sigterm_drains_everything_acknowledged(
    pg_dsn: str, daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("drain", store=pg_dsn, data_dir=data_dir, cwd=data_dir.parent)
    daemon = daemons.start(data_dir, pg_dsn)
    api = Api(session, daemon.url, "drain", token)
    acked: dict[str, str] = {}
    stopping = asyncio.Event()

    async def post(number: int) -> None:
        for request in range(10_000):
            lines = [f"d{number}-{request}-{k}" for k in range(200)]
            try:
                reply = await api.add_raw("drain", "\n".join(lines))
            except (aiohttp.ClientError, TimeoutError):
                assert stopping.is_set(), "a request failed before SIGTERM"
                return
            if reply.status != 200:
                assert stopping.is_set(), f"add failed before SIGTERM: {reply}"
                return
            acked.update(zip(reply.json["ids"], lines, strict=True))

    workers = [asyncio.create_task(post(n)) for n in range(4)]

    async def enough() -> bool | None:
        return True if len(acked) >= 4000 else None

    await until(enough, 20, "4000 acknowledged jobs")
    stopping.set()
    daemon.sigterm()  # SIGTERM while the clients still post
    await asyncio.wait_for(asyncio.gather(*workers), 30)
    code = await asyncio.to_thread(daemon.terminate, 30)
    assert code == 0, daemon.stderr_text()[-3000:]
    assert "Traceback" not in daemon.stderr_text()

    # no second daemon and no polling: the one that stopped ingested it all before exiting
    counts = await fetch_counts(pg_dsn)
    missing = set(acked) - set(counts)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged jobs not ingested at exit"
    assert all(n == 1 for n in counts.values())
    assert await payloads(pg_dsn, acked) == acked


def _cpu_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _number, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return ""


@pytest.mark.skipif(
    os.geteuid() != 0 or not _cpu_cgroup(os.getpid()),
    reason="needs root and the cgroup v1 cpu controller",
)
def test_the_embedded_server_starts_in_the_daemons_cpu_place(
    daemons: DaemonFactory, data_dir: Path
) -> None:
    """The PostgreSQL a daemon starts shares the daemon's CPU place: the server's
    processes start in it; when the daemon stops, its place goes."""
    pgdata = data_dir / "pg"
    daemon = daemons.spawn(data_dir, None)
    try:
        daemon.wait_ready()
        place = f"/{PREFIX}{daemon.pid}/{DAEMON}"
        assert _cpu_cgroup(daemon.pid).endswith(place)
        servers = _postgres_processes(pgdata)
        assert servers, "no embedded server runs in DATA_DIR/pg"
        assert all(_cpu_cgroup(pid).endswith(place) for pid in servers), [
            (pid, _cpu_cgroup(pid)) for pid in servers
        ]
        assert daemon.terminate() == 0, daemon.stderr_text()[-3000:]
        assert not any(PREFIX in _cpu_cgroup(pid) for pid in _postgres_processes(pgdata))
        origin = _v1_cpu_dir()
        assert origin is not None and not (origin / f"{PREFIX}{daemon.pid}").exists()
    finally:
        daemon.close()
        stop_server(pgdata)
