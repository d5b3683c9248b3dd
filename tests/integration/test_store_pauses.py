"""Pausing on PostgreSQL itself: what the notifications say, the plan of the
waiting types, and the per-tenant cap under concurrent pauses."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest

from queue_daemon.domain.jobs import Dispatch, NewJob
from queue_daemon.store import queries
from queue_daemon.store.errors import LimitReached
from queue_daemon.store.pg import PgStore


def new(job_id: str, type: str = "a-t") -> NewJob:
    now = datetime.now(UTC)
    return NewJob(job_id, type, now, "p", now)


class Notes:
    """The payloads of qd_jobs, heard on a connection of its own."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.heard = asyncio.Event()

    def __call__(self, conn: object, pid: int, channel: str, payload: object) -> None:
        self.payloads.append(str(payload))
        self.heard.set()

    async def next(self) -> str:
        await asyncio.wait_for(self.heard.wait(), 10)
        self.heard.clear()
        return self.payloads.pop(0)


async def test_a_paused_types_adds_wake_no_one_and_its_resume_names_it(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    notes = Notes()
    await conn.add_listener("qd_jobs", notes)
    await store.put_handler("a-t", {"lang": "python", "body": "x"})
    sysid = await store.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    await store.pause_type("a", "a-t", paused=True, most=10)
    dispatch = Dispatch(ids=frozenset({"p1", "p2"}), sysid=sysid, lease=60.0)
    assert await store.add_dispatched([new("p1"), new("p2")], dispatch) == (2, [])
    # a marker after it: had the add notified, its payload would come first
    await conn.execute("SELECT pg_notify('qd_jobs', 'marker')")
    assert await notes.next() == "marker"
    await store.pause_type("a", "a-t", paused=False, most=10)
    assert await notes.next() == "a-t=2"
    await store.pause_type("a", "a-t", paused=False, most=10)  # not paused: no notification
    await store.add_tenant("a", b"ta")
    await store.pause_tenant("a", paused=True)
    await store.pause_tenant("a", paused=False)
    assert await notes.next() == ""  # a tenant's types: read them all again
    assert notes.payloads == []


async def test_concurrent_pauses_keep_to_the_cap(store: PgStore) -> None:
    async def pause(n: int) -> bool:
        try:
            await store.pause_type("a", f"a-t{n}", paused=True, most=3)
        except LimitReached:
            return False
        return True

    done = await asyncio.gather(*(pause(n) for n in range(12)))
    assert sum(done) == 3
    assert len((await store.paused("a")).types) == 3


@pytest.mark.timeout(120)
async def test_the_waiting_types_read_no_job_of_a_paused_type(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    await store.put_handler("a-t", {"lang": "python", "body": "x"})
    await store.add_jobs([new(f"j{n}") for n in range(2000)])
    await conn.execute("ANALYZE jobs")
    await store.pause_type("a", "a-t", paused=True, most=10)
    plan = "\n".join(
        r[0]
        for r in await conn.fetch(
            "EXPLAIN (ANALYZE, COSTS OFF) " + queries.queue.WAITING_JOBTYPES, 1000
        )
    )
    scan = next(line for line in plan.splitlines() if "jobs_waiting_idx" in line)
    assert "never executed" in scan, plan
