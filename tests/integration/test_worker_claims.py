"""The run loop's claim loops against a real store, with a stand-in runner pool.

- A claim of one tenant's jobtype that is slow (a flood's) does not hold up
  another tenant's job: a second claim loop takes it meanwhile, and never two
  claims of one jobtype run at once.
- A claim in flight while its type's handler is replaced runs what it gets
  with the new version: the claim reads the live version with the jobs.
- Jobs noted by the store's notification are claimed without reading the
  waiting types again, even when they were added while such a read was in
  flight (a read that began before them does not see them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from queue_daemon.domain.jobs import ClaimedJob, NewJob
from queue_daemon.engine.run import pick
from queue_daemon.engine.run.loop import RunLoop
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.store.pg import PgStore
from queue_daemon.wiring.engine import EngineSettings
from tests.engines import engine_of, run_engine


class GatedStore:
    """The real store; claims of ``gated`` types and reads of the waiting types
    wait for their gate when it is closed, and every call is recorded."""

    def __init__(self, store: PgStore, gated: str) -> None:
        self._store = store
        self.gated = gated
        self.claim_gate = asyncio.Event()
        self.read_gate = asyncio.Event()
        self.read_gate.set()
        self.claims_waiting = asyncio.Event()  # a gated claim is waiting for its gate
        self.reads_waiting = asyncio.Event()
        self.in_flight: dict[str, int] = {}
        self.most_in_flight: dict[str, int] = {}
        self.claimed: list[str] = []  # jobtype per claim that got jobs, in order
        self.reads = 0
        self.listening = asyncio.Event()  # the listener connected and said so

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def claim(self, type: str, limit: int, **kwargs: Any) -> list[ClaimedJob]:
        n = self.in_flight[type] = self.in_flight.get(type, 0) + 1
        self.most_in_flight[type] = max(n, self.most_in_flight.get(type, 0))
        try:
            if type == self.gated:
                self.claims_waiting.set()
                await self.claim_gate.wait()
            jobs = await self._store.claim(type, limit, **kwargs)
        finally:
            self.in_flight[type] -= 1
        if jobs:
            self.claimed.append(type)
        return jobs

    async def listen(
        self, on_jobs: Callable[[dict[str, int] | None], None], *args: Any, **kw: Any
    ) -> None:
        def heard(added: dict[str, int] | None) -> None:
            on_jobs(added)
            if added is None:  # (re)connected: anything may have changed
                self.listening.set()

        await self._store.listen(heard, *args, **kw)

    async def waiting_jobtypes(self, limit_per_type: int = 1000) -> dict[str, int]:
        self.reads += 1
        self.reads_waiting.set()
        await self.read_gate.wait()
        return await self._store.waiting_jobtypes(limit_per_type)


class InstantPool:
    """Runs every job at once with exit code 200, noting how many reads of the
    waiting types the store had seen when each job ran."""

    def __init__(self, store: GatedStore) -> None:
        self._store = store
        self.ran: list[str] = []
        self.reads_when_ran: dict[str, int] = {}
        self.versions: dict[str, str] = {}  # job id -> the handler version it ran
        self.busy_remark_s = 0.0

    async def run_batch(
        self,
        spec: HandlerSpec,
        jobs: Sequence[JobInput],
        sink: ResultSink | None = None,
        *,
        start_by: float | None = None,
    ) -> list[JobResult]:
        self.ran.extend(job.id for job in jobs)
        self.versions.update((job.id, spec.version) for job in jobs)
        self.reads_when_ran.update((job.id, self._store.reads) for job in jobs)
        return [JobResult(id=job.id, exitcode=200, result="ok") for job in jobs]

    def warm(self) -> set[str]:
        return set()

    def retire(self, client: str, type: str) -> None:
        pass


def _jobs(jobtype: str, n: int, prefix: str) -> list[NewJob]:
    now = datetime.now(UTC)
    return [
        NewJob(id=f"{prefix}{i}", type=jobtype, dt=now, data="p", create_dt=now) for i in range(n)
    ]


async def _until(check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
async def running(
    store: PgStore, tmp_path: Path
) -> AsyncIterator[tuple[GatedStore, InstantPool, RunLoop]]:
    for jobtype in ("flood-busy", "calm-clock"):
        await store.put_handler(jobtype, {"lang": "python", "body": "def handler(p, ctx): pass"})
    gated = GatedStore(store, "flood-busy")
    pool = InstantPool(gated)
    engine = engine_of(
        gated,
        pool,
        intake=None,  # only follow-on jobs are written to it
        queuelog=QueueLog(tmp_path / "queue.log"),
        settings=EngineSettings(),
        sysid="1",
    )
    try:
        async with run_engine(engine, gated):
            yield gated, pool, engine.run_loop
    finally:
        gated.claim_gate.set()
        gated.read_gate.set()


async def test_another_tenants_job_overtakes_a_claim_in_flight(
    store: PgStore, running: tuple[GatedStore, InstantPool, RunLoop]
) -> None:
    gated, pool, _ = running
    await store.add_jobs(_jobs("flood-busy", 50, "f"))
    await asyncio.wait_for(gated.claims_waiting.wait(), 10)  # the flood's claim hangs
    await store.add_jobs(_jobs("calm-clock", 3, "c"))
    await _until(lambda: {"c0", "c1", "c2"} <= set(pool.ran), "the calm jobs to run")
    assert not any(job.startswith("f") for job in pool.ran)  # the flood's claim still hangs
    assert gated.most_in_flight["flood-busy"] == 1
    gated.claim_gate.set()
    await _until(lambda: len(pool.ran) == 53, "every job to run")
    assert gated.most_in_flight["flood-busy"] == 1, "two claims of one jobtype at once"


async def test_jobs_noted_during_a_read_of_the_waiting_types_are_claimed_without_another(
    store: PgStore,
    running: tuple[GatedStore, InstantPool, RunLoop],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a read held open past POLL_S is stale when it returns and is rightly made
    # again: on a slow machine the steps below can take that long
    monkeypatch.setattr(pick, "POLL_S", 600.0)
    gated, pool, loop = running
    # the listener says "anything may have changed" as it connects: that must not
    # fall inside the window below, or the read is rightly made again
    await asyncio.wait_for(gated.listening.wait(), 10)
    await _until(lambda: gated.reads >= 1, "the first read of the waiting types")
    await _until(lambda: loop._waiting._reading is None, "that read to end")
    gated.reads_waiting.clear()
    gated.read_gate.clear()
    loop.on_jobs(None)  # "anything may have changed": the next claim reads again
    await asyncio.wait_for(gated.reads_waiting.wait(), 10)  # that read hangs
    reads = gated.reads
    await store.add_jobs(_jobs("calm-clock", 2, "n"))  # after the read began
    await _until(lambda: "calm-clock" in loop._waiting.counts, "the notice of the new jobs")
    gated.read_gate.set()  # the read returns without them (it began before they were added)
    await _until(lambda: {"n0", "n1"} <= set(pool.ran), "the new jobs to run")
    assert [pool.reads_when_ran[job] for job in ("n0", "n1")] == [reads, reads], (
        "the waiting types were read again to find noted jobs"
    )


async def test_a_claim_in_flight_across_a_handler_replacement_runs_the_new_version(
    store: PgStore, running: tuple[GatedStore, InstantPool, RunLoop]
) -> None:
    gated, pool, _ = running
    old = await store.get_handler("flood-busy")
    await store.add_jobs(_jobs("flood-busy", 1, "a"))
    # the run loop has the old version in hand and its claim hangs
    await asyncio.wait_for(gated.claims_waiting.wait(), 10)
    new = await store.put_handler("flood-busy", {"lang": "python", "body": "def handler(p, c): 2"})
    assert new.id != old.id
    await store.add_jobs(_jobs("flood-busy", 3, "b"))  # after the replacement
    gated.claim_gate.set()
    await _until(lambda: len(pool.ran) == 4, "every job to run")
    assert pool.versions == dict.fromkeys(["a0", "b0", "b1", "b2"], new.id), pool.versions
