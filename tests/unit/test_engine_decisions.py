"""The engine's decisions, without PostgreSQL: the pure ones directly, and the
run loop's and the ingester's loops against the in-memory store of
``tests/fakes/store/`` and a pool that runs jobs at once. (The same paths run
against a real PostgreSQL in tests/integration and tests/acceptance.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence, Set
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from prometheus_client import generate_latest

from queue_daemon.domain.jobs import NewJob
from queue_daemon.domain.names import JobType
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.engine.run.cancels import Cancels, started
from queue_daemon.engine.run.fairness import BusyMarks, TenantBatches
from queue_daemon.engine.run.loop import RunLoop, RunSettings
from queue_daemon.engine.run.pick import NO_HANDLER_RECHECK_S, READ_CAP, WaitingTypes, claimable
from queue_daemon.engine.run.sizes import (
    BATCH_BYTES,
    BATCH_TARGET_S,
    FIRST_BATCH,
    LEARNING_BATCHES,
    BatchSizes,
    ran_seconds,
)
from queue_daemon.journal import Journal
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.store.errors import StoreUnavailable
from queue_daemon.wiring.engine import EngineSettings
from tests.engines import engine_of, run_engine
from tests.fakes.intake import RecordingIntake
from tests.fakes.store import DONE, FakeStore

SETTINGS = EngineSettings(run=RunSettings(concurrency=3, lease=30.0), job_ttl=60.0)


async def until(check: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


# --- pure decisions -------------------------------------------------------------------


def test_a_new_type_learns_with_small_batches_a_few_at_a_time() -> None:
    sizes = BatchSizes(max_batch=200)
    assert [sizes.size("a-t") for _ in range(LEARNING_BATCHES)] == [FIRST_BATCH] * 4
    assert sizes.learning_full() == {"a-t"} and not sizes.may_claim("a-t")
    sizes.done("a-t")
    assert sizes.learning_full() == set() and sizes.may_claim("a-t")


def test_batches_grow_toward_the_target_time_and_stop_at_the_cap() -> None:
    sizes = BatchSizes(max_batch=200)
    sizes.timed("a-fast", 0.001, 1)  # 1 ms a job
    assert sizes.size("a-fast") == round(BATCH_TARGET_S / 0.001)
    sizes.timed("a-tiny", 1e-5, 10)
    assert sizes.size("a-tiny") == 200
    sizes.timed("a-slow", 2.0, 1)
    assert sizes.size("a-slow") == 1
    assert sizes.learning == {}  # known types never count as learning


def test_batches_of_big_payloads_stay_under_the_batch_bytes() -> None:
    sizes = BatchSizes(max_batch=1000)
    sizes.timed("a-big", 1e-5, 2, 2 << 20)  # fast, but 1 MiB a job
    assert sizes.size("a-big") == BATCH_BYTES // (1 << 20)
    sizes.timed("a-small", 1e-5, 10, 100)
    assert sizes.size("a-small") == 1000
    sizes.timed("a-huge", 1e-5, 1, 4 * BATCH_BYTES)
    assert sizes.size("a-huge") == 1  # never none


def test_one_tenant_holds_at_most_all_but_an_eighth_of_the_contexts() -> None:
    batches = TenantBatches(max_parallel_batches=64)
    assert batches.cap == 56
    for _ in range(55):
        batches.started("flood")
    assert batches.full() == set()
    batches.started("flood")
    batches.started("calm")
    assert batches.full() == {"flood"}
    batches.ended("flood")
    assert batches.full() == set()
    assert batches.take_peak() == {"flood": 56, "calm": 1}
    assert batches.take_peak() == {"flood": 55, "calm": 1}  # the peak starts from now


def test_busy_marks_are_sent_on_change_and_again_until_the_hold_ends() -> None:
    marks = BusyMarks(cores=2, remark_s=10.0)
    assert marks.check({"calm": 1}, now=100.0) is None  # nobody busy, nothing new
    assert marks.check({"flood": 5, "calm": 1}, now=101.0) == frozenset({"flood"})
    # sent again while busy
    assert marks.check({"flood": 5, "calm": 1}, now=102.0) == frozenset({"flood"})
    assert marks.check({"calm": 1}, now=103.0) == frozenset()  # the mark goes
    assert marks.check({"calm": 1}, now=110.0) == frozenset()  # re-sent within the hold
    assert marks.check({"calm": 1}, now=112.0) is None  # the hold has ended


def test_what_a_claim_loop_may_pick() -> None:
    waiting = {"a-new": 5, "a-nohandler": 3, "b-t": 2, "c-learning": 1, "d-claiming": 9}
    now = 1000.0
    picked = claimable(
        waiting,
        no_handler={"a-nohandler": now - 1, "a-new": now - NO_HANDLER_RECHECK_S - 1},
        now=now,
        full={"b"},
        claiming={"d-claiming"},
        learning_full={"c-learning"},
    )
    assert picked == {"a-new": 5}
    nothing_to_skip = claimable(
        waiting, no_handler={}, now=now, full=set(), claiming=set(), learning_full=set()
    )
    assert nothing_to_skip is waiting  # no copy on the claim path when nothing is skipped


async def test_the_waiting_counts_are_read_again_only_when_a_count_ran_out() -> None:
    store = FakeStore()
    store.add("a-t", "1", "2", "3")
    store.add("a-u", "1")
    store.add("a-idle", "1")  # no handler: not a type daemons run
    store.set_handler("a-t", "def handler(p, ctx): pass")
    store.set_handler("a-u", "def handler(p, ctx): pass")
    waiting = WaitingTypes(store)
    assert await waiting.get() == {"a-t": 3, "a-u": 1}
    waiting.claimed("a-t", asked=2, got=2)
    assert await waiting.get() == {"a-t": 1, "a-u": 1}  # counted down, no read
    waiting.claimed("a-t", asked=5, got=1)  # fewer than asked: none of it left
    assert await waiting.get() == {"a-u": 1}  # the other types' counts stand, no read
    assert store.calls["waiting_jobtypes"] == 1
    waiting.claimed("a-u", asked=1, got=1)  # as many as counted: more may have come
    await waiting.get()
    assert store.calls["waiting_jobtypes"] == 2


async def test_a_capped_count_that_runs_out_is_not_read_again_until_a_claim_finds_fewer() -> None:
    store = FakeStore()
    store.add("a-deep", *(str(n) for n in range(READ_CAP + 500)))
    store.set_handler("a-deep", "def handler(p, ctx): pass")
    waiting = WaitingTypes(store)
    assert await waiting.get() == {"a-deep": READ_CAP}  # capped by the read
    waiting.claimed("a-deep", asked=READ_CAP, got=READ_CAP)
    assert await waiting.get() == {"a-deep": READ_CAP}  # a cap's worth more, no read
    waiting.claimed("a-deep", asked=READ_CAP, got=500)  # fewer: none of it left
    assert await waiting.get() == {}
    assert store.calls["waiting_jobtypes"] == 1
    waiting.noted({"a-deep": 2})  # counted exactly from here: no cap's worth more
    waiting.claimed("a-deep", asked=2, got=2)
    await waiting.get()
    assert store.calls["waiting_jobtypes"] == 2


# --- the run loop against the fake store ------------------------------------------------


class InstantPool:
    """Runs every job at once: exit code 200 and the payload upper-cased, unless the
    payload says ``emit`` (a follow-on job) or the ``gate`` is closed."""

    busy_remark_s = 0.0

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.most_at_once = 0
        self._now = 0

    async def run_batch(
        self,
        spec: HandlerSpec,
        jobs: Sequence[JobInput],
        sink: ResultSink | None = None,
        *,
        start_by: float | None = None,
    ) -> list[JobResult]:
        self._now += len(jobs)
        self.most_at_once = max(self.most_at_once, self._now)
        try:
            await self.gate.wait()
        finally:
            self._now -= len(jobs)
        self.ran.extend(job.id for job in jobs)
        return [
            JobResult(
                id=job.id,
                exitcode=200,
                result=job.payload.upper(),
                emits=[("next", job.payload)] if job.payload == "emit" else [],
            )
            for job in jobs
        ]

    def warm(self) -> set[str]:
        return set()

    def retire(self, client: str, type: str) -> None:
        pass

    async def mark_busy(self, clients: Set[str]) -> None:
        pass


Running = tuple[FakeStore, InstantPool, RecordingIntake, RunLoop]


@pytest.fixture(name="running")
async def running_engine(tmp_path: Path) -> AsyncIterator[Running]:
    store, pool, intake = FakeStore(), InstantPool(), RecordingIntake()
    engine = engine_of(
        store, pool, intake=intake, queuelog=QueueLog(tmp_path / "queue.log"), settings=SETTINGS
    )
    try:
        async with run_engine(engine, store):
            yield store, pool, intake, engine.run_loop
    finally:
        pool.gate.set()


async def test_jobs_run_and_are_archived_with_their_results(running: Running) -> None:
    store, pool, _, loop = running
    store.set_handler("acme-t", "...")
    ids = store.add("acme-t", "a", "b")
    loop.on_jobs({"acme-t": 2})
    await until(lambda: len(store.done()) == 2, "both jobs archived")
    assert sorted(pool.ran) == sorted(ids)
    assert {(r.code, r.exitcode, r.result) for r in store.done()} == {
        ("ok", 200, "A"),
        ("ok", 200, "B"),
    }


async def test_never_more_claimed_than_free_slots(running: Running) -> None:
    store, pool, _, loop = running
    store.set_handler("acme-t", "...")
    pool.gate.clear()  # runs hang: claimed jobs stay running
    store.add("acme-t", *"abcdefgh")
    loop.on_jobs(None)
    await until(lambda: loop.running == 3, "the free slots to fill")
    await asyncio.sleep(0.05)  # give a wrong extra claim its chance to show
    assert loop.running == 3 and pool.most_at_once == 3
    assert sum(1 for r in store.rows.values() if r.lock == "s1") == 3
    pool.gate.set()
    await until(lambda: len(store.done()) == 8, "every job to run")


async def test_a_cancelled_running_job_stops_its_batch(
    running: Running,
) -> None:
    store, pool, _, loop = running
    store.set_handler("acme-t", "...")
    pool.gate.clear()  # the batch hangs until the cancel stops it
    first, second = store.add("acme-t", "a", "b")
    loop.on_jobs({"acme-t": 2})
    await until(lambda: loop.running == 2, "both running")
    job = await store.cancel_job("acme", first)  # the store tells the holder (s1)
    assert job.code == "cancelled"
    await until(lambda: first not in loop.running_ids(), "its batch stopped")
    assert pool.ran == []  # stopped, never finished
    pool.gate.set()
    await until(lambda: store.rows[second].lock == DONE, "the other job done")
    assert pool.ran == [second]
    assert (store.rows[first].code, store.rows[second].code) == ("cancelled", "ok")
    await until(lambda: loop.running == 0, "nothing left running")


async def test_a_cancel_heard_before_its_batch_starts_leaves_the_job_out_once(
    running: Running,
) -> None:
    store, pool, _, loop = running
    store.set_handler("acme-t", "...")
    first, second = store.add("acme-t", "a", "b")
    loop.on_cancel("s1", first)  # a notice before the claim's reply
    loop.on_cancel("s2", second)  # another daemon's: not this one's business
    loop.on_jobs({"acme-t": 2})
    await until(lambda: store.rows[second].lock == DONE, "the other job done")
    # left out of the batch that claimed it and put back; the store had not
    # ended it (a notice of an earlier run, heard late): it runs after all,
    # once, the notice spent
    await until(lambda: store.rows[first].lock == DONE, "the job run after all")
    assert pool.ran.count(first) == 1 and store.rows[first].code == "ok"
    assert store.calls["claim"] >= 2


async def test_cancels_are_kept_for_a_while_and_tasks_known_as_started() -> None:
    now = [100.0]
    cancels = Cancels(keep=10.0, clock=lambda: now[0])
    cancels.hear("a")
    assert "a" in cancels and "b" not in cancels
    now[0] += 11
    cancels.hear("b")  # prunes what is older than keep
    assert "a" not in cancels and "b" in cancels
    cancels.forget(["b"])
    assert "b" not in cancels

    async def step() -> None:
        await asyncio.sleep(0)

    task = asyncio.create_task(step())
    assert not started(task)
    await asyncio.sleep(0)
    assert started(task)
    await task


async def test_a_type_without_a_handler_waits_and_its_expired_jobs_end_503(
    running: Running,
) -> None:
    store, pool, _, loop = running
    old = store.add("acme-none", "old", ago=120.0)  # past the job's time (60 s)
    young = store.add("acme-none", "young")
    loop.on_jobs(None)
    await until(lambda: len(store.done()) == 1, "the expired job archived")
    (done,) = store.done()
    assert (done.id, done.code, done.exitcode) == (old[0], "error", 503)
    assert store.rows[young[0]].lock == "" and store.rows[young[0]].attempts == 0
    assert store.calls.get("claim", 0) == 0 and pool.ran == []


async def test_jobs_waiting_for_a_handler_run_as_soon_as_it_comes(running: Running) -> None:
    store, pool, _, loop = running
    (job_id,) = store.add("acme-late", "x")
    loop.on_jobs(None)
    await until(lambda: store.calls.get("waiting_jobtypes", 0) >= 2, "the waiting types read")
    assert pool.ran == []  # no handler: not listed, not claimed
    store.set_handler("acme-late", "...")
    loop.on_handler("acme-late")
    # well before the next periodic read (POLL_S): the new handler's type is read at once
    await until(lambda: store.rows[job_id].lock == DONE, "the job to run", within=0.5)


async def test_follow_ons_go_through_the_intake(running: Running) -> None:
    store, _, intake, loop = running
    store.set_handler("acme-t", "...")
    store.add("acme-t", "emit")
    loop.on_jobs(None)
    await until(lambda: len(store.done()) == 1, "the job archived")
    assert intake.added == [(JobType("acme", "next"), ["emit"])]


async def test_follow_ons_not_durable_put_the_jobs_back_unrun(running: Running) -> None:
    store, pool, intake, loop = running
    store.set_handler("acme-t", "...")
    intake.broken = True
    (job_id,) = store.add("acme-t", "emit")
    loop.on_jobs(None)
    await until(lambda: len(pool.ran) >= 2, "the job to run again")
    row = store.rows[job_id]
    assert row.code is None and store.done() == []  # never archived without its follow-ons
    intake.broken = False
    await until(lambda: len(store.done()) == 1, "the job archived once they are durable")
    assert store.rows[job_id].attempts == 1  # the runs put back did not count


async def test_a_failed_release_is_tried_again(running: Running) -> None:
    store, _, _, loop = running
    store.set_handler("acme-t", "...")
    store.fail["release"] = 2
    store.add("acme-t", "a")
    loop.on_jobs(None)
    await until(lambda: len(store.done()) == 1, "the release to go through")
    assert store.calls["release"] == 3


async def test_a_run_ended_after_its_lease_was_lost_is_not_counted_as_finished(
    tmp_path: Path,
) -> None:
    store, pool, metrics = FakeStore(), InstantPool(), Metrics()
    queuelog = QueueLog(tmp_path / "queue.log")
    engine = engine_of(
        store, pool, intake=RecordingIntake(), queuelog=queuelog, settings=SETTINGS, metrics=metrics
    )
    loop = engine.run_loop
    store.set_handler("acme-t", "...")
    pool.gate.clear()
    kept, lost = store.add("acme-t", "a", "b")
    async with run_engine(engine, store):
        loop.on_jobs(None)
        await until(lambda: loop.running == 2, "both jobs to run")
        # meanwhile the lease of one ran out and another daemon holds it now
        store.rows[lost].lock = "s2"
        pool.gate.set()
        await until(lambda: loop.running == 0, "both runs to end")
    assert [r.id for r in store.done()] == [kept]
    assert store.rows[lost].lock == "s2" and store.rows[lost].code is None
    await queuelog.close()
    lines = [orjson.loads(line) for line in (tmp_path / "queue.log").read_bytes().splitlines()]
    finished = [(r["id"], r["code"]) for r in lines if r["ev"] == "finished"]
    refused = [(r["id"], r["code"]) for r in lines if r["ev"] == "lost-lease"]
    assert finished == [(kept, "ok")] and refused == [(lost, "ok")]
    scraped = generate_latest(metrics.registry).decode()
    assert 'queue_jobs_finished_total{code="ok",tenant="acme",type="t"} 1.0' in scraped
    assert 'queue_jobs_lost_lease_total{tenant="acme",type="t"} 1.0' in scraped


# --- the ingester against the fake store ----------------------------------------------


async def ingest_all(journal: Journal, store: FakeStore, *, batch: int) -> Ingester:
    """Run an ingester until the journal is in the store, then stop it."""
    ingester = Ingester(journal, store, ingest_batch=batch, ingest_workers=1)
    task = asyncio.create_task(ingester.run())
    try:
        assert await ingester.drain(10.0), "the journal was not ingested"
    finally:
        ingester.stop()
        await asyncio.wait_for(task, 10)
    return ingester


async def test_the_ingester_waits_out_a_store_that_is_down_and_loses_nothing(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.fail["add_jobs"] = 3
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    async with await Journal.open(tmp_path / "journal") as journal:
        ids = [f"i{n}" for n in range(50)]
        await journal.write(
            "acme-t", ids, [f"p{n}" for n in range(50)], create_ms=now_ms, dt_ms=now_ms
        )
        ingester = await ingest_all(journal, store, batch=20)
    assert sorted(store.rows) == sorted(ids)
    assert ingester.ingested == 50 and ingester.last_error is None
    assert store.calls["add_jobs"] >= 4  # three refusals, then the rows went in


async def test_adding_the_same_rows_again_counts_nothing_new() -> None:
    store = FakeStore()
    at = datetime.now(UTC)
    jobs = [NewJob(f"i{n}", "acme-t", at, "p", at) for n in range(3)]
    assert await store.add_jobs(jobs) == 3
    assert await store.add_jobs(jobs) == 0  # a crash between insert and read point
    assert len(store.rows) == 3


async def journal_and_ingest(tmp_path: Path, store: FakeStore, n: int) -> list[str]:
    """Journal ``n`` jobs and ingest them, 10 a batch; their ids."""
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    async with await Journal.open(tmp_path / "journal") as journal:
        ids = [f"r{i}" for i in range(n)]
        await journal.write("acme-t", ids, ["p"] * n, create_ms=now_ms, dt_ms=now_ms)
        await ingest_all(journal, store, batch=10)
    return ids


async def test_rows_a_quick_restart_took_before_their_flush_are_inserted_again(
    tmp_path: Path,
) -> None:
    """A crash between a batch's insert and its flush, with the server back before the
    flush: the flush succeeds on the new server, which never had the rows. The
    epoch each batch was inserted on tells the ingester to insert them again."""
    store = FakeStore()
    flush = store.flush
    restarted = False

    async def restart_before_the_first_flush() -> str:
        nonlocal restarted
        if not restarted:
            restarted = True
            store.restart()
        return await flush()

    store.flush = restart_before_the_first_flush  # type: ignore[method-assign]
    ids = await journal_and_ingest(tmp_path, store, 30)
    assert restarted and sorted(store.rows) == sorted(ids)


async def test_rows_inserted_again_are_flushed_on_the_server_they_went_into(
    tmp_path: Path,
) -> None:
    """The flush fails (the server went away), the rows are inserted again, and
    the server restarts once more before that insert's flush: they are inserted
    a third time, not taken for durable."""
    store = FakeStore()
    flush = store.flush
    flushes = 0

    async def fail_then_restart() -> str:
        nonlocal flushes
        flushes += 1
        if flushes == 1:
            raise StoreUnavailable("the server went away")
        if flushes == 2:
            store.restart()
        return await flush()

    store.flush = fail_then_restart  # type: ignore[method-assign]
    ids = await journal_and_ingest(tmp_path, store, 5)
    assert flushes >= 3 and sorted(store.rows) == sorted(ids)


def test_a_batch_is_timed_by_its_runs_not_by_its_contexts_start() -> None:
    # a first batch of one no-op job in a cold context: 70 ms, of which the run
    # took 0.02: the next batch is sized for the run
    assert ran_seconds([0.02], 0.07) == pytest.approx(0.00002)
    assert ran_seconds([0.5, 1.5], 0.07) == pytest.approx(0.002)
    assert ran_seconds([0.5, None], 0.07) == 0.07  # a run not measured: the batch's time
    assert ran_seconds([], 0.07) == 0.0
    sizes = BatchSizes(max_batch=1000)
    sizes.timed("a-t", ran_seconds([0.02], 0.07), 1)
    assert sizes.size("a-t") == 1000


def _lost_leases(metrics: Metrics) -> float:
    scraped = generate_latest(metrics.registry).decode()
    for line in scraped.splitlines():
        if line.startswith("queue_jobs_lost_lease_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_run_of_a_job_claimed_again_meanwhile_stores_no_outcome(tmp_path: Path) -> None:
    """A claim that lapsed while its run went on (the lease ran out, or the store
    ended the job by its deadline and it was rerun) may be followed by another
    claim of the job by the same daemon: only the newer run's outcome is stored
    (the sysid alone would let the older run's release match the newer claim),
    also when the older run's release is being retried as the newer claim comes."""
    store, pool, metrics = FakeStore(), InstantPool(), Metrics()
    engine = engine_of(
        store,
        pool,
        intake=RecordingIntake(),
        queuelog=QueueLog(tmp_path / "queue.log"),
        settings=SETTINGS,
        metrics=metrics,
    )
    loop = engine.run_loop
    store.set_handler("acme-t", "...")
    pool.gate.clear()
    [job_id] = store.add("acme-t", "first")
    [retried] = store.add("acme-t", "first", prefix="r")
    async with run_engine(engine, store):
        loop.on_jobs({"acme-t": 2})
        await until(lambda: loop.running == 2, "the first claims")
        # one claim lapses while its run goes on, and the job is claimed again
        row = store.rows[job_id]
        row.lock, row.dt, row.data = "", store.now(), "second"
        loop.on_jobs({"acme-t": 1})
        await until(lambda: pool.most_at_once == 3, "the second run beside the first")
        store.fail["release"] = 1  # the first batch's release is retried
        pool.gate.set()  # the older runs end first
        await until(lambda: store.fail["release"] == 0, "the failed release")
        pool.gate.clear()
        row = store.rows[retried]  # its claim lapses while the release waits
        row.lock, row.dt, row.data = "", store.now(), "second"
        loop.on_jobs({"acme-t": 1})
        await until(lambda: _lost_leases(metrics) == 2, "both older outcomes refused")
        assert store.rows[retried].running and loop.running == 1
        pool.gate.set()
        await until(lambda: loop.running == 0, "every run ended")
    assert {r.id: r.result for r in store.done()} == {job_id: "SECOND", retried: "SECOND"}
