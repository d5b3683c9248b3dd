"""Tenants' uids come from a registry in the store: unique, never derived from names.

``mallory_1e0bb`` was chosen so that a hash of the name would give it ``bob``'s
uid: it ran as bob and read his files. Every tenant now gets a slot of its
own (a sequence in the store) in the daemon's uid range, and a tenant whose uid
is a user of the host runs nothing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from harness.api import Handlers, wait_done
from harness.daemons import DaemonFactory, Deployment, deploy, reachable_dir
from queue_daemon.runners.sandbox.users import TENANT_UID_SPAN
from queue_daemon.store import queries

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant uids need root")


@pytest.fixture
def root_dir() -> Iterator[str]:
    path = reachable_dir("qd-uids-")
    try:
        yield str(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def deployed(
    daemons: DaemonFactory, dsn: str, root: str, clients: list[str], *args: str
) -> Deployment:
    return deploy(daemons, dsn, Path(root), clients, *args)


async def test_a_name_chosen_to_collide_gets_a_uid_of_its_own(
    daemons: DaemonFactory, pg_dsn: str, root_dir: str, session: aiohttp.ClientSession
) -> None:
    def hashed(name: str) -> int:
        return zlib.crc32(name.encode()) % TENANT_UID_SPAN

    assert hashed("bob") == hashed("mallory_1e0bb")  # the names collide by the old rule
    site: Deployment = deployed(daemons, pg_dsn, root_dir, ["bob", "mallory_1e0bb"])
    uids = {}
    for client in ("bob", "mallory_1e0bb"):
        api = site.api(session, client)
        await Handlers(api).add("who", "shell", 'echo "S: 200 $(id -u)"')
        [job_id] = await api.add("who", ["x"])
        uids[client] = (await wait_done(api, job_id))["result"]
    assert uids["bob"] != uids["mallory_1e0bb"], uids
    conn = await asyncpg.connect(pg_dsn)
    try:
        slots = await conn.fetch("SELECT client, slot FROM tenant_uids ORDER BY slot")
    finally:
        await conn.close()
    assert [r["client"] for r in slots] == ["bob", "mallory_1e0bb"]
    assert {str(2_000_000 + r["slot"]) for r in slots} == set(uids.values())


async def test_a_tenant_whose_uid_is_a_host_user_runs_nothing(
    daemons: DaemonFactory, pg_dsn: str, root_dir: str, session: aiohttp.ClientSession
) -> None:
    # the range starts at nobody's uid: the first tenant's slot is that user
    site: Deployment = deployed(daemons, pg_dsn, root_dir, ["first"], "--tenant-uid-base", "65534")
    api = site.api(session, "first")
    await Handlers(api).add("who", "shell", "id -u", maxAttempts=1)
    [job_id] = await api.add("who", ["x"])
    job = await wait_done(api, job_id)
    assert job["code"] == "error", job
    assert "is the user 'nobody' of this host" in job["result"], job


async def test_concurrent_tenant_adds_get_distinct_slots(pg_dsn: str) -> None:
    async def add(n: int) -> None:
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(queries.tenants.ENSURE_UID_SLOT, f"t{n % 10}")
        finally:
            await conn.close()

    await asyncio.gather(*(add(n) for n in range(20)))
    conn = await asyncpg.connect(pg_dsn)
    try:
        slots = [r["slot"] for r in await conn.fetch("SELECT slot FROM tenant_uids")]
    finally:
        await conn.close()
    assert len(slots) == len(set(slots)) == 10  # twice each client: one slot each


async def test_an_anonymous_client_gets_a_uid_of_its_own(
    daemons: DaemonFactory, pg_dsn: str, root_dir: str, session: aiohttp.ClientSession
) -> None:
    """Under --no-auth any client name works, tenant or not: its first batch gives it
    a slot, and its jobs run."""
    site = deployed(daemons, pg_dsn, root_dir, [], "--no-auth")
    api = site.api(session, "anyone")
    await Handlers(api).add("who", "shell", 'echo "S: 200 $(id -u)"')
    [job_id] = await api.add("who", ["x"])
    job = await wait_done(api, job_id)
    assert job["code"] == "ok" and int(job["result"]) >= 2_000_000, job
