"""The run loop: claim by the scheduler's pick, run in the runner pool, release
with outcomes.

The decisions live in modules of their own: what may be picked
(``engine.run.pick``), how big a batch is (``engine.run.sizes``), how much of
the daemon one tenant may hold (``engine.run.fairness``), running a batch and
its releases (``engine.run.batch``, ``engine.releases``). The store's upkeep
(leases, expiry, purge...) and the busy marks are services of their own
(``engine.upkeep``, ``engine.run.busy``); the store's notices come through
``engine.notices``. This module holds the claim loops and the bookkeeping that
ties them together; ``queue_daemon.wiring`` builds its parts.

Backpressure: a claim never takes more jobs than the scheduler has free
slots, so everything this daemon locks is running or about to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from queue_daemon.domain.jobs import ClaimedJob, Release, ReleaseHow
from queue_daemon.domain.names import JobType
from queue_daemon.domain.outcomes import put_back
from queue_daemon.engine.backoff import Backoff
from queue_daemon.engine.handlers import PULLED_LANG, HandlerCache
from queue_daemon.engine.run.batch import BatchRunner, Runners, seconds_left
from queue_daemon.engine.run.cancels import Cancels, started
from queue_daemon.engine.run.dispatch import IngestDispatch
from queue_daemon.engine.run.fairness import TenantBatches
from queue_daemon.engine.run.pick import POLL_S, WaitingTypes, claimable
from queue_daemon.engine.run.sizes import BatchSizes
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.observe.tracing import Tracing
from queue_daemon.scheduler import Pick, Scheduler
from queue_daemon.settings import DEFAULTS
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import JobQueue

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05  # a failed claim or release is tried again after this, doubling
RETRY_MAX_S = 5.0
DRAIN_POLL_S = 0.005  # how often a drain looks whether claims and dispatches ended
# Claim loops running at once, never two claims of one jobtype: two claims of
# one type cost PostgreSQL about 40% more CPU per job (their SKIP LOCKED scans
# step over each other's rows). The second loop lets another tenant's job be
# claimed while a claim of a flooding tenant's type is in flight.
CLAIM_LOOPS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    # the daemon's flags of the same names, with their defaults (queue_daemon.settings)
    concurrency: int = DEFAULTS.concurrency  # jobs running at once
    tenant_running: int | None = DEFAULTS.tenant_running  # of them, one tenant's
    max_batch: int = DEFAULTS.max_batch
    max_parallel_batches: int = 64  # at most one per runner context
    lease: float = DEFAULTS.lease  # seconds a claim holds its jobs (engine.upkeep.renew)


class RunLoop(IngestDispatch):
    """Claims batches of daemon-run types, runs them and releases them."""

    def __init__(
        self,
        *,
        store: JobQueue,
        scheduler: Scheduler,
        waiting: WaitingTypes,
        sizes: BatchSizes,
        tenants: TenantBatches,
        batches: BatchRunner,
        pool: Runners,
        handlers: HandlerCache,
        queuelog: QueueLog,
        metrics: Metrics,
        sysid: str,
        settings: RunSettings,
        tracing: Tracing | None = None,
    ) -> None:
        self._store = store
        self._scheduler = scheduler
        self._waiting = waiting
        self._sizes = sizes
        self._tenants = tenants
        self._runner = batches
        self._pool = pool
        self._handlers = handlers
        self._queuelog = queuelog
        self._metrics = metrics
        self._sysid = sysid
        self._settings = settings
        self._tracing = tracing or Tracing.off()  # traced jobs' spans (observe.tracing)
        self._running: dict[str, ClaimedJob] = {}
        self._batches: dict[asyncio.Task[None], list[ClaimedJob]] = {}
        self._cancels = Cancels(keep=2 * settings.lease)  # cancelled while running here
        self._wake = asyncio.Event()
        self._stopping = False
        self._no_handler: dict[str, float] = {}  # types without a handler -> when last checked
        self._claiming = 0  # claims in flight
        self._claiming_types: set[str] = set()  # their jobtypes
        # dispatches the ingester is storing: their holds, and when they must start by
        self._dispatches: dict[int, tuple[list[tuple[str, int]], float]] = {}
        self.started = 0
        self.finished = 0

    # the store's notices (engine.notices)
    def on_jobs(self, added: dict[str, int] | None = None) -> None:
        """New jobs: ``added`` counts the due ones per jobtype; None when it is
        not known what changed (the waiting types are read again)."""
        self._waiting.noted(added)
        self._wake.set()

    def on_handler(self, jobtype: str) -> None:
        self._handlers.invalidate(jobtype)
        self._no_handler.pop(jobtype, None)
        # the store lists only types with a handler: a new one's jobs show on a new read
        self._waiting.noted(None)
        client, name = JobType.parse(jobtype)
        self._pool.retire(client, name)
        self._wake.set()

    def on_cancel(self, sysid: str, job_id: str) -> None:
        """The store ended a job this daemon runs, or is about to (cancelled): its
        batch is stopped, the context killed, and the batch's other jobs run
        again; a batch not begun yet leaves it out."""
        if sysid != self._sysid:
            return
        self._cancels.hear(job_id)
        for task, jobs in self._batches.items():
            if started(task) and any(job.id == job_id for job in jobs):
                task.cancel()

    @property
    def running(self) -> int:
        return len(self._running)

    def running_ids(self) -> list[str]:
        """The jobs this daemon runs now (their leases are renewed)."""
        return list(self._running)

    async def run(self) -> None:
        """The claim loops, until cancelled."""
        async with asyncio.TaskGroup() as group:
            for _ in range(CLAIM_LOOPS):
                group.create_task(self._claim_loop())

    async def drain(self, within: float) -> None:
        """Stop claiming; let running batches finish for ``within`` seconds, then
        stop them and put their jobs back at once for another daemon."""
        self._stopping = True
        self._wake.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        # a claim or a dispatch in flight starts its batch when it ends: wait for
        # them (polled: only a drain waits for this), so that no batch starts
        # after those waited for below
        while (self._claiming or self._dispatches) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(DRAIN_POLL_S)
        if self._batches:
            rest = max(0.0, deadline - loop.time())
            _, pending = await asyncio.wait(set(self._batches), timeout=rest)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def _claim_loop(self) -> None:
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while not self._stopping:
            self._wake.clear()
            try:
                claimed = await self._claim_once()
            except StoreError as exc:
                logger.warning("claim failed: %s", exc, extra={"action": "claim_failed"})
                await backoff.sleep()
                continue
            backoff.reset()
            if not claimed and not self._stopping:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation that comes as the wake does, and the loop would go on
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_S):
                        await self._wake.wait()

    async def _claim_once(self) -> bool:
        """Claim and start one batch; False when there was nothing to do."""
        if (
            self._scheduler.free_slots() <= 0
            or len(self._batches) + self._claiming >= self._settings.max_parallel_batches
        ):
            return False
        waiting = claimable(
            await self._waiting.get(),
            no_handler=self._no_handler,
            now=time.monotonic(),
            full=self._tenants.full(),
            claiming=self._claiming_types,
            learning_full=self._sizes.learning_full(),
        )
        pick = self._scheduler.select_jobtype(waiting, self._pool.warm())
        if pick is None:
            return False
        # the type is taken from the moment it is picked: the other claim loop
        # must not pick it too while this one awaits its handler or its claim
        self._claiming_types.add(pick.jobtype)
        try:
            return await self._claim_picked(pick)
        finally:
            self._claiming_types.discard(pick.jobtype)

    async def _claim_picked(self, pick: Pick) -> bool:
        jobtype = pick.jobtype
        spec = await self._handlers.get(jobtype)
        if spec is None or spec.lang == PULLED_LANG:
            # not claimed (its handler went since the waiting types were read):
            # its jobs wait until a handler comes, or a tenant's worker claims
            # them; the upkeep's sweep ends those whose time runs out
            self._no_handler[jobtype] = time.monotonic()
            return True
        limit = min(pick.limit, self._sizes.size(jobtype))
        # hold the slots while the claim is in flight, so the other claim loop
        # cannot hand them out too (backpressure stays exact)
        self._hold(jobtype, limit)
        self._claiming += 1
        jobs: list[ClaimedJob] = []
        # the lease runs from the claim in the store, a moment after this: a batch
        # not started by then is not started at all (this daemon may have stalled
        # past the lease, and another one may be running the jobs)
        start_by = time.monotonic() + self._settings.lease
        try:
            began, began_ns = time.perf_counter(), time.time_ns()
            jobs = await self._store.claim(
                jobtype, limit, sysid=self._sysid, lease=self._settings.lease
            )
            self._metrics.claimed(jobtype, len(jobs), time.perf_counter() - began)
            if self._tracing.on:
                self._tracing.step("queue.claim", jobs, began_ns, {"queue.sysid": self._sysid})
        finally:
            self._claiming -= 1
            self._let_go(jobtype, limit - len(jobs), all_of_it=not jobs)
        self._waiting.claimed(jobtype, limit, len(jobs))
        if jobs:
            self._start(jobtype, jobs, start_by)
        return True

    def _hold(self, jobtype: str, limit: int) -> None:
        """Slots for a batch of up to ``limit`` jobs of ``jobtype``, held from the
        moment it is picked (a claim or a dispatch in flight)."""
        self._scheduler.jobs_started(jobtype, limit)
        self._tenants.started(JobType.client_of(jobtype))

    def _let_go(self, jobtype: str, slots: int, *, all_of_it: bool) -> None:
        """``slots`` of a held batch of ``jobtype`` were not taken; ``all_of_it``:
        the batch got no job at all (it will not run)."""
        if slots > 0:
            self._scheduler.jobs_stopped(jobtype, slots)
        if all_of_it:
            self._sizes.done(jobtype)
            self._tenants.ended(JobType.client_of(jobtype))

    def _start(self, jobtype: str, jobs: list[ClaimedJob], start_by: float) -> None:
        for job in jobs:
            self._running[job.id] = job
        self.started += len(jobs)
        self._queuelog.started(jobtype, jobs)
        task = asyncio.create_task(self._run_batch(jobtype, jobs, start_by))
        self._batches[task] = jobs
        task.add_done_callback(self._batches.pop)

    async def _run_batch(self, jobtype: str, jobs: list[ClaimedJob], start_by: float) -> None:
        releases: list[Release] = []
        run_ms: dict[str, float] = {}
        # the runs' spans of traced jobs (their handlers get them as their trace)
        runs = (
            self._tracing.begin("queue.run", jobs, {"queue.type": jobtype})
            if self._tracing.on
            else {}
        )
        try:
            # stopped when a job's deadline passes: the store ends that job (408)
            # and the batch's other jobs run again, their attempt not counted
            run = [job for job in jobs if job.id not in self._cancels]
            # those left out are put back: refused for a job the store ended, due
            # again for one a notice named too late (a run before, now rerun)
            releases = [put_back(job) for job in jobs if job.id in self._cancels]
            async with asyncio.timeout(seconds_left(run)):
                if run:
                    releases += await self._runner.releases(jobtype, run, run_ms, start_by=start_by)
        except TimeoutError:
            releases = [put_back(job) for job in jobs]
        except asyncio.CancelledError:
            # shutdown (another daemon runs them) or a job cancelled: its put-back
            # is refused (the store ended it), and not reported as a lease lost
            releases = [put_back(job) for job in jobs]
            raise
        finally:
            await asyncio.shield(self._finish(jobtype, jobs, releases, run_ms, runs))

    async def _finish(
        self,
        jobtype: str,
        jobs: list[ClaimedJob],
        releases: list[Release],
        run_ms: dict[str, float],
        runs: dict[str, Span],
    ) -> None:
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        ran_ns = time.time_ns()
        by_id = {job.id: job for job in jobs}
        lost: list[Release] = []
        await self._runner.flush_progress(by_id)  # kept with the done jobs
        while releases:
            # a job this daemon claimed again while this run of it went on (this
            # run's claim lapsed: its lease ran out, also while a release was
            # retried, or the store ended it by its deadline and it was rerun):
            # the store holds the newer claim, under the same sysid, and this
            # run's outcome must not be stored against it
            stale = [r for r in releases if self._running.get(r.id) is not by_id[r.id]]
            if stale:
                lost += stale
                releases = [r for r in releases if self._running.get(r.id) is by_id[r.id]]
                if not releases:
                    break
            try:
                applied = await self._store.release(releases, sysid=self._sysid)
                if len(applied) < len(releases):
                    # the lease ran out first (this daemon stalled, or the store was
                    # down past it): another run decides these jobs, not this one
                    lost += [r for r in releases if r.id not in applied]
                    releases = [r for r in releases if r.id in applied]
                break
            except StoreError as exc:
                # keep trying: the lease runs out meanwhile and another daemon may rerun
                # the jobs, which at-least-once allows
                logger.warning("release failed: %s", exc, extra={"action": "release_failed"})
                await backoff.sleep()
        if runs:
            self._tracing.released(runs, {r.id: r.code for r in releases}, ran_ns)
        for job in jobs:
            if self._running.get(job.id) is job:
                del self._running[job.id]
        put_back = sum(r.how == ReleaseHow.UNGET for r in releases)
        if put_back:  # due again at once: claimable without a read of the store
            self._waiting.noted({jobtype: put_back})
        self._sizes.done(jobtype)
        self._tenants.ended(JobType.client_of(jobtype))
        self._scheduler.jobs_stopped(jobtype, len(jobs))
        self.finished += len(jobs)
        attempts = {job.id: job.attempts for job in jobs}
        self._queuelog.finished(jobtype, releases, attempts=attempts, run_ms=run_ms)
        self._metrics.finished(jobtype, releases)
        lost = [r for r in lost if r.id not in self._cancels]  # not a lease lost: cancelled
        self._cancels.forget(by_id)
        if lost:
            logger.warning(
                "%d job(s) of %s finished after this daemon lost their lease; outcome discarded",
                len(lost),
                jobtype,
                extra={"action": "lost_lease"},
            )
            self._queuelog.lost_lease(jobtype, lost, attempts=attempts, run_ms=run_ms)
            self._metrics.lost_lease(jobtype, len(lost))
        self._wake.set()
