"""Running one claimed batch: its handler's version, the runner pool, and the
results turned into releases (``engine.outcomes``) and follow-on jobs (through
the intake), each run's time measured for the batch sizes and the queue log."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence, Set
from datetime import UTC, datetime
from typing import Protocol

from queue_daemon.domain.jobs import ClaimedJob, Release
from queue_daemon.domain.names import JobType
from queue_daemon.domain.outcomes import Policy, no_handler, put_back, release_for
from queue_daemon.engine.admit.followons import FollowOns
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits
from queue_daemon.engine.admit.quotas import Admission
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.run.sizes import BatchSizes
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.runners.output import clip

logger = logging.getLogger(__name__)


class Runners(Protocol):
    """What the worker uses of the runner pool (``queue_daemon.runners.pool.RunnerPool``)."""

    @property
    def busy_remark_s(self) -> float:
        """How long after the last busy tenant busy marks are sent again."""

    async def run_batch(
        self,
        spec: HandlerSpec,
        jobs: Sequence[JobInput],
        sink: ResultSink | None = None,
        *,
        start_by: float | None = None,
    ) -> list[JobResult]: ...

    def warm(self) -> set[str]: ...

    def retire(self, client: str, type: str) -> None: ...

    async def mark_busy(self, clients: Set[str]) -> None: ...


class BatchRunner:
    def __init__(
        self,
        *,
        pool: Runners,
        handlers: HandlerCache,
        intake: Intake,
        admission: Admission | None,
        limits: Limits,
        ensure_uid: Callable[[str], Awaitable[None]] | None = None,
        queuelog: QueueLog,
        metrics: Metrics,
        sizes: BatchSizes,
        job_ttl: float,
    ) -> None:
        self._pool = pool
        self._handlers = handlers
        self._intake = intake
        self._admission = admission
        self._ensure_uid = ensure_uid  # gives a client its uid slot before its first run
        self._limits = limits
        self._queuelog = queuelog
        self._metrics = metrics
        self._sizes = sizes
        self._job_ttl = job_ttl

    async def releases(
        self,
        jobtype: str,
        jobs: list[ClaimedJob],
        run_ms: dict[str, float],
        *,
        start_by: float | None = None,
    ) -> list[Release]:
        """The releases of a claimed batch: as the runs ended, or every job put back
        when the batch failed or is cancelled (shutdown: another daemon runs them),
        or could not start by ``start_by`` (``time.monotonic()``: the claim's lease
        may have run out, and another daemon may be running the jobs)."""
        try:
            # the version live when the jobs were claimed, which this daemon
            # may not have heard of yet (replaced or deleted meanwhile)
            spec = await self._handlers.at_least(jobtype, jobs[0].handler)
            if spec is None:  # deleted between the check and the claim
                policy = Policy(job_ttl=self._job_ttl)
                return [no_handler(job, policy) for job in jobs]
            return await self.run(spec, jobs, run_ms, start_by=start_by)
        except Exception:  # not a cancellation: the worker puts those jobs back itself
            logger.exception("batch of %s failed", jobtype, extra={"action": "batch_failed"})
            return [put_back(job) for job in jobs]

    async def run(
        self,
        spec: HandlerSpec,
        jobs: list[ClaimedJob],
        run_ms: dict[str, float],
        *,
        start_by: float | None = None,
    ) -> list[Release]:
        """The releases of a batch's runs; ``run_ms`` gets each run's time (measured
        by the runner, else the batch's time shared out)."""
        inputs = [JobInput(id=job.id, payload=job.data, attempt=job.attempts) for job in jobs]
        if self._ensure_uid is not None:
            await self._ensure_uid(spec.client)
        limits = self._limits.of(spec.client)
        follow = FollowOns(
            spec, limits, self._admission, self._write, self._metrics.follow_ons_dropped
        )
        began = time.monotonic()
        results = await self._pool.run_batch(spec, inputs, follow, start_by=start_by)
        elapsed = time.monotonic() - began
        self._sizes.timed(jobs[0].type, elapsed, len(jobs))
        share = elapsed * 1000 / len(jobs)
        by_id: dict[str, JobResult] = {}
        for ran in results:
            if ran.ran:
                run_ms[ran.id] = share if ran.run_ms is None else ran.run_ms
            by_id[ran.id] = ran if follow.took(ran.id) else await follow.take(ran)
        self._metrics.ran(spec.lang, elapsed)
        policy = Policy(max_attempts=spec.max_attempts, job_ttl=self._job_ttl)
        now = datetime.now(UTC)
        releases: list[Release] = []
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
        if not await follow.flush():
            # follow-on jobs could not be made durable: run the jobs again later
            releases = [put_back(job) for job in jobs]
        return releases

    async def _write(self, jobtype: JobType, payloads: list[str]) -> None:
        now_ms = time.time_ns() // 1_000_000
        await self._intake.add(jobtype, payloads, create_ms=now_ms, dt_ms=now_ms)
