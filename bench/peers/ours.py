"""This project's side of each ``--peers`` workload, on the same PostgreSQL server.

enqueue   1-line and 1000-line POSTs through a real daemon, acknowledged after
          the journal's fsync (the load generator of the other sections), and
          the journal path without HTTP: the daemon's ``Journal`` written by
          concurrent tasks in this process, one job or 1,000 a write;
e2e       the handler is added and a few hundred jobs run (its contexts
          start), the type is paused, and jobs are added until all are in
          the store; the clock runs from the resume until ``/stats`` counts
          every job done (the peers: their workers, started and connected
          before, are told to begin); with ``backlog``, that many jobs wait
          in another type of the same tenant, written into the store before
          the daemon starts;
latency   one add of one job every 1/rate seconds through the project's client
          library (``Client.add``, as the peers add through theirs), each job's
          handler returning the time it started; add → start is that time minus
          the time just before the call (one machine, one clock).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import asyncpg

from bench import adds, daemon, storefill
from bench.api import Api
from bench.e2e import PY_CLOCK, PY_NOOP, bulk_body
from bench.pg import vacuum_analyze
from bench.procs import BenchError
from queue_daemon.client import Client
from queue_daemon.engine.admit.ids import IdGenerator
from queue_daemon.journal import Journal

if TYPE_CHECKING:
    from bench.cli import Run

NOOP_TYPE = "noop"
CLOCK_TYPE = "clock"
POST_LINES = 1000


@dataclass(frozen=True, slots=True)
class Figure:
    value: float
    notes: str = ""


def enqueue_http(run: Run, lines: int, conns: int) -> Figure:
    body = adds.ONE_LINE if lines == 1 else bulk_body(lines)
    with adds.adds_daemon(run, f"peers_add{lines}") as (child, url, token):
        headers = {"Authorization": f"Bearer {token}"}
        load = run.load(adds.add_url(url), body, headers, conns)
        ((result, notes),) = adds.measure_loads(run, [(f"add{lines}", child, load)])
    if result.failures:
        raise BenchError(f"{lines}-line POSTs: {result.describe()}")
    return Figure(result.jobs_per_s, notes)


async def _journal_rate(run: Run, lines: int, writers: int) -> Figure:
    directory = run.work / f"peers-journal-{lines}"
    journal = await Journal.open(directory)
    ids = IdGenerator("bench")
    payloads = ['{"bench": 1, "pad": "0123456789abcdef"}'] * lines
    start = time.monotonic() + run.opts.warmup
    end = start + run.opts.duration
    counted = 0

    async def writer() -> None:
        nonlocal counted
        while (began := time.monotonic()) < end:
            now = time.time_ns() // 1_000_000
            await journal.write(NOOP_TYPE, ids.next_ids(lines), payloads, create_ms=now, dt_ms=now)
            if began >= start and time.monotonic() <= end:
                counted += lines

    try:
        await asyncio.gather(*(writer() for _ in range(writers)))
    finally:
        await journal.close()
    return Figure(counted / run.opts.duration, f"{writers} concurrent writes of {lines:,}")


def enqueue_journal(run: Run, lines: int, writers: int) -> Figure:
    return asyncio.run(_journal_rate(run, lines, writers))


async def _wait_counts(
    api: Api, type_: str, key: str, target: int, limit_s: float, poll: float
) -> float:
    """Seconds until the type's ``key`` count reaches ``target``."""
    t0 = time.monotonic()
    while True:
        counts = await api.stats(type_)
        if counts["done_failed"] or counts["done_error"]:
            raise BenchError(f"jobs of {type_} failed: {counts}")
        if counts[key] >= target:
            return time.monotonic() - t0
        if time.monotonic() - t0 > limit_s:
            raise BenchError(f"{type_}: {key} {counts[key]:,} of {target:,} after {limit_s:.0f} s")
        await asyncio.sleep(poll)


_RUNS = itertools.count()  # a bench run measures a workload more than once: names of its own
HELD_S = 30.0  # a GET of the last job of an end to end is held this long at most
WARM_POSTS, WARM_LINES = 4, 100  # jobs run before an end to end, in small posts (contexts start)


async def _e2e(url: str, token: str, dsn: str, jobs: int, limit_s: float) -> Figure:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        api = Api(session, url, token, daemon.TENANT)
        body = bulk_body(POST_LINES)
        sem = asyncio.Semaphore(4)

        async def post() -> str:
            async with sem:
                return (await api.post(NOOP_TYPE, body))[-1]

        # the contexts start, as the peers' workers do before their clock
        await api.add_handler(NOOP_TYPE, "python", PY_NOOP)
        warm = bulk_body(WARM_LINES)
        await asyncio.gather(*(api.post(NOOP_TYPE, warm) for _ in range(WARM_POSTS)))
        await _wait_counts(api, NOOP_TYPE, "done_ok", WARM_POSTS * WARM_LINES, limit_s, 0.05)
        await api.pause(NOOP_TYPE)
        last = max(await asyncio.gather(*(post() for _ in range(jobs // POST_LINES))))
        await _wait_counts(api, NOOP_TYPE, "waiting", jobs, limit_s, 0.1)
        await vacuum_analyze(dsn)  # as for the peers: the statistics know the backlog
        t0 = time.monotonic()
        await api.pause(NOOP_TYPE, paused=False)
        # the last job added is among the last to run: a GET held until it is
        # done (one request, answered when its release is stored; a poll every
        # 10 ms cost the daemon's loop about a tenth of its time in the drain)
        while (job := await api.job(last, wait=HELD_S)) is None or job["state"] != "done":
            if time.monotonic() - t0 > limit_s:
                raise BenchError(f"the last job added is not done after {limit_s:.0f} s: {job}")
            await asyncio.sleep(0.01)  # answered early (not stored yet, or a daemon stopping)
        await _wait_counts(api, NOOP_TYPE, "done_ok", WARM_POSTS * WARM_LINES + jobs, limit_s, 0.01)
        seconds = time.monotonic() - t0
    return Figure(jobs / seconds, f"{jobs:,} jobs done in {seconds:.2f} s")


async def _fill_backlog(dsn: str, backlog: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await storefill.fill_one_type(conn, f"{daemon.TENANT}-backlog", backlog)
    finally:
        await conn.close()


def e2e(run: Run, jobs: int, *, backlog: int = 0, limit_s: float = 600.0) -> Figure:
    name = f"peers_e2e_{backlog}_{next(_RUNS)}"
    dsn = run.fresh_database(name)
    data_dir = run.work / name
    data_dir.mkdir()
    token = daemon.add_tenant(dsn, data_dir)
    if backlog:
        asyncio.run(_fill_backlog(dsn, backlog))
    child, url = daemon.start_daemon(name, dsn, data_dir, run.work, extra=run.opts.daemon_args)
    try:
        return asyncio.run(_e2e(url, token, dsn, jobs, limit_s))
    finally:
        child.stop(grace=20)


async def _latency(
    url: str, token: str, rate: float, seconds: float, warm_s: float
) -> tuple[float, float]:
    async with aiohttp.ClientSession() as session, Client(url, daemon.TENANT, token) as client:
        api = Api(session, url, token, daemon.TENANT)
        await api.add_handler(CLOCK_TYPE, "python", PY_CLOCK)
        sent: dict[str, float] = {}
        total = round(rate * (warm_s + seconds))
        warm = round(rate * warm_s)

        async def one(i: int) -> None:
            t = time.time()
            (job_id,) = await client.add(CLOCK_TYPE, '{"latency": 1}')
            if i >= warm:
                sent[job_id] = t

        start = time.monotonic()
        tasks = []
        for i in range(total):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        await _wait_counts(api, CLOCK_TYPE, "done_ok", total, 60.0, 0.1)
        sem = asyncio.Semaphore(16)

        async def started(job_id: str) -> float:
            async with sem:
                job = await api.job(job_id)
            if job is None or job.get("code") != "ok":
                raise BenchError(f"latency job {job_id}: {job}")
            return 1000 * (float(job["result"]) - sent[job_id])

        values = await asyncio.gather(*(started(i) for i in sent))
    return percentiles(values)


def percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99) of ``values``."""
    if not values:
        raise BenchError("no latency samples")
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered), p99


def latency(run: Run, rate: float, seconds: float, warm_s: float) -> tuple[float, float]:
    """(p50, p99) milliseconds add → start at a steady ``rate`` jobs/s."""
    name = f"peers_latency_{next(_RUNS)}"
    dsn = run.fresh_database(name)
    data_dir = run.work / name
    data_dir.mkdir()
    token = daemon.add_tenant(dsn, data_dir)
    child, url = daemon.start_daemon(name, dsn, data_dir, run.work, extra=run.opts.daemon_args)
    try:
        return asyncio.run(_latency(url, token, rate, seconds, warm_s))
    finally:
        child.stop(grace=20)
