"""Moves acknowledged jobs from the journal into the store.

Each pipeline loops reserve → read → ``queue_daemon.store.add_jobs`` and hands the batch on
as soon as its rows are in (seen and notified, not yet flushed): one settling
task waits until everything handed to it is durable (one WAL flush for all
the batches that came meanwhile) and only then advances the journal's read
point over them (one fsync). A line added behind a batch so does not also wait
for that batch's flushes. The insert is idempotent by id, so a crash between
insert and rsync re-ingests the batch without duplicating it; rows that a
store crash took before they were flushed are inserted again before the read
point passes them: those of a flush that failed, and those inserted on an
earlier incarnation of the server than the one that flushed (its epoch, read
before each insert), which a crash and a quick restart would otherwise hide.
While the store is unreachable a pipeline keeps its batch and retries with
capped exponential backoff; adds keep landing in the journal meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from queue_daemon.domain.jobs import ClaimedJob, NewJob, added_once
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.engine.backoff import Backoff
from queue_daemon.engine.ingest.early import Dispatcher, EarlyAdd, stored_early
from queue_daemon.engine.ingest.lines import opted_traces, split_opted, to_new_jobs
from queue_daemon.engine.ingest.recent import RECENT_BYTES, History
from queue_daemon.journal import Entry, Journal, Reservation
from queue_daemon.observe.tracing import Tracing
from queue_daemon.store.errors import StoreError, StoreUnavailable
from queue_daemon.store.ports import JobIntake

logger = logging.getLogger(__name__)

RESERVE_TIMEOUT = 60.0  # seconds before an un-synced reservation is handed out again
# payload bytes a pipeline reads at a time besides its lines (big payloads: fewer rows)
READ_BYTES = 4 << 20
# A pipeline that moves small batches in a stream (this one began less than
# two cycles after the one before) waits until a cycle after it began before
# the next, so a stream of 1-line adds is ingested in batches of many lines
# (one insert and commit each) rather than one by one. It bounds the added
# ingest latency; a line that comes alone, or after one large add, does not wait,
# nor does a batch of one line: nothing queued up behind the last insert, so the
# pipeline keeps up with the adds one by one (a steady 100 adds/s, say), and
# waiting would only add latency.
SMALL_BATCH_CYCLE = 0.01
# Batches in the store whose flush is not yet confirmed (kept in memory, to be
# inserted again if the flush fails); a pipeline waits for room beyond this.
MAX_UNSETTLED = 8
# A fresh batch of at most this many jobs may be dispatched: stored claimed by
# this daemon, which runs them at once (``Dispatcher``); a larger batch is a
# backlog that the run loop's claims share out.
DISPATCH_MAX = 64
# Helper pipelines also move a few lines when the first pipeline has been busy
# with one batch this long, or at once when that batch has BIG_BATCH lines or
# more: a line added behind a large batch (another tenant's big add) does not
# wait for that batch's insert.
HELP_AFTER = 0.01
BIG_BATCH = 100
# While batches settled lately are kept, the store's history is looked at (one
# flush) at least this often, so that a failover with no add after it is seen.
HISTORY_CHECK_S = 1.0


class _Unsettled(NamedTuple):
    """A batch in the store, not known flushed."""

    reservation: Reservation
    jobs: list[NewJob]
    opted: list[OptedJobs]
    epochs: frozenset[str]  # the server's, read before each insert of its rows
    dispatched: frozenset[str]  # ids of its jobs stored claimed by this daemon


class Ingester:
    """Runs ``workers`` concurrent ingestion pipelines until stopped.

    ``dispatcher``, set before ``run``: small fresh batches go through it
    (dispatch at ingest); without one, every job waits for a claim."""

    dispatcher: Dispatcher | None = None

    def __init__(
        self,
        journal: Journal,
        store: JobIntake,
        *,
        ingest_batch: int,
        ingest_workers: int,
        on_stored: Callable[[Sequence[Entry]], None] = lambda entries: None,
        tracing: Tracing | None = None,
        keep_bytes: int = RECENT_BYTES,
    ) -> None:
        self._journal = journal
        self._tracing = tracing or Tracing.off()  # traced adds' ingest spans
        self._store = store
        self._on_stored = on_stored  # told of each batch in the store (admission's counts)
        self._batch = ingest_batch
        self._workers = ingest_workers
        self._stopping = asyncio.Event()
        self.ingested = 0  # rows newly inserted by this daemon
        self._first_busy_since: float | None = None  # the first pipeline's batch began
        self._first_busy_lines = 0  # ... and its lines
        self.last_error: str | None = None
        # in the store, not known flushed: each batch with the epochs its rows were
        # inserted on and the ids of its jobs that were dispatched
        self._unsettled: list[_Unsettled] = []
        self._room = asyncio.Semaphore(MAX_UNSETTLED)
        self._to_settle = asyncio.Event()
        self._pipelines_done = False
        # batches settled lately, for a failover (0: none kept, no standby to promote)
        self._history = History(self._reinsert, limit=keep_bytes)

    async def run(self) -> None:
        self._pipelines_done = False
        async with asyncio.TaskGroup() as group:
            group.create_task(self._settle_loop())
            pipelines = [group.create_task(self._worker(h > 0)) for h in range(self._workers)]
            try:
                await asyncio.wait(pipelines)
            finally:
                self._pipelines_done = True  # the settling task ends once all is settled
                self._to_settle.set()

    def stop(self) -> None:
        """Workers finish the batch in hand and return."""
        self._stopping.set()

    async def drain(self, within: float) -> bool:
        """Wait until everything durable in the journal is ingested (and inserted
        again after a failover); True if so."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self._journal.lag.unread_lines > 0 or self._history.replaying:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def _worker(self, helper: bool) -> None:
        """One pipeline. Helpers (all but the first) only take part when a
        backlog builds up: a trickle of adds is cheaper moved by one pipeline."""
        journal = self._journal
        loop = asyncio.get_running_loop()
        small = self._batch // 4
        last_began = float("-inf")
        while not self._stopping.is_set():
            if helper and journal.lag.unread_lines < small and not self._first_is_slow(loop):
                if await journal.wait_readable(timeout=0.5):
                    await asyncio.sleep(0)  # the first pipeline takes what it can
                    if not self._first_is_slow(loop):
                        await asyncio.sleep(SMALL_BATCH_CYCLE)  # let a backlog show itself
                continue
            reservation = journal.read_reserve(self._batch, RESERVE_TIMEOUT, READ_BYTES)
            if reservation is None:
                await journal.wait_readable(timeout=0.5)
                continue
            began = loop.time()
            if not helper:
                self._first_busy_since = began
                self._first_busy_lines = reservation.lines
            try:
                entries = await journal.read(reservation)
                early, lines = await stored_early(reservation, entries)
                plain, opted = split_opted(lines)
                jobs = to_new_jobs(plain)
                epoch, dispatched = await self._insert(
                    jobs, opted, durable=False, reservation=reservation
                )
            finally:
                if not helper:
                    self._first_busy_since = None
            self._on_stored(entries)
            await self._room.acquire()
            epochs = {epoch}
            for stored in early:
                self.ingested += stored.added
                jobs += stored.jobs
                epochs.add(stored.epoch)
                dispatched |= stored.claimed
            self._unsettled.append(
                _Unsettled(reservation, jobs, opted, frozenset(epochs), dispatched)
            )
            self._to_settle.set()
            streaming = began - last_began < 2 * SMALL_BATCH_CYCLE
            last_began = began
            if streaming and 1 < len(entries) < small:
                rest = began + SMALL_BATCH_CYCLE - loop.time()
                if rest > 0:
                    await asyncio.sleep(rest)

    async def _settle_loop(self) -> None:
        """Flush what the pipelines inserted, then advance the read point over it;
        while batches settled lately are kept, look at the store's history at
        least every ``HISTORY_CHECK_S`` (``engine.ingest.recent``)."""
        history = self._history
        while True:
            if not self._unsettled:
                if self._pipelines_done:
                    if history:  # a last look: a switch not seen yet
                        await history.check(self._store.flush)
                    return
                self._to_settle.clear()
                if not history:
                    await self._to_settle.wait()
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HISTORY_CHECK_S):
                        await self._to_settle.wait()
                if not self._unsettled and not self._pipelines_done:
                    await history.check(self._store.flush)
                continue
            batches, self._unsettled = self._unsettled, []
            sent = time.monotonic()
            try:
                epoch: str | None = await self._store.flush()
            except StoreError as exc:
                # a store that went away may have lost rows not yet flushed
                again, epoch = batches, None
                reason = f"ingest flush failed ({exc})"
            else:
                # a flush on a server that restarted since a batch went in does not
                # cover that batch: the crash may have taken it
                again = [batch for batch in batches if batch.epochs != {epoch}]
                reason = "the store restarted or failed over since they were inserted"
            if again:
                logger.warning(
                    "%s: inserting %d batches again",
                    reason,
                    len(again),
                    extra={"action": "ingest_reinsert"},
                )
            flushed, durable_on = epoch, dict[int, str]()
            for batch in again:
                sent = time.monotonic()
                durable_on[id(batch)] = epoch = await self._reinsert(
                    batch.jobs, batch.opted, batch.dispatched
                )
            now = time.monotonic()
            for batch in batches:
                await self._journal.rsync(batch.reservation)
                self._room.release()
                on = durable_on.get(id(batch), flushed)
                assert on is not None  # a batch not flushed was inserted again
                history.keep_settled(now, on, batch.reservation, batch)
            assert epoch is not None
            await history.seen(epoch, sent)

    async def _reinsert(
        self, jobs: list[NewJob], opted: list[OptedJobs], dispatched: frozenset[str]
    ) -> str:
        """Insert rows again that may or may not have been lost, until they are
        durable; the epoch they are durable on."""
        epoch, _ = await self._insert(jobs, opted, durable=True, count=False, dispatched=dispatched)
        return epoch

    def start_early(
        self,
        stored_type: str,
        ids: Sequence[str],
        payloads: Sequence[str],
        *,
        create_ms: int,
        dt_ms: int,
    ) -> EarlyAdd | None:
        """Dispatch at add (``engine.ingest.early``): an EarlyAdd storing an add's
        jobs while the journal writes them, when this daemon runs them all at
        once and nothing else waits to be ingested; else None."""
        dispatcher = self.dispatcher
        if (
            dispatcher is None
            or not ids
            or len(ids) > DISPATCH_MAX
            or self.last_error is not None
            or not self._journal.writable
            or self._journal.unreserved  # (a pipeline is behind: ingest in order)
            or not all(added_once(job_id) for job_id in ids)
        ):
            return None
        lines = zip(ids, payloads, strict=True)
        jobs = to_new_jobs([Entry(i, create_ms, dt_ms, stored_type, p) for i, p in lines])
        dispatch = dispatcher.take(jobs)
        if dispatch is None:
            return None
        if len(dispatch.ids) < len(jobs):  # some would wait: a claim takes them all
            dispatcher.dispatched(dispatch, [])
            return None
        return EarlyAdd(self._store, dispatcher, jobs, dispatch)

    async def _add_fresh(self, jobs: list[NewJob]) -> tuple[int, frozenset[str]]:
        """Store a fresh batch, the jobs the dispatcher takes claimed (a few
        only): how many rows were new, and the ids of those claimed."""
        dispatcher = self.dispatcher
        dispatch = None
        if dispatcher is not None and len(jobs) <= DISPATCH_MAX:
            dispatch = dispatcher.take(jobs)
        if dispatch is None:
            return await self._store.add_jobs(jobs, durable=False, fresh=True), frozenset()
        assert dispatcher is not None
        claimed: list[ClaimedJob] = []
        try:
            added, claimed = await self._store.add_dispatched(jobs, dispatch)
        finally:  # failed or cancelled: the holds go, the batch is tried again
            dispatcher.dispatched(dispatch, claimed)
        return added, frozenset(job.id for job in claimed)

    def _first_is_slow(self, loop: asyncio.AbstractEventLoop) -> bool:
        since = self._first_busy_since
        if since is None:
            return False
        return self._first_busy_lines >= BIG_BATCH or loop.time() - since >= HELP_AFTER

    async def _insert(
        self,
        jobs: list[NewJob],
        opted: list[OptedJobs],
        *,
        durable: bool,
        count: bool = True,
        reservation: Reservation | None = None,
        dispatched: frozenset[str] = frozenset(),
    ) -> tuple[str, frozenset[str]]:
        """Insert until it succeeds; ``count``: add the new rows to ``ingested`` (not
        when inserting again rows that may or may not have been lost). Return the
        store's epoch read before the insert that succeeded: a flush on another
        epoch does not cover these rows; and the ids of the jobs stored claimed
        by this daemon (dispatched). ``durable``: flushed before it returns, on
        the epoch it was inserted on (else inserted again). ``dispatched``: jobs
        of the batch (inserted again) that were dispatched; those this daemon
        still runs are stored claimed by it, so that no other daemon takes one
        meanwhile.

        Only the first try of a ``reservation`` the journal calls fresh, whose ids
        were each made for their add alone, is fresh for the store (no job of it
        can be there yet); a try after a failure, a batch inserted again, or ids
        of an Idempotency-Key or a schedule's tick (journaled by every add of
        them) may find their jobs in the store, some of them done."""
        backoff = Backoff(0.05, 5.0, jitter=True)
        # an id another add may have journaled too is never fresh
        fresh = (
            reservation is not None
            and reservation.fresh
            and all(added_once(job.id) for job in jobs)
        )
        while True:
            try:
                epoch = await self._store.epoch()
                # a reservation that expired meanwhile may be another pipeline's now
                fresh = fresh and reservation is not None and reservation.fresh
                claimed: frozenset[str] = frozenset()
                rest = jobs
                added = 0
                running = None  # asked at each try: a job may have ended meanwhile
                if dispatched and self.dispatcher is not None:
                    running = self.dispatcher.still_running(dispatched)
                if running is not None:
                    rest = [job for job in jobs if job.id not in running.ids]
                    mine = [job for job in jobs if job.id in running.ids]
                    added += (await self._store.add_dispatched(mine, running, fresh=False))[0]
                if fresh and not durable and rest:
                    new, claimed = await self._add_fresh(rest)
                    added += new
                elif rest:
                    added += await self._store.add_jobs(rest, durable=False, fresh=fresh)
                if opted:  # options: rare, one statement per add
                    began_ns = time.time_ns()
                    added += await self._store.add_opted(opted)
                    if self._tracing.on:
                        self._tracing.step("queue.ingest", opted_traces(opted), began_ns)
                if durable and await self._store.flush() != epoch:
                    # the server restarted between the insert and the flush
                    fresh = False
                    continue
                # not `self.ingested += await ...`: that reads the count before the
                # await, and a concurrent pipeline's rows would be lost from it
                if count:
                    self.ingested += added
                if self.last_error is not None:
                    logger.info("store reachable again", extra={"action": "ingest_resumed"})
                    self.last_error = None
                return epoch, claimed
            except StoreUnavailable as exc:
                reason = f"store unavailable: {exc}"
            except StoreError as exc:
                reason = f"store error: {type(exc).__name__}: {exc}"
            if self.last_error is None:
                logger.warning("ingestion paused: %s", reason, extra={"action": "ingest_paused"})
            self.last_error = reason
            fresh = False  # the failed try may have put some of them in
            await backoff.sleep()
