"""Cost of concurrency keys (docs/api.md, "Concurrency keys").

In one fresh database, 100,000 waiting jobs of each shape below, then claim +
archive in batches of 100 (``store.claim`` then ``store.release(ARCHIVE)``),
one connection, as ``bench.claim`` does; µs per job, and the ratio to jobs of
a type without ``keyConcurrency``:

- ``plain``: no keys, no cap (every type that does not use keys);
- ``keyed``: 1,000 keys of 100 jobs each, ``keyConcurrency`` 5;
- ``per job``: every job its own key, ``keyConcurrency`` 1;
- ``hot key``: one key of 100,000 jobs at its cap (one of its jobs held by
  another daemon, ``keyConcurrency`` 1), beside 1,000 keys of 100 jobs each.

    python -m bench.keys [--store DSN]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import asyncpg

from bench.pg import Databases, on_store
from bench.procs import BenchError
from bench.report import Row
from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.store.pg import PgStore

if TYPE_CHECKING:
    from bench.cli import Run

WAITING = 100_000
BATCH = 100
JOBS = 3_000  # claimed and archived per shape, after a warm-up
WARMUP_BATCHES = 5
SYSID = "bench-keys"

# $1 prefix of ids, $2 stored type, $3 jobs, $4 the key of job i (SQL over i), in
# the order of their dt (one microsecond apart)
_FILL = """
INSERT INTO jobs (id, type, dt, data, create_dt, ckey)
SELECT '{prefix}' || lpad(i::text, 9, '0'), $1,
       now() - interval '1 hour' + i * interval '1 microsecond', '{{}}',
       now() - interval '1 hour', {key}
FROM generate_series(1, $2::int) AS i
"""
# name, stored type, cap, [(id prefix, key expression, share of the waiting jobs)]
Shape = tuple[str, str, int | None, list[tuple[str, str, float]]]
SHAPES: tuple[Shape, ...] = (
    ("plain", "bench-plain", None, [("p", "NULL", 1.0)]),
    ("keyed", "bench-keyed", 5, [("k", "'key-' || (i % 1000)", 1.0)]),
    ("per job", "bench-each", 1, [("e", "'job-' || i", 1.0)]),
    ("hot key", "bench-hot", 1, [("h", "'hot'", 1.0), ("c", "'key-' || (i % 1000)", 1.0)]),
)


async def _claim_archive(store: PgStore, type_: str) -> int:
    claimed = await store.claim(type_, BATCH, sysid=SYSID, lease=60)
    releases = [Release(id=j.id, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for j in claimed]
    if len(await store.release(releases, sysid=SYSID)) != len(claimed):
        raise BenchError("an archive did not apply to every claimed job")
    return len(claimed)


async def _shape(
    store: PgStore, conn: asyncpg.Connection, shape: Shape, waiting: int, jobs: int
) -> float:
    """µs per job claimed and archived of one shape."""
    name, type_, cap, parts = shape
    for prefix, key, share in parts:
        n = int(waiting * share)
        await conn.execute(_FILL.format(prefix=prefix, key=key), type_, n, timeout=3600)
    handler: dict[str, object] = {"lang": "python", "body": "x"}
    if cap is not None:
        handler["keyConcurrency"] = cap
    await store.put_handler(type_, handler)
    await conn.execute("VACUUM ANALYZE jobs")
    # one of the hot key's jobs runs elsewhere: the key is at its cap
    if name == "hot key" and [
        j.key for j in await store.claim(type_, 1, sysid="elsewhere", lease=3600)
    ] != ["hot"]:
        raise BenchError("the hot key's first job was not the first claimed")
    for _ in range(WARMUP_BATCHES):
        await _claim_archive(store, type_)
    batches = jobs // BATCH
    done = 0
    start = time.perf_counter()
    for _ in range(batches):
        done += await _claim_archive(store, type_)
    elapsed = time.perf_counter() - start
    if done != batches * BATCH:
        raise BenchError(f"{name}: claimed {done} jobs, expected {batches * BATCH}")
    return elapsed / done * 1e6


async def key_cost(
    dsn: str, *, waiting: int = WAITING, jobs: int = JOBS
) -> list[tuple[str, float]]:
    """(shape, µs per job) for each shape, in a fresh database on the server of
    ``dsn`` (dropped afterwards)."""
    databases = Databases(dsn)
    try:
        db = await databases.fresh("keys")
        if db == databases.admin_dsn:
            raise BenchError("the keys bench needs a role that may create databases")
        store = await PgStore.connect(db, min_size=1, max_size=2)
        conn = await asyncpg.connect(db)
        try:
            results = []
            for shape in SHAPES:
                us = await _shape(store, conn, shape, waiting, jobs)
                print(f"  {shape[0]}: {us:.1f} µs a job", flush=True)
                results.append((shape[0], us))
            return results
        finally:
            await conn.close()
            await store.close()
    finally:
        await databases.drop_all()


def report(results: Sequence[tuple[str, float]]) -> str:
    plain = results[0][1]
    lines = [f"claim + archive with concurrency keys, batches of {BATCH}, one connection:"]
    lines += [f"  {name:<8} {us:7.1f} µs a job  {us / plain:5.2f}x plain" for name, us in results]
    return "\n".join(lines)


def section_keys(run: Run) -> None:
    """``python -m bench --only keys``: a row a shape, its ratio to ``plain``."""
    quick = run.opts.quick  # a smoke run: 10,000 waiting, 1,000 claimed
    results = asyncio.run(
        key_cost(
            run.admin_dsn(), waiting=10_000 if quick else WAITING, jobs=1_000 if quick else JOBS
        )
    )
    plain = results[0][1]
    for name, us in results:
        run.rows.append(
            Row(
                f"(keys) claim+archive, {name}",
                us,
                "us/job",
                "plain" if name != "plain" else "",
                us / plain if name != "plain" else None,
                NOTES[name],
            )
        )


NOTES = {
    "plain": "100,000 waiting, no keyConcurrency; batches of 100, one connection",
    "keyed": "1,000 keys of 100 jobs, keyConcurrency 5",
    "per job": "100,000 keys of one job, keyConcurrency 1",
    "hot key": "a key of 100,000 jobs at its cap beside 1,000 keys of 100, keyConcurrency 1",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keys", description=__doc__)
    parser.add_argument("--store", default=None, help="PostgreSQL DSN (default: a private server)")
    opts = parser.parse_args(argv)
    try:
        results = on_store(opts.store, "qd-bench-keys-", lambda dsn: asyncio.run(key_cost(dsn)))
    except BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
