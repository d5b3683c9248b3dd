"""(depth) What else waits in the store must not cost a tenant anything.

One daemon, a no-op python handler, ``--depth-jobs`` jobs (50,000; quick
10,000) in 1000-line POSTs timed to the last one done, in three stores:

  empty   nothing else;
  deep    1,000,000 jobs (quick 100,000) waiting in another type of the same
          tenant that has no handler;
  wide    100,000 waiting types (quick 10,000) across 1,000 tenants, two
          jobs each, no handlers; the bench's tenant is one of them.

The filler rows are written straight into the jobs table before the daemon
starts (bench/storefill.py), so no ingestion runs during the timing, and their
waiting counts are folded as the daemons' upkeep folds them within seconds of
an add (PgStore.fold_counts), so the timing sees a store in its steady state,
not the fold of 100,000 types' first counts. Then,
once the store's statistics are current (ANALYZE, as autovacuum does within
a minute), the reads a tenant's and an operator's dashboard make:
``GET /{client}/stats``, ``GET /{client}/overview``, ``GET /admin/overview``,
each asked after its one-second cache ran out, median of several.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import asyncpg

from bench import daemon, storefill
from bench.e2e import measure_throughput, postmaster_pid
from bench.pg import vacuum_analyze
from bench.procs import BenchError, python
from bench.report import Row
from queue_daemon.store.pg import PgStore

if TYPE_CHECKING:
    from bench.cli import Run

READ_SAMPLES = 7
CACHE_S = 1.05  # the dashboard's reads are cached for a second per daemon


@dataclass(frozen=True, slots=True)
class Store:
    name: str
    what: str
    waiting: int = 0  # jobs in one other type of the bench tenant
    types: int = 0  # waiting types across TENANTS tenants
    tenants: int = 1_000


def _stores(quick: bool) -> list[Store]:
    deep = 100_000 if quick else 1_000_000
    wide = 10_000 if quick else 100_000
    return [
        Store("empty", "empty store"),
        Store("deep", f"{deep:,} waiting in another type", waiting=deep),
        Store("wide", f"{wide:,} waiting types, 1,000 tenants", types=wide),
    ]


async def _fill(dsn: str, store: Store) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        if store.waiting:
            await storefill.fill_one_type(conn, f"{daemon.TENANT}-backlog", store.waiting)
        if store.types:
            await storefill.fill_types(conn, daemon.TENANT, store.types, store.tenants, per_type=2)
        await conn.execute("VACUUM ANALYZE jobs", timeout=3600)
    finally:
        await conn.close()
    pg = await PgStore.connect(dsn, min_size=1, max_size=1, migrate=False)
    try:
        await pg.fold_counts()  # what the daemons' upkeep does within seconds
    finally:
        await pg.close()


def _admin_token(dsn: str, data_dir: Path) -> str:
    argv = python("-m", "queue_daemon", "admin", "token", "--store", dsn)
    argv += ["--data-dir", str(data_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not done.stdout.strip():
        raise BenchError(f"admin token failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1]


async def _read_ms(url: str, token: str, path: str, samples: int) -> float:
    """Median milliseconds of ``GET path``, each asked once the daemon's cache ran out."""
    times: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:
        for _ in range(samples):
            await asyncio.sleep(CACHE_S)
            t0 = time.perf_counter()
            async with session.get(url + path, headers=headers) as reply:
                await reply.read()
                if reply.status != 200:
                    raise BenchError(f"GET {path} answered {reply.status}")
            times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def _one(run: Run, store: Store, jobs: int) -> tuple[float, dict[str, float]]:
    dsn = run.fresh_database(f"depth_{store.name}")
    data_dir = run.work / f"depth-{store.name}"
    data_dir.mkdir()
    token = daemon.add_tenant(dsn, data_dir)
    admin = _admin_token(dsn, data_dir)
    t0 = time.monotonic()
    if store.waiting or store.types:
        asyncio.run(_fill(dsn, store))
        print(f"  {store.name}: filled in {time.monotonic() - t0:.1f} s", flush=True)
    child, url = daemon.start_daemon(
        f"depth-{store.name}", dsn, data_dir, run.work, extra=run.opts.daemon_args
    )
    try:
        result = asyncio.run(
            measure_throughput(
                [url],
                token,
                daemon.TENANT,
                lang="python",
                jobs=jobs,
                warm=300,
                conns=run.opts.run_conns,
                poll=0.05,
                limit_s=max(120.0, jobs / 200),
                daemon_pids=[child.pid],
                postmaster=postmaster_pid(run.pg.pgdata if run.pg is not None else None),
                progress=False,
            )
        )
        # as autovacuum does within a minute of the run: the plans of a store
        # that was empty when its statistics were taken do not last
        asyncio.run(vacuum_analyze(dsn))
        samples = 3 if run.opts.quick else READ_SAMPLES
        client = f"/{daemon.TENANT}"
        reads = {
            "stats": asyncio.run(_read_ms(url, token, f"{client}/stats", samples)),
            "overview": asyncio.run(_read_ms(url, token, f"{client}/overview", samples)),
            "admin": asyncio.run(_read_ms(url, admin, "/admin/overview", samples)),
        }
    finally:
        child.stop(grace=20)
    print(
        f"  {store.name}: {result.rate:,.0f} jobs/s ({result.describe()}); "
        f"/stats {reads['stats']:.1f} ms, "
        f"overview {reads['overview']:.1f} ms, admin overview {reads['admin']:.1f} ms",
        flush=True,
    )
    return result.rate, reads


def section_depth(run: Run) -> None:
    jobs = 10_000 if run.opts.quick else 50_000
    empty_rate: float | None = None
    for store in _stores(run.opts.quick):
        label = f"(depth) {store.what}"
        try:
            rate, reads = _one(run, store, jobs)
        except BenchError as exc:
            run.rows.append(Row(f"{label}: end to end", None, "jobs/s", notes=str(exc)[:300]))
            run.failed = True
            continue
        if empty_rate is None:
            empty_rate = rate
        run.rows.append(
            Row(
                f"{label}: end to end",
                rate,
                "jobs/s",
                "empty store",
                rate / empty_rate,
                f"{jobs:,} no-op python jobs, target >= 0.90",
            )
        )
        for name, path in (
            ("stats", "GET /{client}/stats"),
            ("overview", "GET /{client}/overview"),
            ("admin", "GET /admin/overview"),
        ):
            run.rows.append(
                Row(f"{label}: {path}", reads[name], "ms", "20 ms", reads[name] / 20.0, "median")
            )
