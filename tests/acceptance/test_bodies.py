"""Request bodies cannot hold the daemon's memory or time.

An add is checked against its tenant's token and quotas before its body is
read; the bodies being read take at most ``--body-memory`` bytes, a quarter
of it (at least one ``--body-limit``) per tenant; and a body must be whole
within ``--body-timeout`` seconds, however steadily it trickles.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.api import until
from harness.daemons import DaemonFactory, Deployment, deployed_where_handlers_reach

MIB = 1 << 20
BODY = 8 * MIB


@pytest.fixture
def deployment(daemons: DaemonFactory, pg_dsn: str) -> Iterator[Deployment]:
    args = ["--body-limit", str(16 * MIB), "--body-memory", str(64 * MIB), "--body-timeout", "3"]
    args += ["--payload-limit", str(BODY)]
    with deployed_where_handlers_reach(
        daemons, pg_dsn, "qd-bodies-", ["slow", "calm"], *args
    ) as deployed:
        yield deployed


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Upload:
    """A POST of a ``length``-byte body sent ``chunk`` bytes every ``every`` seconds;
    ``status`` is the reply's status once one came (None while none did)."""

    def __init__(self, url: str, token: str, length: int, chunk: int, every: float) -> None:
        self.url, self.token = url, token
        self.length, self.chunk, self.every = length, chunk, every
        self.status: int | None = None
        self.sent = 0

    async def run(self, stop: asyncio.Event) -> None:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(
                f"POST /slow/job/t/add HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {self.token}"
                f"\r\nContent-Type: text/plain\r\nContent-Length: {self.length}\r\n\r\n".encode()
            )
            reply = asyncio.create_task(reader.readline())
            while not stop.is_set() and self.sent < self.length and not reply.done():
                part = min(self.chunk, self.length - self.sent)
                writer.write(b"x" * part)
                self.sent += part
                await writer.drain()
                await asyncio.wait([reply], timeout=self.every)
            line = await asyncio.wait_for(reply, 10) if not stop.is_set() else b""
            if line:
                self.status = int(line.split()[1])
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()


async def test_slow_bodies_past_the_tenants_share_are_refused_before_they_are_read(
    deployment: Deployment,
) -> None:
    pid = deployment.daemon.pid
    before = rss_mib(pid)
    stop = asyncio.Event()
    uploads = [
        Upload(deployment.url, deployment.tokens["slow"], BODY, 256 << 10, 0.2) for _ in range(24)
    ]
    tasks = [asyncio.create_task(u.run(stop)) for u in uploads]
    try:

        async def answered() -> bool | None:
            return True if sum(u.status == 429 for u in uploads) >= 22 else None

        await until(answered, 10, "22 of 24 slow bodies refused", interval=0.1)
        refused = [u for u in uploads if u.status == 429]
        assert len(refused) >= 22, [u.status for u in uploads]  # 16 MiB: two bodies
        assert all(u.sent < BODY for u in refused)  # answered before they were sent
        grown = rss_mib(pid) - before
        assert grown < 48, f"the daemon grew by {grown:.0f} MiB"
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_big_body_with_a_wrong_token_is_refused_before_it_is_read(
    deployment: Deployment,
) -> None:
    upload = Upload(deployment.url, "qd_wrong", BODY, 64 << 10, 0.5)
    stop = asyncio.Event()
    task = asyncio.create_task(upload.run(stop))
    try:
        await asyncio.wait_for(asyncio.shield(task), 10)
    finally:
        stop.set()
        await task
    assert upload.status == 401
    assert upload.sent < BODY


async def test_a_body_that_trickles_steadily_still_ends_at_the_body_timeout(
    deployment: Deployment,
) -> None:
    """32 KiB/s is above the least rate that keeps a body alive chunk by chunk,
    but 8 MiB at that rate would take four minutes: the whole body gets 3 s."""
    upload = Upload(deployment.url, deployment.tokens["slow"], BODY, 8 << 10, 0.25)
    stop = asyncio.Event()
    began = time.monotonic()
    task = asyncio.create_task(upload.run(stop))
    try:
        await asyncio.wait_for(asyncio.shield(task), 20)
    finally:
        stop.set()
        await task
    assert upload.status == 408
    assert time.monotonic() - began < 10
