"""The ``pull`` section: jobs of a pulled type, run by the tenant's own worker
processes over HTTP (docs/workers.md): throughput end to end, and how soon a
held claim on one daemon sees a job added on another."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import aiohttp

from bench import daemon
from bench.e2e import Latency
from bench.report import Row
from bench.runs import daemons
from bench.wakeup import measure_wakeup

if TYPE_CHECKING:
    from bench.cli import Run

WAKE_TARGET_MS = 20.0  # p50, add on one daemon → held claim on another answered
PULL_TARGET = 10_000.0  # no-op pulled jobs/s end to end, 4 worker processes


def section_pull(run: Run) -> None:
    jobs = 20_000 if run.opts.quick else run.opts.run_jobs
    with daemons(run, "pull", 1) as (_, urls, token):
        rate = asyncio.run(measure_pulled(urls[0], token, daemon.TENANT, jobs=jobs, workers=4))
    run.rows.append(
        Row(
            "(pull) no-op pulled jobs, 4 worker processes",
            rate,
            "jobs/s",
            "target >= 10,000",
            rate / PULL_TARGET,
            f"{jobs:,} jobs in 1000-line POSTs, first POST → all done; the client library's"
            " Worker (claims of 1,000, batched completes); daemon-run jobs: the run1 rows",
        )
    )
    samples = run.opts.latency_samples
    with daemons(run, "pull_wake", 2) as (_, urls, token):
        woke = asyncio.run(measure_wakeup(urls[0], urls[1], token, daemon.TENANT, samples=samples))
    p50, p99 = Latency.pct(woke, 0.5), Latency.pct(woke, 0.99)
    notes = f"{samples} jobs one at a time, claim held on one daemon, add on another"
    run.rows.append(
        Row(
            "(pull) held claim wake-up, p50",
            p50,
            "ms",
            "target <= 20 ms",
            p50 / WAKE_TARGET_MS,
            notes,
        )
    )
    run.rows.append(
        Row(
            "(pull) held claim wake-up, p99",
            p99,
            "ms",
            "",
            None,
            f"min {min(woke):.1f} ms, max {max(woke):.1f} ms",
        )
    )


# a worker process of the bench: the client library's Worker, a no-op async function
WORKER = """
import asyncio, sys
from queue_daemon.client import Client, Worker

async def noop(job):
    return None

async def main(url, token, client, jobtype, name):
    async with Client(url, client, token) as q:
        await Worker(q, jobtype, noop, name=name, concurrency=2000, batch=1000, wait=10).run()

asyncio.run(main(*sys.argv[1:6]))
"""
PULL_TYPE = "bench_pulled"


def _spawn(url: str, token: str, client: str, count: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, token, client, PULL_TYPE, f"bench-{n}"]
        )
        for n in range(count)
    ]


async def _stats_done(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(f"{url}/stats") as reply:
        body = await reply.json()
    return int(body["types"].get(PULL_TYPE, {}).get("done_ok", 0))


async def measure_pulled(url: str, token: str, client: str, *, jobs: int, workers: int) -> float:
    """Jobs/s from the first add to the last job done, ``workers`` processes pulling."""
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{url}/{client}"
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(
            f"{base}/handler/add/{PULL_TYPE}", json={"lang": "worker", "timeout": 60}
        ) as reply:
            reply.raise_for_status()
        procs = _spawn(url, token, client, workers)
        try:
            await asyncio.sleep(2.0)  # the workers start and hold their claims
            body = "\n".join("x" for _ in range(1000)).encode()
            began = time.perf_counter()
            adds = asyncio.Semaphore(8)

            async def add() -> None:
                async with adds, session.post(f"{base}/job/{PULL_TYPE}/add", data=body) as reply:
                    reply.raise_for_status()

            await asyncio.gather(*(add() for _ in range(jobs // 1000)))
            while True:
                if await _stats_done(session, base) >= jobs:
                    return jobs / (time.perf_counter() - began)
                await asyncio.sleep(0.02)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
