"""The daemon loop that runs jobs: claim by the scheduler's pick, run in the
runner pool, release with outcomes; and the upkeep loops beside it.

The decisions live in rooms of their own: what may be picked
(``engine.waiting``), how big a batch is (``engine.batching``), how much of the
daemon one tenant may hold and who is busy (``engine.fairness``), running a
batch (``engine.batches``), leases, expiry and purge (``engine.upkeep``). This
module holds the loops and the bookkeeping that ties them together.

Backpressure: a claim never takes more jobs than the scheduler has free
slots, so everything this daemon locks is running or about to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from queue_daemon.domain.jobs import ClaimedJob, Release
from queue_daemon.domain.names import JobType
from queue_daemon.domain.outcomes import put_back
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits, TenantLimits
from queue_daemon.engine.admit.quotas import Admission
from queue_daemon.engine.backoff import Backoff
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.pull.pulls import PULLED_LANG
from queue_daemon.engine.run.batch import BatchRunner, Runners
from queue_daemon.engine.run.fairness import BusyMarks, TenantBatches
from queue_daemon.engine.run.pick import POLL_S, WaitingTypes, claimable
from queue_daemon.engine.run.sizes import BatchSizes
from queue_daemon.engine.upkeep.leases import Upkeep
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.scheduler import Pick, Scheduler
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import JobQueue

logger = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05  # a failed claim or release is tried again after this, doubling
RETRY_MAX_S = 5.0
LISTEN_RETRY_FIRST_S = 0.1  # reconnecting the store's listener, doubling
LISTEN_RETRY_MAX_S = 5.0
# Claim loops running at once, never two claims of one jobtype: two claims of
# one type cost PostgreSQL about 40% more CPU per job (their SKIP LOCKED scans
# step over each other's rows). The second loop lets another tenant's job be
# claimed while a claim of a flooding tenant's type is in flight.
CLAIM_LOOPS = 2
# How often the tenants running more contexts than their share of the cores are
# found and their handlers put behind the others' on the CPU (runners.sandbox.cpushare).
BUSY_CHECK_S = 0.25
# How often jobs whose deadline passed are ended (408), and dependencies that a
# crash left unresolved are resolved.
DEADLINE_CHECK_S = 1.0
FOLD_COUNTS_S = 1.0  # the waiting counts' appended moves are folded this often
# a batch is stopped this long after its soonest deadline: after the store's check
# has ended that job (with its run), so its outcome is refused, not put back
DEADLINE_GRACE_S = DEADLINE_CHECK_S + 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    concurrency: int = 1024
    tenant_running: int | None = None
    max_batch: int = 200
    max_parallel_batches: int = 64  # at most one per runner context
    lease: float = 60.0
    job_ttl: float = 86_400.0
    retention: float = 7 * 86_400.0
    purge_interval: float = 600.0
    payload_limit: int = 1 << 20


def _cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    return len(affinity(0)) if affinity else os.cpu_count() or 1


class Worker:
    def __init__(
        self,
        *,
        store: JobQueue,
        intake: Intake,
        pool: Runners,
        handlers: HandlerCache,
        queuelog: QueueLog,
        sysid: str,
        settings: WorkerSettings,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
        admission: Admission | None = None,
        ensure_uid: Callable[[str], Awaitable[None]] | None = None,
        jobs_noted: Callable[[dict[str, int] | None], None] | None = None,
        done_noted: Callable[[set[str] | None], None] | None = None,
    ) -> None:
        self._store = store
        self._pool = pool
        self._handlers = handlers
        self._queuelog = queuelog
        self._sysid = sysid
        self._settings = settings
        self._jobs_noted = jobs_noted  # told of new jobs too (held claims of pull workers)
        self._done_noted = done_noted  # told of done jobs (held GETs)
        self._metrics = metrics or Metrics()
        self._scheduler = Scheduler(
            concurrency=settings.concurrency,
            tenant_running=settings.tenant_running,
            max_batch=settings.max_batch,
        )
        # per-tenant limits: running caps go to the scheduler, the rest apply here
        limits = limits or Limits(
            TenantLimits(running=settings.tenant_running or 0, payload=settings.payload_limit)
        )
        limits.on_change(self._limits_changed)
        self._sizes = BatchSizes(settings.max_batch)
        self._tenants = TenantBatches(settings.max_parallel_batches)
        self._busy = BusyMarks(_cores(), pool.busy_remark_s)
        self._waiting = WaitingTypes(store)
        self._runner = BatchRunner(
            pool=pool,
            handlers=handlers,
            intake=intake,
            admission=admission,
            limits=limits,
            ensure_uid=ensure_uid,
            queuelog=queuelog,
            metrics=self._metrics,
            sizes=self._sizes,
            job_ttl=settings.job_ttl,
        )
        self._upkeep = Upkeep(
            store=store,
            queuelog=queuelog,
            metrics=self._metrics,
            sysid=sysid,
            lease=settings.lease,
            job_ttl=settings.job_ttl,
            retention=settings.retention,
        )
        self._running: dict[str, ClaimedJob] = {}
        self._batches: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._no_handler: dict[str, float] = {}  # types without a handler -> when last checked
        self._claiming = 0  # claims in flight
        self._claiming_types: set[str] = set()  # their jobtypes
        self.started = 0
        self.finished = 0

    def _limits_changed(self, limits: Limits) -> None:
        self._scheduler.set_tenant_caps(
            {client: t.running or None for client, t in limits.overridden().items()}
        )

    # notifications from the store's listener
    def on_jobs(self, added: dict[str, int] | None = None) -> None:
        """New jobs: ``added`` counts the due ones per jobtype; None when it is
        not known what changed (the waiting types are read again)."""
        self._waiting.noted(added)
        self._wake.set()
        if self._jobs_noted is not None:
            self._jobs_noted(added)

    def on_handler(self, jobtype: str) -> None:
        self._handlers.invalidate(jobtype)
        self._no_handler.pop(jobtype, None)
        # the store lists only types with a handler: a new one's jobs show on a new read
        self._waiting.noted(None)
        client, name = JobType.parse(jobtype)
        self._pool.retire(client, name)
        self._wake.set()

    @property
    def running(self) -> int:
        return len(self._running)

    async def run(self) -> None:
        """Every loop of the worker, until cancelled."""
        settings = self._settings
        async with asyncio.TaskGroup() as group:
            retry = Backoff(LISTEN_RETRY_FIRST_S, LISTEN_RETRY_MAX_S)
            group.create_task(
                self._store.listen(
                    self.on_jobs, self.on_handler, retry=retry, on_done=self._done_noted
                )
            )
            for _ in range(CLAIM_LOOPS):
                group.create_task(self._claim_loop())
            group.create_task(self._every(settings.lease / 3, self._renew))
            group.create_task(self._every(min(5.0, settings.lease / 4), self._expire))
            group.create_task(self._every(settings.purge_interval, self._upkeep.purge))
            group.create_task(self._every(DEADLINE_CHECK_S, self._upkeep.deadlines))
            group.create_task(self._every(FOLD_COUNTS_S, self._upkeep.fold_counts))
            group.create_task(
                self._every(self._upkeep.unhandled_every, self._upkeep.sweep_unhandled, first=1.0)
            )
            group.create_task(self._every(BUSY_CHECK_S, self._mark_busy))

    async def drain(self, within: float) -> None:
        """Stop claiming; let running batches finish for ``within`` seconds, then
        stop them and put their jobs back at once for another daemon."""
        self._stopping = True
        self._wake.set()
        if self._batches:
            _, pending = await asyncio.wait(set(self._batches), timeout=within)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def _every(
        self, interval: float, step: Callable[[], Awaitable[object]], *, first: float | None = None
    ) -> None:
        """``step`` every ``interval`` seconds, the first time after ``first`` (default
        ``interval``)."""
        wait = interval if first is None else first
        while True:
            await asyncio.sleep(wait)
            wait = interval
            try:
                await step()
            except StoreError as exc:
                logger.warning("%s failed: %s", step.__name__, exc, extra={"action": "worker_step"})

    async def _mark_busy(self) -> None:
        """Tell the runners which tenants are busy (``engine.fairness.BusyMarks``)."""
        busy = self._busy.check(self._tenants.take_peak(), time.monotonic())
        if busy is not None:
            await self._pool.mark_busy(busy)

    async def _renew(self) -> None:
        await self._upkeep.renew(list(self._running))

    async def _expire(self) -> None:
        if await self._upkeep.expire():
            self.on_jobs()

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
        self._scheduler.jobs_started(jobtype, limit)
        self._claiming += 1
        tenant = JobType.client_of(jobtype)
        self._tenants.started(tenant)
        jobs: list[ClaimedJob] = []
        # the lease runs from the claim in the store, a moment after this: a batch
        # not started by then is not started at all (this daemon may have stalled
        # past the lease, and another one may be running the jobs)
        start_by = time.monotonic() + self._settings.lease
        try:
            began = time.perf_counter()
            jobs = await self._store.claim(
                jobtype, limit, sysid=self._sysid, lease=self._settings.lease
            )
            self._metrics.claimed(jobtype, len(jobs), time.perf_counter() - began)
        finally:
            self._claiming -= 1
            if len(jobs) < limit:
                self._scheduler.jobs_stopped(jobtype, limit - len(jobs))
                if not jobs:
                    self._sizes.done(jobtype)
                    self._tenants.ended(tenant)
        self._waiting.claimed(jobtype, limit, len(jobs))
        if not jobs:
            return True
        for job in jobs:
            self._running[job.id] = job
        self.started += len(jobs)
        self._queuelog.started(jobtype, jobs)
        task = asyncio.create_task(self._run_batch(jobtype, jobs, start_by))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)
        return True

    async def _run_batch(self, jobtype: str, jobs: list[ClaimedJob], start_by: float) -> None:
        releases: list[Release] = []
        run_ms: dict[str, float] = {}
        try:
            # stopped when a job's deadline passes: the store ends that job (408)
            # and the batch's other jobs run again, their attempt not counted
            async with asyncio.timeout(_seconds_left(jobs)):
                releases = await self._runner.releases(jobtype, jobs, run_ms, start_by=start_by)
        except TimeoutError:
            releases = [put_back(job) for job in jobs]
        except asyncio.CancelledError:
            releases = [put_back(job) for job in jobs]  # shutdown: another daemon runs them
            raise
        finally:
            await asyncio.shield(self._finish(jobtype, jobs, releases, run_ms))

    async def _finish(
        self,
        jobtype: str,
        jobs: list[ClaimedJob],
        releases: list[Release],
        run_ms: dict[str, float],
    ) -> None:
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        lost: list[Release] = []
        while releases:
            try:
                applied = await self._store.release(releases, sysid=self._sysid)
                if len(applied) < len(releases):
                    # the lease ran out first (this daemon stalled, or the store was
                    # down past it): another run decides these jobs, not this one
                    lost = [r for r in releases if r.id not in applied]
                    releases = [r for r in releases if r.id in applied]
                break
            except StoreError as exc:
                # keep trying: the lease runs out meanwhile and another daemon may rerun
                # the jobs, which at-least-once allows
                logger.warning("release failed: %s", exc, extra={"action": "release_failed"})
                await backoff.sleep()
        for job in jobs:
            self._running.pop(job.id, None)
        self._sizes.done(jobtype)
        self._tenants.ended(JobType.client_of(jobtype))
        self._scheduler.jobs_stopped(jobtype, len(jobs))
        self.finished += len(jobs)
        attempts = {job.id: job.attempts for job in jobs}
        self._queuelog.finished(jobtype, releases, attempts=attempts, run_ms=run_ms)
        self._metrics.finished(jobtype, releases)
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


def _seconds_left(jobs: list[ClaimedJob]) -> float | None:
    """Seconds until the soonest deadline of ``jobs`` (a moment after, so the
    store's check ends the job first), None when none has one."""
    deadlines = [job.deadline for job in jobs if job.deadline is not None]
    if not deadlines:
        return None
    return max(0.0, (min(deadlines) - datetime.now(UTC)).total_seconds()) + DEADLINE_GRACE_S
