"""Cost of a claim against the depth of the queue.

For each size a fresh database gets that many waiting jobs over ``types``
jobtypes plus as many archived ones (filled in SQL), is analyzed, and then
serves claim + archive of batches of 100 (``queue_daemon.store.claim`` then
``store.release(ARCHIVE)``), one connection, round-robin over the types.
docs/architecture.md asks that the cost not grow with the number of waiting or archived
jobs: the ratio of the largest size to the smallest should stay near 1.

    python -m bench.claim [--store DSN] [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence

import asyncpg

from bench import storefill
from bench.pg import Databases, on_store
from bench.procs import BenchError
from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.store.pg import PgStore

SIZES = (10_000, 100_000, 1_000_000)
TYPES = 10
BATCH = 100
JOBS = 2_000  # claimed and archived per size, after a warm-up
WARMUP_BATCHES = 5
SYSID = "bench-claim"
TARGET_RATIO = 1.5


async def _claim_archive(store: PgStore, type_: str, batch: int) -> int:
    claimed = await store.claim(type_, batch, sysid=SYSID, lease=60)
    releases = [Release(id=j.id, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for j in claimed]
    if len(await store.release(releases, sysid=SYSID)) != len(claimed):
        raise BenchError("an archive did not apply to every claimed job")
    return len(claimed)


async def _measure(dsn: str, size: int, *, types: int, batch: int, jobs: int) -> float:
    """Seconds per batch of ``batch`` claimed and archived jobs at ``size`` waiting."""
    store = await PgStore.connect(dsn, min_size=1, max_size=2)
    try:
        start = time.perf_counter()
        conn = await asyncpg.connect(dsn)
        try:
            await storefill.fill(conn, size, size, types)
        finally:
            await conn.close()
        print(f"  {size:>9,} waiting + {size:,} archived: filled in "
              f"{time.perf_counter() - start:.1f} s", flush=True)  # fmt: skip
        names = [f"bench-t{i}" for i in range(types)]
        for i in range(WARMUP_BATCHES):
            await _claim_archive(store, names[i % types], batch)
        batches = -(-jobs // batch)
        start = time.perf_counter()
        done = 0
        for i in range(batches):
            done += await _claim_archive(store, names[i % types], batch)
        elapsed = time.perf_counter() - start
        if done != batches * batch:
            raise BenchError(f"claimed {done} jobs, expected {batches * batch}")
        return elapsed / batches
    finally:
        await store.close()


async def claim_cost(
    dsn: str,
    sizes: Sequence[int] = SIZES,
    *,
    types: int = TYPES,
    batch: int = BATCH,
    jobs: int = JOBS,
) -> list[tuple[int, float, float]]:
    """(size, ms per batch of ``batch``, jobs/s) for each size, each in a fresh
    database on the server of ``dsn`` (dropped afterwards)."""
    databases = Databases(dsn)
    results: list[tuple[int, float, float]] = []
    try:
        for size in sizes:
            if size < (jobs + WARMUP_BATCHES * batch):
                raise BenchError(f"size {size} is smaller than the jobs claimed from it")
            db = await databases.fresh(f"claim_{size}")
            if db == databases.admin_dsn:
                raise BenchError("the claim bench needs a role that may create databases")
            try:
                seconds = await _measure(db, size, types=types, batch=batch, jobs=jobs)
            finally:
                await databases.drop_all()
            results.append((size, seconds * 1000, batch / seconds))
    finally:
        await databases.drop_all()
    return results


def report(results: Sequence[tuple[int, float, float]], batch: int = BATCH) -> str:
    lines = [f"claim + archive, batches of {batch}, one connection:"]
    lines += [
        f"  {size:>9,} waiting: {ms:7.2f} ms per batch  {rate:>9,.0f} jobs/s"
        for size, ms, rate in results
    ]
    if len(results) >= 2:
        ratio = results[-1][1] / results[0][1]
        verdict = "ok" if ratio <= TARGET_RATIO else "ABOVE TARGET"
        lines.append(
            f"  ratio {results[-1][0]:,} / {results[0][0]:,}: {ratio:.2f} "
            f"(target <= {TARGET_RATIO}) {verdict}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claim", description=__doc__)
    parser.add_argument("--store", default=None, help="PostgreSQL DSN (default: a private server)")
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in SIZES),
        help="waiting jobs per run, comma separated (default %(default)s)",
    )
    parser.add_argument("--jobs", type=int, default=JOBS, help="jobs claimed per size")
    opts = parser.parse_args(argv)
    sizes = [int(s) for s in opts.sizes.split(",") if s]
    try:
        results = on_store(
            opts.store,
            "qd-bench-claim-",
            lambda dsn: asyncio.run(claim_cost(dsn, sizes, jobs=opts.jobs)),
        )
    except BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
