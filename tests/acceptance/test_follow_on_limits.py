"""Follow-on jobs are bounded like adds: per run (count and bytes), and by the
tenant's add rate and waiting limit.

One daemon for the module; each test has a tenant of its own, with limits set
by the operator's CLI before the daemon starts.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import Api, Handlers, until, wait_all_done, wait_done
from harness.daemons import (
    DaemonFactory,
    Deployment,
    add_tenant,
    reachable_dir,
    run_cli,
    store_args,
)

MIB = 1 << 20
# What a burst of big follow-on jobs may take at once, whatever its size: the
# journal's cache of unread batches (64 MiB), the ingester's reads (two of
# 4 MiB) and its batches not yet flushed, a 1 MiB chunk per batch being
# journaled, one reply per running context. One burst took 1,131 MiB before.
BOUND_MIB = 640
LIMITS = {
    "big": [],  # the defaults: 4 MiB and 1,000 follow-on jobs per run
    "many": ["follow_ons=5"],
    "bursty": ["rate=1000", "burst=10"],
    "ratey": ["rate=1", "burst=3"],
    "grower": ["waiting=30"],
}


@pytest.fixture(scope="module")
def deployment(module_daemons: DaemonFactory, module_dsn: str) -> Iterator[Deployment]:
    root = reachable_dir("qd-follow-")  # handlers must reach the data dir
    data_dir = root / "data"
    tokens = {}
    for client, limits in LIMITS.items():
        tokens[client] = add_tenant(client, store=module_dsn, data_dir=data_dir, cwd=root)
        if limits:
            done = run_cli(
                "tenant", "limits", *store_args(module_dsn, data_dir), client, *limits, cwd=root
            )
            assert done.returncode == 0, done.stderr
    daemon = module_daemons.start(data_dir, module_dsn, "--context-idle", "5")
    deployed = Deployment(daemon=daemon, dsn=module_dsn, data_dir=data_dir, cwd=root)
    deployed.tokens.update(tokens)
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped
        shutil.rmtree(root, ignore_errors=True)


def api(deployment: Deployment, session: aiohttp.ClientSession, client: str) -> Api:
    return deployment.api(session, client)


def memory_kib(pid: int, field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (the most it ever was) of ``pid``, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def count_of(tenant: Api, jobtype: str) -> int:
    await tenant.wait_caught_up()
    return len(await tenant.all_jobs(type=jobtype))


async def test_big_follow_on_jobs_keep_the_daemons_memory_flat(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    """25 runs asking for 60 follow-on jobs of 1 MiB each (60 MiB a run, 1.5 GB in
    all): each run adds what fits its 4 MiB, its result says what was dropped, and
    the daemon's resident memory never grows by more than a few runs' replies."""
    tenant = api(deployment, session, "big")
    size = MIB - 16  # under the payload limit; four fit in 4 MiB
    body = (
        "def handler(payload, ctx):\n"
        f"    for _ in range(60):\n        ctx.emit('kid', 'x' * {size})\n"
    )
    await Handlers(tenant).add("parent", "python", body)
    [warm] = await tenant.add("parent", ["warm up"])
    await wait_done(tenant, warm)
    pid = deployment.daemon.pid
    before = memory_kib(pid, "VmRSS")
    ids = await tenant.add("parent", [str(n) for n in range(25)])
    done = await wait_all_done(tenant, ids, within=120)
    grew_mib = (memory_kib(pid, "VmHWM") - before) / 1024
    for job in done.values():
        assert job["code"] == "ok", job
        assert "56 follow-on job(s) dropped" in job["result"], job
        assert "limit of 4194304 bytes of follow-on jobs per job" in job["result"], job
    assert await count_of(tenant, "kid") == 26 * 4
    assert grew_mib < BOUND_MIB, f"the daemon grew by {grew_mib:.0f} MiB at its peak"
    # the same again stays within the bound: nothing of a burst accumulates
    await wait_all_done(tenant, await tenant.add("parent", [str(n) for n in range(25)]), 120)
    peak_mib = (memory_kib(pid, "VmHWM") - before) / 1024
    assert peak_mib < BOUND_MIB, (
        f"after a second burst the daemon's peak is {peak_mib:.0f} MiB more"
    )


async def test_a_run_adds_at_most_its_tenants_follow_ons_limit(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    tenant = api(deployment, session, "many")
    body = "for n in $(seq 12); do echo \"J: kid|$n\"; done; echo 'S: 200 printed'"
    await Handlers(tenant).add("parent", "shell", body)
    [job_id] = await tenant.add("parent", ["go"])
    job = await wait_done(tenant, job_id)
    assert job["result"] == (
        "printed\n[7 follow-on job(s) dropped: 7 over this tenant's limit of 5 follow-on jobs"
        " per job]"
    ), job
    assert await count_of(tenant, "kid") == 5


async def test_follow_on_jobs_beyond_the_burst_are_dropped(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    """As an add of more jobs than the burst is 413: they could never fit."""
    tenant = api(deployment, session, "bursty")
    await Handlers(tenant).add("parent", "shell", 'for n in $(seq 11); do echo "J: kid|$n"; done')
    [job_id] = await tenant.add("parent", ["go"])
    job = await wait_done(tenant, job_id)
    assert job["code"] == "ok"
    assert "11 at once is over this tenant's burst of 10" in job["result"], job
    assert await count_of(tenant, "kid") == 0


async def test_follow_on_jobs_over_the_add_rate_retry_their_run_later(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    """The add took one of three tokens: the run's three follow-on jobs wait for
    the bucket, as a client's add gets 429; the run is retried, then adds them."""
    tenant = api(deployment, session, "ratey")
    await Handlers(tenant).add("parent", "shell", 'for n in 1 2 3; do echo "J: kid|$n"; done')
    [job_id] = await tenant.add("parent", ["go"])

    async def refused() -> dict[str, object] | None:
        reply = await tenant.get_job(job_id)  # 404 until the job reaches the store
        return reply.json if reply.status == 200 and reply.json["exitcode"] == 129 else None

    job = await until(refused, 20, "the run refused for the add rate")
    assert "over this tenant's add rate; retried later" in str(job["result"]), job
    job = await wait_done(tenant, job_id, within=30)
    assert (job["code"], job["exitcode"]) == ("ok", 200), job
    assert int(str(job["attempts"])) >= 2
    assert await count_of(tenant, "kid") == 3


async def test_a_handler_that_adds_its_own_type_stops_at_the_waiting_limit(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    """Each run asks for two more of its own jobs: without the waiting limit the
    tenant's jobs double every round. With a limit of 30 they stop near it (the
    count is refreshed about once a second), and the runs that do not fit are
    retried later with a result that says why."""
    tenant = api(deployment, session, "grower")
    await Handlers(tenant).add("grow", "shell", 'echo "J: grow|a"; echo "J: grow|b"')
    await tenant.add("grow", ["seed"])

    async def refused() -> list[dict[str, object]] | None:
        jobs = await tenant.all_jobs(type="grow")
        hits = [j for j in jobs if j["exitcode"] == 129]
        return hits or None

    [hit, *_] = await until(refused, 30, "a run refused for the waiting limit")
    assert "over this tenant's limit of 30 waiting jobs; retried later" in str(hit["result"])
    most = 0
    loop = asyncio.get_running_loop()
    watch_until = loop.time() + 3  # a few more rounds of runs and retries
    while loop.time() < watch_until:
        most = max(most, len(await tenant.all_jobs(type="grow", state="waiting")))
        await asyncio.sleep(0.2)
    assert most <= 45, f"{most} waiting jobs, with a waiting limit of 30"
