"""Running one claimed batch: its handler's version, the runner pool, and the
results turned into releases (``engine.outcomes``) and follow-on jobs (through
the intake), each run's time measured for the batch sizes and the queue log."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence, Set
from datetime import UTC, datetime
from typing import Protocol

from journal import JournalError
from queue_daemon.engine.batching import BatchSizes
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.intake import Intake
from queue_daemon.engine.limits import Limits, TenantLimits
from queue_daemon.engine.outcomes import Policy, code_of, no_handler, put_back, release_for
from queue_daemon.names import JobType
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from runners.models import HandlerSpec, JobInput, JobResult
from runners.output import clip, emit_problem
from store.models import ClaimedJob, Release

logger = logging.getLogger(__name__)


class Runners(Protocol):
    """What the worker uses of the runner pool (``runners.pool.RunnerPool``)."""

    @property
    def busy_remark_s(self) -> float:
        """How long after the last busy tenant busy marks are sent again."""

    async def run_batch(self, spec: HandlerSpec, jobs: Sequence[JobInput]) -> list[JobResult]: ...

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
        limits: Limits,
        queuelog: QueueLog,
        metrics: Metrics,
        sizes: BatchSizes,
        job_ttl: float,
    ) -> None:
        self._pool = pool
        self._handlers = handlers
        self._intake = intake
        self._limits = limits
        self._queuelog = queuelog
        self._metrics = metrics
        self._sizes = sizes
        self._job_ttl = job_ttl

    async def releases(
        self, jobtype: str, jobs: list[ClaimedJob], run_ms: dict[str, float]
    ) -> list[Release]:
        """The releases of a claimed batch: as the runs ended, or every job put back
        when the batch failed or is cancelled (shutdown: another daemon runs them)."""
        try:
            # the version live when the jobs were claimed, which this daemon
            # may not have heard of yet (replaced or deleted meanwhile)
            spec = await self._handlers.at_least(jobtype, jobs[0].handler)
            if spec is None:  # deleted between the check and the claim
                policy = Policy(job_ttl=self._job_ttl)
                return [no_handler(job, policy) for job in jobs]
            return await self.run(spec, jobs, run_ms)
        except Exception:  # not a cancellation: the worker puts those jobs back itself
            logger.exception("batch of %s failed", jobtype, extra={"action": "batch_failed"})
            return [put_back(job) for job in jobs]

    async def run(
        self, spec: HandlerSpec, jobs: list[ClaimedJob], run_ms: dict[str, float]
    ) -> list[Release]:
        """The releases of a batch's runs; ``run_ms`` gets each run's time (measured
        by the runner, else the batch's time shared out)."""
        inputs = [JobInput(id=job.id, payload=job.data, attempt=job.attempts) for job in jobs]
        began = time.monotonic()
        results = await self._pool.run_batch(spec, inputs)
        elapsed = time.monotonic() - began
        self._sizes.timed(jobs[0].type, elapsed, len(jobs))
        share = elapsed * 1000 / len(jobs)
        for ran in results:
            if ran.ran:
                run_ms[ran.id] = share if ran.run_ms is None else ran.run_ms
        self._metrics.ran(spec.lang, elapsed)
        by_id = {result.id: result for result in results}
        policy = Policy(max_attempts=spec.max_attempts, job_ttl=self._job_ttl)
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
