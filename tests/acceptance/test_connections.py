"""Connections are capped in total and per client address.

A client that opens a thousand connections and sends half a request's headers
on each holds at most its address's cap of them: every new one past the cap
closes its own oldest idle one. A tenant's request from the same address
still gets through at once (it evicts one too), the daemon's descriptors stay
within the cap, and its log says so in a line, not a traceback per refusal.
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Iterator

import aiohttp
import pytest

from harness.api import Api
from harness.daemons import DaemonFactory, Deployment, deployed_where_handlers_reach

PER_ADDRESS = 200
HALF_SENT = 1000


@pytest.fixture
def deployment(daemons: DaemonFactory, pg_dsn: str) -> Iterator[Deployment]:
    args = ("--max-connections-per-address", str(PER_ADDRESS), "--max-connections", "400")
    with deployed_where_handlers_reach(daemons, pg_dsn, "qd-conns-", ["calm"], *args) as deployed:
        yield deployed


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_half_sent_requests_are_capped_and_a_tenant_is_still_served(
    deployment: Deployment,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, HALF_SENT + 512)), hard))
    host, port = deployment.url.removeprefix("http://").rsplit(":", 1)
    writers: list[asyncio.StreamWriter] = []
    try:
        for _ in range(HALF_SENT):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /calm/job/x/add HTTP/1.1\r\nHost: a\r\n")
            writers.append(writer)
        await asyncio.sleep(0)
        pid = deployment.daemon.pid
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=10)
        ) as session:
            calm = Api(session, deployment.url, "calm", deployment.tokens["calm"])
            [job_id] = await calm.add("t", ["served"])
            job = await calm.wait_job(job_id, within=10)
            assert job["payload"] == "served"
        held = open_fds(pid)
        assert held < PER_ADDRESS + 150, f"the daemon holds {held} descriptors"
    finally:
        for writer in writers:
            writer.close()
    log = deployment.daemon.stderr_text()
    assert "Traceback" not in log
    assert log.count("connection(s) refused") <= 2
