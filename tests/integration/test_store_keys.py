"""Concurrency keys on a real PostgreSQL under concurrent claimers: daemons'
and pull workers' claims of one capped type, on separate connections at once,
releasing some of what they took and claiming again, never hold more than the
cap of one key; every job runs; more keys than a claim visits are all served."""

from __future__ import annotations

import asyncio
import random

import asyncpg

from queue_daemon.domain.jobs import NewJob, Release, ReleaseHow
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.store.pg import PgStore
from tests.contract.conftest import new

TYPE = "a-t"
CAP = 2
KEYS = 12
PER_KEY = 10
RUNNING_PER_KEY = """
SELECT ckey, count(*)::int AS n FROM jobs
WHERE type = 'a-t' AND lock <> '' AND lock <> '__done' GROUP BY ckey
"""


async def _add_keyed(store: PgStore, key: str, jobs: list[NewJob]) -> None:
    assert await store.add_opted([OptedJobs(jobs=jobs, after=[], key=key)]) == len(jobs)


async def test_concurrent_claimers_never_pass_a_keys_cap(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    await store.put_handler(TYPE, {"lang": "python", "body": "x", "keyConcurrency": CAP})
    for k in range(KEYS):
        await _add_keyed(store, f"k{k}", [new(f"j{k}-{n}", ago=60 - n) for n in range(PER_KEY)])
    most: dict[str, int] = {}
    done: set[str] = set()
    rng = random.Random(7)
    looking = asyncio.Lock()

    async def claimer(n: int) -> None:
        held: list[str] = []
        idle = 0
        while idle < 3:
            if n % 2:
                jobs = [j.id for j in await store.claim(TYPE, 7, sysid=f"s{n}", lease=60)]
                lock = f"s{n}"
            else:
                lock = f"w:{n:032x}:w{n}"
                jobs = [
                    j.id
                    for j in await store.claim_pulled(
                        TYPE, 7, lock=lock, lease=60, client="a", worker=f"w{n}"
                    )
                ]
            if jobs:
                async with looking:  # one connection for every claimer's look
                    rows = await conn.fetch(RUNNING_PER_KEY)
                for row in rows:
                    most[row["ckey"]] = max(most.get(row["ckey"], 0), row["n"])
            held += jobs
            idle = 0 if jobs or held else idle + 1
            rng.shuffle(held)
            ending, held = held[: len(held) // 2 + 1], held[len(held) // 2 + 1 :]
            if ending and n % 2:
                releases = [
                    Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for i in ending
                ]
                done.update(await store.release(releases, sysid=lock))
            elif ending:
                releases = [
                    Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for i in ending
                ]
                archived = await store.archive_pulled(
                    releases, [(i, lock) for i in ending], client="a", worker=f"w{n}"
                )
                done.update(job_id for job_id, _, _ in archived)
            await asyncio.sleep(0)

    async with asyncio.timeout(120):
        await asyncio.gather(*(claimer(n) for n in range(4)))
    assert most and max(most.values()) <= CAP, most
    assert len(done) == KEYS * PER_KEY


async def test_more_keys_than_a_claim_visits_are_all_served(store: PgStore) -> None:
    """1,500 keys at their cap ahead of the one with room: the cursor moves on
    by the keys each claim visited, so claims reach it."""
    await store.put_handler(TYPE, {"lang": "python", "body": "x", "keyConcurrency": 1})
    for k in range(1500):
        await _add_keyed(store, f"a{k:05d}", [new(f"full{k}-{n}", ago=60) for n in range(2)])
    first = await store.claim(TYPE, 2000, sysid="s1", lease=60)
    assert len(first) == 1000  # a call visits 1,000 keys at most
    await _add_keyed(store, "zz", [new("late", ago=1)])
    found: list[str] = []
    for _ in range(4):
        found += [j.id for j in await store.claim(TYPE, 2000, sysid="s1", lease=60)]
    assert "late" in found and len(found) == 501
