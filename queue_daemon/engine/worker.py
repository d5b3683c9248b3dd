"""The daemon loop that runs jobs: claim by the scheduler's pick, run in the
runner pool, release with outcomes; renew leases, expire others' stale locks,
purge old archived jobs.

Backpressure: a claim never takes more jobs than the scheduler has free
slots, so everything this daemon locks is running or about to run.

Isolation: the scheduler shares slots fairly, but a batch also holds a runner
context, and those are fewer (``max_parallel_batches``). One tenant may hold
at most all but ``RESERVED_BATCHES_SHARE`` of them, so a flood of slow jobs
cannot take every context: another tenant's job still gets one at once (and
keeps its warm context instead of a cold start per job).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from journal import JournalError
from queue_daemon.engine.backoff import Backoff
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.intake import Intake
from queue_daemon.engine.limits import Limits, TenantLimits
from queue_daemon.engine.outcomes import Policy, code_of, no_handler, put_back, release_for
from queue_daemon.names import JobType
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from runners.models import HandlerSpec, JobInput, JobResult
from runners.output import clip, emit_problem
from runners.pool import RunnerPool
from scheduler import Pick, Scheduler, busy_tenants, tenant_of
from store.errors import StoreError
from store.models import ClaimedJob, Release, ReleaseHow
from store.ports import JobQueue

logger = logging.getLogger(__name__)

POLL_S = 1.0  # re-read the waiting jobtypes at least this often (delayed jobs come due)
RETRY_FIRST_S = 0.05  # a failed claim or release is tried again after this, doubling
RETRY_MAX_S = 5.0
LISTEN_RETRY_FIRST_S = 0.1  # reconnecting the store's listener, doubling
LISTEN_RETRY_MAX_S = 5.0
# A batch runs its jobs one after another in one context: aim for batches that
# take about this long, so fast handlers get big batches (few round trips) and
# slow ones small batches (jobs spread over many contexts, short waits).
BATCH_TARGET_S = 0.1
FIRST_BATCH = 1  # jobs of a type whose run time is not known yet
LEARNING_BATCHES = 4  # such batches running at once, each in its own context
# A type without a handler is not claimed (its jobs wait); every so often its
# oldest jobs are checked so that those whose time ran out are archived.
NO_HANDLER_RECHECK_S = 30.0
# Claim loops running at once, never two claims of one jobtype: two claims of
# one type cost PostgreSQL about 40% more CPU per job (their SKIP LOCKED scans
# step over each other's rows). The second loop lets another tenant's job be
# claimed while a claim of a flooding tenant's type is in flight.
CLAIM_LOOPS = 2
# Share of the parallel batches (runner contexts) no single tenant may take.
RESERVED_BATCHES_SHARE = 8  # 1/8: 8 of the default 64
# How often the tenants running more contexts than their share of the cores are
# found and their handlers put behind the others' on the CPU (runners.sandbox.cpushare).
BUSY_CHECK_S = 0.25


def _add_counts(into: dict[str, int], counts: dict[str, int]) -> None:
    for jobtype, n in counts.items():
        into[jobtype] = into.get(jobtype, 0) + n


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    concurrency: int = 1024
    tenant_cap: int | None = None
    max_batch: int = 200
    max_parallel_batches: int = 64  # at most one per runner context
    lease: float = 60.0
    job_ttl: float = 86_400.0
    retention: float = 7 * 86_400.0
    purge_interval: float = 600.0
    payload_limit: int = 1 << 20


class Worker:
    def __init__(
        self,
        *,
        store: JobQueue,
        intake: Intake,
        pool: RunnerPool,
        handlers: HandlerCache,
        queuelog: QueueLog,
        sysid: str,
        settings: WorkerSettings,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._store = store
        self._intake = intake
        self._pool = pool
        self._handlers = handlers
        self._queuelog = queuelog
        self._sysid = sysid
        self._settings = settings
        self._metrics = metrics or Metrics()
        self._scheduler = Scheduler(
            concurrency=settings.concurrency,
            tenant_cap=settings.tenant_cap,
            max_batch=settings.max_batch,
        )
        # per-tenant limits: running caps go to the scheduler, the rest apply here
        self._limits = limits or Limits(
            TenantLimits(running=settings.tenant_cap or 0, payload=settings.payload_limit)
        )
        self._limits.on_change(self._limits_changed)
        self._running: dict[str, ClaimedJob] = {}
        self._batches: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._waiting: dict[str, int] = {}
        self._waiting_fresh = False
        self._waiting_at = 0.0
        self._reading: asyncio.Task[None] | None = None  # a read of the waiting types
        self._added_while_reading: dict[str, int] = {}
        self._job_seconds: dict[str, float] = {}  # moving average of a job's run time, per type
        self._learning: dict[str, int] = {}  # types still learning -> batches running
        self._no_handler: dict[str, float] = {}  # types without a handler -> when last checked
        self._claiming = 0  # claims in flight
        self._claiming_types: set[str] = set()  # their jobtypes
        self._tenant_batches: dict[str, int] = {}  # tenant -> batches claiming or running
        self._tenant_peak: dict[str, int] = {}  # ... the most at once since the last busy check
        self._busy: frozenset[str] = frozenset()  # tenants whose handlers yield on a wake-up
        self._busy_seen = -pool.busy_remark_s  # time.monotonic() when a tenant was last busy
        affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
        self._cores = len(affinity(0)) if affinity else os.cpu_count() or 1
        parallel = settings.max_parallel_batches
        self._tenant_batch_cap = max(1, parallel - max(1, parallel // RESERVED_BATCHES_SHARE))
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
        if added is None:
            self._waiting_fresh = False
        else:
            _add_counts(self._waiting, added)
            if self._reading is not None:  # the read may have missed them
                _add_counts(self._added_while_reading, added)
        self._wake.set()

    def on_handler(self, jobtype: str) -> None:
        self._handlers.invalidate(jobtype)
        self._no_handler.pop(jobtype, None)
        parsed = JobType.parse(jobtype)
        self._pool.retire(parsed.client, parsed.name)
        self._wake.set()

    @property
    def running(self) -> int:
        return len(self._running)

    async def run(self) -> None:
        """Every loop of the worker, until cancelled."""
        async with asyncio.TaskGroup() as group:
            retry = Backoff(LISTEN_RETRY_FIRST_S, LISTEN_RETRY_MAX_S)
            group.create_task(self._store.listen(self.on_jobs, self.on_handler, retry=retry))
            for _ in range(CLAIM_LOOPS):
                group.create_task(self._claim_loop())
            group.create_task(self._every(self._settings.lease / 3, self._renew))
            group.create_task(self._every(min(5.0, self._settings.lease / 4), self._expire))
            group.create_task(self._every(self._settings.purge_interval, self._purge))
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

    async def _every(self, interval: float, step: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await step()
            except StoreError as exc:
                logger.warning("%s failed: %s", step.__name__, exc, extra={"action": "worker_step"})

    async def _mark_busy(self) -> None:
        """Tell the runners which tenants ran more contexts at once than their share
        of the cores since the last check (``scheduler.busy_tenants``); again at every
        check while any is and for ``RunnerPool.busy_remark_s`` after, so processes the daemon's
        place started since run real-time too, and it stops when its hold ends."""
        peak, self._tenant_peak = self._tenant_peak, dict(self._tenant_batches)
        busy = busy_tenants(peak, self._cores)
        now = time.monotonic()
        if busy:
            self._busy_seen = now
        if busy != self._busy or now - self._busy_seen < self._pool.busy_remark_s:
            self._busy = busy
            await self._pool.mark_busy(busy)

    async def _renew(self) -> None:
        if self._running:
            ids = list(self._running)
            await self._store.renew(ids, sysid=self._sysid, lease=self._settings.lease)

    async def _expire(self) -> None:
        expired = await self._store.expire_locks()
        if expired:
            self._queuelog.expired(expired)
            self.on_jobs()

    async def _purge(self) -> None:
        purged = await self._store.purge(self._settings.retention)
        if purged:
            self._queuelog.purged(purged)

    async def _waiting_jobtypes(self) -> dict[str, int]:
        """What waits per jobtype: read from the store when stale (one read at a
        time, shared by the claim loops), kept up to date by notifications."""
        if not self._waiting_fresh or time.monotonic() - self._waiting_at > POLL_S:
            if self._reading is None:
                self._reading = asyncio.create_task(self._read_waiting())
            reading = self._reading
            try:
                await asyncio.shield(reading)
            finally:
                if reading.done() and self._reading is reading:
                    self._reading = None
        return self._waiting

    async def _read_waiting(self) -> None:
        # fresh from the moment the read begins: a "something changed" note
        # arriving during the read makes it stale again, and jobs noted during
        # the read are added to what it returns (it may not see them)
        self._waiting_fresh = True
        self._waiting_at = time.monotonic()
        self._added_while_reading = {}
        try:
            waiting = await self._store.waiting_jobtypes()
        except BaseException:
            self._waiting_fresh = False
            raise
        _add_counts(waiting, self._added_while_reading)
        self._added_while_reading = {}
        self._waiting = waiting

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
        waiting = await self._waiting_jobtypes()
        if self._no_handler:
            cutoff = time.monotonic() - NO_HANDLER_RECHECK_S
            waiting = {t: n for t, n in waiting.items() if self._no_handler.get(t, 0) < cutoff}
        full = {t for t, n in self._tenant_batches.items() if n >= self._tenant_batch_cap}
        if full or self._claiming_types or self._learning:
            # a full tenant's other jobs wait for one of its own batches to end; a
            # type being claimed waits for that claim; a type still learning how
            # long its jobs take runs a few batches at a time
            learning = self._learning
            busy = self._claiming_types
            waiting = {
                t: n
                for t, n in waiting.items()
                if t not in busy
                and learning.get(t, 0) < LEARNING_BATCHES
                and tenant_of(t) not in full
            }
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
        if await self._handlers.get(jobtype) is None:
            # not claimed: its jobs wait (state waiting) until a handler comes
            self._no_handler[jobtype] = time.monotonic()
            await self._expire_unhandled(jobtype)
            return True
        limit = min(pick.limit, self._batch_size(jobtype))
        # hold the slots while the claim is in flight, so the other claim loop
        # cannot hand them out too (backpressure stays exact)
        self._scheduler.jobs_started(jobtype, limit)
        self._claiming += 1
        tenant = tenant_of(jobtype)
        batches = self._tenant_batches[tenant] = self._tenant_batches.get(tenant, 0) + 1
        if batches > self._tenant_peak.get(tenant, 0):
            self._tenant_peak[tenant] = batches
        jobs: list[ClaimedJob] = []
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
                    self._unlearn(jobtype)
                    self._batch_ended(tenant)
        left = self._waiting.get(jobtype, 0) - len(jobs)
        if len(jobs) < limit or left <= 0:
            # taken (by us or others), or the capped count ran out: ask the store again
            self._waiting.pop(jobtype, None)
            self._waiting_fresh = False
        else:
            self._waiting[jobtype] = left
        if not jobs:
            return True
        for job in jobs:
            self._running[job.id] = job
        self.started += len(jobs)
        self._queuelog.started(jobtype, jobs)
        task = asyncio.create_task(self._run_batch(jobtype, jobs))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)
        return True

    async def _run_batch(self, jobtype: str, jobs: list[ClaimedJob]) -> None:
        releases: list[Release] = []
        run_ms: dict[str, float] = {}
        try:
            # the version live when the jobs were claimed, which this daemon
            # may not have heard of yet (replaced or deleted meanwhile)
            spec = await self._handlers.at_least(jobtype, jobs[0].handler)
            if spec is None:  # deleted between the check and the claim
                policy = Policy(job_ttl=self._settings.job_ttl)
                releases = [no_handler(job, policy) for job in jobs]
            else:
                releases = await self._run(spec, jobs, run_ms)
        except asyncio.CancelledError:
            releases = [put_back(job) for job in jobs]  # shutdown: another daemon runs them
            raise
        except Exception:
            logger.exception("batch of %s failed", jobtype, extra={"action": "batch_failed"})
            releases = [put_back(job) for job in jobs]
        finally:
            await asyncio.shield(self._finish(jobtype, jobs, releases, run_ms))

    async def _expire_unhandled(self, jobtype: str) -> None:
        """Archive the jobs of a type without a handler whose time ran out."""
        ids = await self._store.expire_waiting(
            jobtype,
            self._settings.job_ttl,
            "no handler for this type before the job's time ran out",
        )
        if ids:
            releases = [
                Release(id=i, how=ReleaseHow.ARCHIVE, code="error", exitcode=503) for i in ids
            ]
            self._queuelog.finished(jobtype, releases)
            self._metrics.finished(jobtype, releases)

    def _batch_size(self, jobtype: str) -> int:
        per_job = self._job_seconds.get(jobtype)
        if per_job is None:
            self._learning[jobtype] = self._learning.get(jobtype, 0) + 1
            return FIRST_BATCH  # learn how long this type's jobs take
        return max(1, min(self._settings.max_batch, int(BATCH_TARGET_S / max(per_job, 1e-6))))

    def _unlearn(self, jobtype: str) -> None:
        left = self._learning.get(jobtype, 0) - 1
        if left > 0:
            self._learning[jobtype] = left
        else:
            self._learning.pop(jobtype, None)

    def _batch_ended(self, tenant: str) -> None:
        left = self._tenant_batches.get(tenant, 0) - 1
        if left > 0:
            self._tenant_batches[tenant] = left
        else:
            self._tenant_batches.pop(tenant, None)

    def _timed(self, jobtype: str, seconds: float, count: int) -> None:
        per_job = seconds / count
        old = self._job_seconds.get(jobtype)
        self._job_seconds[jobtype] = per_job if old is None else 0.5 * (old + per_job)

    async def _run(
        self, spec: HandlerSpec, jobs: list[ClaimedJob], run_ms: dict[str, float]
    ) -> list[Release]:
        """The releases of a batch's runs; ``run_ms`` gets each run's time (measured
        by the runner, else the batch's time shared out)."""
        inputs = [JobInput(id=job.id, payload=job.data, attempt=job.attempts) for job in jobs]
        began = time.monotonic()
        results = await self._pool.run_batch(spec, inputs)
        elapsed = time.monotonic() - began
        self._timed(jobs[0].type, elapsed, len(jobs))
        share = elapsed * 1000 / len(jobs)
        for ran in results:
            if ran.ran:
                run_ms[ran.id] = share if ran.run_ms is None else ran.run_ms
        self._metrics.ran(spec.lang, elapsed)
        by_id = {result.id: result for result in results}
        policy = Policy(max_attempts=spec.max_attempts, job_ttl=self._settings.job_ttl)
        now = datetime.now(UTC)
        releases: list[Release] = []
        follow: dict[str, list[str]] = defaultdict(list)
        limits = self._limits.of(spec.client)
        for job in jobs:
            result = by_id.get(job.id)
            if result is None or not result.ran:
                releases.append(put_back(job))
                continue
            text = result.result
            if text is not None:
                text = clip(text, limits.result)
            releases.append(release_for(job, result.exitcode, text, policy, now=now))
            if result.log:
                self._queuelog.log(job.type, job.id, result.log)
            self._follow_ons(spec, job, result, follow, limits)
        if follow and not await self._write_follow_ons(spec.client, follow):
            # follow-on jobs could not be made durable: run the jobs again later
            releases = [put_back(job) for job in jobs]
        return releases

    def _follow_ons(
        self,
        spec: HandlerSpec,
        job: ClaimedJob,
        result: JobResult,
        follow: dict[str, list[str]],
        limits: TenantLimits,
    ) -> None:
        limit = limits.payload
        dropped = list(result.dropped)
        for name, payload in result.emits:
            # the runner checked these already; the journal's framing depends on it
            problem = emit_problem(name, payload, limit)
            if problem is None:
                follow[name].append(payload)
            else:
                dropped.append(problem)
        if spec.then and code_of(result.exitcode) == "ok":
            payload = (result.result or "").replace("\n", " ").replace("\x00", "")
            # an empty result still chains (``then`` as a trigger), as it always did
            problem = emit_problem(spec.then, payload, limit) if payload else None
            if problem is None:
                follow[spec.then].append(payload)
            else:
                dropped.append(f"then {spec.then}: {problem}")
        if dropped:
            logger.warning(
                "dropped %d follow-on job(s) of job %s: %s",
                len(dropped),
                job.id,
                "; ".join(dropped[:3]) + ("; …" if len(dropped) > 3 else ""),
                extra={
                    "action": "emit_dropped",
                    "tenant": spec.client,
                    "job_id": job.id,
                    "dropped": len(dropped),
                },
            )

    async def _write_follow_ons(self, client: str, follow: dict[str, list[str]]) -> bool:
        now_ms = time.time_ns() // 1_000_000
        try:
            for name, payloads in follow.items():
                await self._intake.add(
                    JobType(client, name), payloads, create_ms=now_ms, dt_ms=now_ms
                )
        except (JournalError, ValueError) as exc:
            logger.error("follow-on jobs not written: %s", exc, extra={"action": "emit_failed"})
            return False
        return True

    async def _finish(
        self,
        jobtype: str,
        jobs: list[ClaimedJob],
        releases: list[Release],
        run_ms: dict[str, float],
    ) -> None:
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while releases:
            try:
                await self._store.release(releases, sysid=self._sysid)
                break
            except StoreError as exc:
                # keep trying: the lease runs out meanwhile and another daemon may rerun
                # the jobs, which at-least-once allows
                logger.warning("release failed: %s", exc, extra={"action": "release_failed"})
                await backoff.sleep()
        for job in jobs:
            self._running.pop(job.id, None)
        self._unlearn(jobtype)
        self._batch_ended(tenant_of(jobtype))
        self._scheduler.jobs_stopped(jobtype, len(jobs))
        self.finished += len(jobs)
        self._queuelog.finished(
            jobtype, releases, attempts={job.id: job.attempts for job in jobs}, run_ms=run_ms
        )
        self._metrics.finished(jobtype, releases)
        self._wake.set()
