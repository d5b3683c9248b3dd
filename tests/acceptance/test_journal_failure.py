"""The journal cannot be written: adds are 503 and accept nothing (docs/api.md, add route).

Root ignores file permissions, so the segment is made immutable (``chattr +i``),
which refuses writes even through the daemon's open file descriptor.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from harness.api import Api, assert_error, until
from harness.daemons import DaemonFactory, add_tenant, only_journal


def _chattr(flag: str, path: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    return done.returncode == 0


class Immutable:
    """Makes files immutable and always makes them writable again."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def set(self, path: Path) -> None:
        if not _chattr("+i", path):
            pytest.skip("chattr +i is not available on this file system")
        self.paths.append(path)

    def clear(self) -> None:
        while self.paths:
            _chattr("-i", self.paths.pop())


@pytest.fixture
def immutable() -> Iterator[Immutable]:
    files = Immutable()
    try:
        yield files
    finally:
        files.clear()


async def _stored_payloads(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        return [row["data"] for row in await conn.fetch("SELECT data FROM all_jobs")]
    finally:
        await conn.close()


async def test_an_unwritable_journal_is_503_and_accepts_nothing(
    pg_dsn: str,
    daemons: DaemonFactory,
    data_dir: Path,
    session: aiohttp.ClientSession,
    immutable: Immutable,
) -> None:
    token = add_tenant("jf", store=pg_dsn, data_dir=data_dir, cwd=data_dir.parent)
    daemon = daemons.start(data_dir, pg_dsn)
    api = Api(session, daemon.url, "jf", token)
    [before] = await api.add("t", ["before"])
    await api.wait_job(before)

    segment = max(only_journal(data_dir).glob("seg-*.log"))
    immutable.set(segment)
    reply = await api.add_raw("t", "during-1\nduring-2\n")
    assert_error(reply, 503, "unavailable")
    ready = await api.readyz()
    body = assert_error(ready, 503, "unavailable")
    assert not body["checks"]["journal"]["ok"], body
    health = await api.healthz()  # docs/api.md: 503 when the journal cannot be written
    assert_error(health, 503, "unavailable")
    assert health.json["journal"] == "failed", health
    live = await api.request("GET", "/livez")  # liveness: still serving, and saying so
    assert live.status == 200 and live.json["journal"] == "failed", live
    immutable.clear()

    # whether this daemon recovers by itself is its business; a restart must work
    daemon.kill()
    daemon = daemons.start(data_dir, pg_dsn)
    api = Api(session, daemon.url, "jf", token)
    [after] = await api.add("t", ["after"])
    await api.wait_job(after)
    await api.wait_caught_up()

    async def settled() -> list[str] | None:
        stored = await _stored_payloads(pg_dsn)
        return stored if "after" in stored else None

    stored = await until(settled, 20, "the job added after the restart")
    assert sorted(stored) == ["after", "before"], f"a 503 request was accepted: {stored}"
