"""Dispatch: a few fresh jobs that an idle daemon runs at once are stored claimed
by it, at ingest (``Ingester``) or while the journal writes them
(``engine.ingest.early``), against the in-memory store and a pool that runs
jobs at once. (The same paths run against a real PostgreSQL in
tests/integration and tests/acceptance.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from queue_daemon.domain.jobs import NewJob
from queue_daemon.domain.names import JobType
from queue_daemon.engine.admit.ids import IdGenerator
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.ingest.early import EarlyAdd
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.engine.run.loop import RunLoop
from queue_daemon.journal import Journal, JournalUnavailable
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.store.errors import StoreUnavailable
from tests.fakes.store import DONE, FakeStore
from tests.unit.test_engine_decisions import Running, running_engine, until

__all__ = ["running_engine"]  # the ``running`` fixture

# --- dispatch at ingest ---------------------------------------------------------------------


def fresh(jobtype: str, *ids: str) -> list[NewJob]:
    now = datetime.now(UTC)
    return [NewJob(i, jobtype, now, f"p{i}", now) for i in ids]


async def _cache_the_handler(store: FakeStore, loop: RunLoop, jobtype: str) -> None:
    """One job through a claim: the daemon has its type's handler in its cache."""
    store.set_handler(jobtype, "...")
    store.add(jobtype, "warm-up", prefix="w")
    loop.on_jobs({jobtype: 1})
    await until(lambda: len(store.done()) == 1, "the first job archived")


async def test_an_idle_daemon_stores_a_few_fresh_jobs_claimed_and_runs_them(
    running: Running, tmp_path: Path
) -> None:
    store, pool, _, loop = running
    await _cache_the_handler(store, loop, "acme-t")
    claims = store.calls["claim"]
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    async with await Journal.open(tmp_path / "journal") as journal:
        await journal.write("acme-t", ["0a-1", "0b-1"], ["x", "y"], create_ms=now_ms, dt_ms=now_ms)
        ingester = Ingester(journal, store, ingest_batch=100, ingest_workers=1)
        ingester.dispatcher = loop
        task = asyncio.create_task(ingester.run())
        try:
            await until(lambda: len(store.done()) == 3, "the added jobs archived")
        finally:
            ingester.stop()
            await asyncio.wait_for(task, 10)
    assert store.calls["add_dispatched"] == 1 and store.calls.get("add_jobs", 0) == 0
    assert store.calls["claim"] == claims  # no claim: they were stored claimed
    assert {"0a-1", "0b-1"} <= set(pool.ran)
    assert {r.id: r.result for r in store.done()}["0b-1"] == "Y"


async def test_a_dispatched_job_a_store_crash_took_is_stored_claimed_again_while_it_runs(
    running: Running, tmp_path: Path
) -> None:
    """A dispatched job's row is not flushed when it starts: a crash of the
    store that takes it, with the server back before the ingester's flush, makes
    the ingester insert it again, claimed by this daemon, which still runs it
    (waiting, another daemon would run it too); it ends once."""
    store, pool, _, loop = running
    await _cache_the_handler(store, loop, "acme-t")
    flush = store.flush
    lock_after: list[str] = []

    async def restart_before_the_first_flush() -> str:
        if not lock_after:
            assert "0c-1" in loop.running_ids()
            store.restart()
            assert "0c-1" not in store.rows  # taken by the crash
            lock_after.append("")
        return await flush()

    store.flush = restart_before_the_first_flush  # type: ignore[method-assign]
    pool.gate.clear()
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    async with await Journal.open(tmp_path / "journal") as journal:
        await journal.write("acme-t", ["0c-1"], ["x"], create_ms=now_ms, dt_ms=now_ms)
        ingester = Ingester(journal, store, ingest_batch=100, ingest_workers=1)
        ingester.dispatcher = loop
        task = asyncio.create_task(ingester.run())
        try:
            assert await ingester.drain(10.0)
            await until(lambda: journal.lag.unread_lines == 0 and "0c-1" in store.rows, "again")
            row = store.rows["0c-1"]
            assert row.lock not in ("", DONE) and row.attempts == 1  # claimed by this daemon
            assert await store.claim("acme-t", 10, sysid="other", lease=60.0) == []
            pool.gate.set()
            await until(lambda: store.rows["0c-1"].lock == DONE, "the job archived")
        finally:
            pool.gate.set()
            ingester.stop()
            await asyncio.wait_for(task, 10)
    assert store.calls["add_dispatched"] == 2 and pool.ran.count("0c-1") == 1
    assert store.rows["0c-1"].code == "ok"


async def test_dispatch_takes_only_what_an_idle_daemon_may_run_and_gives_back_the_rest(
    running: Running,
) -> None:
    store, pool, _, loop = running
    await _cache_the_handler(store, loop, "acme-t")
    store.set_handler("acme-pulled", "...", lang="worker")
    assert loop.take(fresh("acme-pulled", "0p-1")) is None  # a pull worker's type
    assert loop.take(fresh("acme-unknown", "0u-1")) is None  # no handler in the cache
    later = fresh("acme-t", "0l-1")[0]._replace(dt=datetime.now(UTC) + timedelta(hours=1))
    assert loop.take([later]) is None  # not due yet
    dispatch = loop.take(fresh("acme-t", *(f"0{n}-1" for n in range(5))))
    assert dispatch is not None and len(dispatch.ids) == 3  # the free slots (concurrency 3)
    assert loop.take(fresh("acme-t", "0x-1")) is None  # held: no slot is free
    loop.dispatched(dispatch, [])  # the insert failed: the slots come back
    again = loop.take(fresh("acme-t", "0y-1"))
    assert again is not None and again.ids == {"0y-1"}
    loop.dispatched(again, [])
    pool.gate.clear()
    store.add("acme-t", "waits", prefix="q")
    loop.on_jobs({"acme-t": 1})  # another job waits to be claimed: its turn comes first
    assert loop.take(fresh("acme-t", "0z-1")) is None
    pool.gate.set()


# --- dispatch at add (engine.ingest.early) ----------------------------------------------


@dataclass
class EarlyRig:
    intake: Intake
    journal: Journal
    made: list[bool]  # for each add the intake offered: whether it was stored early


@pytest.fixture(name="early")
async def early_rig(running: Running, tmp_path: Path) -> AsyncIterator[EarlyRig]:
    """An intake whose adds of a few jobs the running daemon stores early, and the
    ingester that reads its journal."""
    store, _, _, loop = running
    await _cache_the_handler(store, loop, "acme-t")
    async with await Journal.open(tmp_path / "journal") as journal:
        ingester = Ingester(journal, store, ingest_batch=100, ingest_workers=1)
        ingester.dispatcher = loop
        made: list[bool] = []

        def early(*args: Any, **kwargs: Any) -> EarlyAdd | None:  # start_early, counted
            add = ingester.start_early(*args, **kwargs)
            made.append(add is not None)
            return add

        intake = Intake(
            journal=journal,
            ids=IdGenerator("1"),
            queuelog=QueueLog(tmp_path / "early.log"),
            metrics=Metrics(),
            early=early,
        )
        task = asyncio.create_task(ingester.run())
        try:
            yield EarlyRig(intake, journal, made)
        finally:
            ingester.stop()
            await asyncio.wait_for(task, 10)


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


ACME_T = JobType("acme", "t")


async def test_an_add_to_an_idle_daemon_is_stored_while_the_journal_writes_it(
    running: Running, early: EarlyRig
) -> None:
    store, pool, _, _ = running
    intake, journal = early.intake, early.journal
    claims = store.calls["claim"]
    (job_id,) = await intake.add(ACME_T, ["x"], create_ms=now_ms(), dt_ms=now_ms())
    await until(lambda: store.rows[job_id].lock == DONE, "the job archived")
    await until(lambda: journal.lag.unread_lines == 0, "the batch rsync'ed")
    assert store.calls["add_dispatched"] == 1 and store.calls.get("add_jobs", 0) == 0
    assert store.calls["claim"] == claims and pool.ran.count(job_id) == 1
    assert store.rows[job_id].result == "X" and early.made == [True]


async def test_an_early_add_to_a_paused_type_is_stored_waiting_once(
    running: Running, early: EarlyRig
) -> None:
    """Stored, none claimed (the type is paused): the rows are the batch's, and
    the ingester does not insert them again; resumed, each runs once."""
    store, pool, _, loop = running
    await store.pause_type("acme", ACME_T.stored, paused=True, most=10)
    ids = await early.intake.add(ACME_T, ["x", "y"], create_ms=now_ms(), dt_ms=now_ms())
    await until(lambda: early.journal.lag.unread_lines == 0, "the batch rsync'ed")
    assert early.made == [True] and store.calls["add_dispatched"] == 1
    assert store.calls.get("add_jobs", 0) == 0  # not inserted again
    assert [(store.rows[i].lock, store.rows[i].attempts) for i in ids] == [("", 0)] * 2
    assert loop.running == 0
    await store.pause_type("acme", ACME_T.stored, paused=False, most=10)
    loop.on_jobs({ACME_T.stored: 2})
    await until(lambda: all(store.rows[i].lock == DONE for i in ids), "the jobs done")
    assert all(pool.ran.count(i) == 1 for i in ids)


async def test_an_add_the_journal_refuses_runs_none_of_its_early_stored_jobs(
    running: Running, early: EarlyRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, pool, _, loop = running
    intake, journal = early.intake, early.journal

    async def fails(*args: object, **kwargs: object) -> None:
        await asyncio.sleep(0.01)  # the early insert is in by then
        raise JournalUnavailable("the disk is full")

    monkeypatch.setattr(journal, "write", fails)
    with pytest.raises(JournalUnavailable):
        await intake.add(ACME_T, ["x", "y"], create_ms=now_ms(), dt_ms=now_ms())
    assert early.made == [True] and store.calls["add_dispatched"] == 1
    assert store.calls["remove_refused"] == 1
    assert not [row for row in store.rows.values() if row.data in ("x", "y")]
    assert loop.running == 0 and len(pool.ran) == 1  # the warm-up job only
    monkeypatch.undo()
    (job_id,) = await intake.add(ACME_T, ["z"], create_ms=now_ms(), dt_ms=now_ms())
    await until(lambda: store.rows[job_id].lock == DONE, "a later add run: the slots came back")


async def test_an_early_insert_whose_answer_is_lost_leaves_the_jobs_to_the_ingester(
    running: Running, early: EarlyRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, pool, _, _ = running
    intake = early.intake
    insert = store.add_dispatched
    failed: list[bool] = []

    async def commits_then_fails(jobs: list[NewJob], *args: object, **kwargs: object) -> object:
        result = await insert(jobs, *args, **kwargs)  # type: ignore[arg-type]
        if not failed:  # committed, but the connection was lost before the answer
            failed.append(True)
            raise StoreUnavailable("connection lost")
        return result

    monkeypatch.setattr(store, "add_dispatched", commits_then_fails)
    (job_id,) = await intake.add(ACME_T, ["x"], create_ms=now_ms(), dt_ms=now_ms())
    # taken out again and stored by the ingester: it runs at once, not once the
    # lease of a claim that nothing runs has ended
    await until(lambda: job_id in store.rows and store.rows[job_id].lock == DONE, "the job done")
    assert early.made == [True] and failed and pool.ran.count(job_id) == 1
    assert store.calls["remove_refused"] == 1 and store.rows[job_id].attempts == 1


async def test_an_add_refused_before_its_write_begins_stores_nothing_early(
    running: Running, early: EarlyRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _, _, loop = running

    async def closed(*args: object, **kwargs: object) -> None:
        raise JournalUnavailable("the journal is closed")

    monkeypatch.setattr(early.journal, "write", closed)
    with pytest.raises(JournalUnavailable):
        await early.intake.add(ACME_T, ["x"], create_ms=now_ms(), dt_ms=now_ms())
    assert early.made == [True] and store.calls.get("add_dispatched", 0) == 0
    dispatch = loop.take(fresh("acme-t", "0t-1"))
    assert dispatch is not None  # the slots came back
    loop.dispatched(dispatch, [])


async def test_only_adds_that_run_at_once_whole_are_stored_early(
    running: Running, early: EarlyRig
) -> None:
    store, _, _, loop = running
    intake = early.intake
    # five jobs, three free slots: a claim shares them out, nothing is held
    ids = await intake.add(ACME_T, list("abcde"), create_ms=now_ms(), dt_ms=now_ms())
    later = now_ms() + 3_600_000
    await intake.add(ACME_T, ["late"], create_ms=now_ms(), dt_ms=later)  # not due
    # an Idempotency-Key's ids: another add may journal them too
    keyed = await intake.add(ACME_T, ["k"], create_ms=now_ms(), dt_ms=now_ms(), ids=["i-k"])
    assert early.made == [False, False, False]
    await until(lambda: all(store.rows[i].lock == DONE for i in [*ids, *keyed]), "all done")
    assert store.rows["i-k"].result == "K" and loop.running == 0


async def test_an_early_stored_job_a_store_crash_took_is_stored_claimed_again(
    running: Running, early: EarlyRig
) -> None:
    """As at ingest: the early insert is not flushed when the job starts; the
    ingester's flush finds the store restarted and stores it again, claimed."""
    store, pool, _, loop = running
    flush = store.flush
    crashed: list[str] = []

    async def restart_before_the_first_flush() -> str:
        if not crashed and loop.running_ids():
            (job_id,) = loop.running_ids()
            store.restart()
            assert job_id not in store.rows
            crashed.append(job_id)
        return await flush()

    store.flush = restart_before_the_first_flush  # type: ignore[method-assign]
    pool.gate.clear()
    try:
        (job_id,) = await early.intake.add(ACME_T, ["x"], create_ms=now_ms(), dt_ms=now_ms())
        await until(lambda: bool(crashed) and job_id in store.rows, "stored again")
        row = store.rows[job_id]
        assert row.lock not in ("", DONE) and row.attempts == 1
        assert await store.claim("acme-t", 10, sysid="other", lease=60.0) == []
    finally:
        pool.gate.set()
    await until(lambda: store.rows[job_id].lock == DONE, "the job archived")
    assert early.made == [True] and pool.ran.count(job_id) == 1


async def test_a_drain_waits_for_a_dispatch_in_flight(running: Running) -> None:
    """A dispatch that ends after the drain began starts its batch then: the
    drain waits for it, and for that batch."""
    store, _, _, loop = running
    await _cache_the_handler(store, loop, "acme-t")
    jobs = fresh("acme-t", "0d-1")
    dispatch = loop.take(jobs)
    assert dispatch is not None
    _, claimed = await store.add_dispatched(jobs, dispatch)
    drain = asyncio.create_task(loop.drain(5.0))
    await asyncio.sleep(0.05)
    assert not drain.done()  # the dispatch is in flight
    loop.dispatched(dispatch, claimed)
    await asyncio.wait_for(drain, 5.0)
    assert store.rows["0d-1"].lock == DONE  # run and released before the drain ended
