"""Running one claimed batch: its handler's version, the runner pool, and the
results turned into releases and follow-on jobs (``engine.releases``), each
run's time measured for the batch sizes and the queue log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence, Set
from datetime import UTC, datetime
from typing import Protocol

from queue_daemon.domain.jobs import ClaimedJob, Release
from queue_daemon.domain.outcomes import put_back
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.progress import ProgressBoard
from queue_daemon.engine.releases import Releases
from queue_daemon.engine.run.sizes import BatchSizes, ran_seconds
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult, ResultSink

logger = logging.getLogger(__name__)

# a batch is stopped this long after its soonest deadline: after the upkeep's
# check (every engine.upkeep.deadlines.CHECK_S, 1 s) has ended that job (with its
# run), so its outcome is refused, not put back
DEADLINE_GRACE_S = 1.5

PROGRESS_WAIT_S = 2.0  # the longest a release waits for its batch's progress to be written

# gives a client its uid slot before its first run (``api.auth.TokenCache``)
EnsureUid = Callable[[str], Awaitable[None]]


class Runners(Protocol):
    """What the run loop uses of the runner pool (``queue_daemon.runners.pool.RunnerPool``)."""

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
    """Runs claimed batches in the runner pool and decides their releases."""

    def __init__(
        self,
        *,
        pool: Runners,
        handlers: HandlerCache,
        releases: Releases,
        ensure_uid: EnsureUid,
        queuelog: QueueLog,
        metrics: Metrics,
        sizes: BatchSizes,
        progress: ProgressBoard | None = None,
    ) -> None:
        self._progress = progress
        self._pool = pool
        self._handlers = handlers
        self._releases = releases
        self._ensure_uid = ensure_uid
        self._queuelog = queuelog
        self._metrics = metrics
        self._sizes = sizes

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
                return self._releases.no_handler(jobs)
            return await self.run(spec, jobs, run_ms, start_by=start_by)
        except Exception:  # not a cancellation: the run loop puts those jobs back itself
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
        inputs = [
            JobInput(id=job.id, payload=job.data, attempt=job.attempts, traceparent=job.trace)
            for job in jobs
        ]
        await self._ensure_uid(spec.client)
        batch = self._releases.of(spec)
        try:
            began = time.monotonic()
            results = await self._pool.run_batch(spec, inputs, batch.follow, start_by=start_by)
            elapsed = time.monotonic() - began
            self._sizes.timed(
                jobs[0].type,
                ran_seconds([r.run_ms for r in results], elapsed),
                len(jobs),
                sum(len(j.data) for j in jobs),
            )
            share = elapsed * 1000 / len(jobs)
            by_id: dict[str, JobResult] = {}
            took, wants = batch.follow.took, batch.follow.wants
            for ran in results:
                if ran.progress is not None and self._progress is not None:
                    self._progress.ran(ran.id, *ran.progress)  # its last P: line
                if ran.ran:
                    run_ms[ran.id] = share if ran.run_ms is None else ran.run_ms
                # taken as they arrived, or nothing to take (most results): no
                # coroutine for those
                by_id[ran.id] = ran if took(ran.id) or not wants(ran) else await batch.take(ran)
            self._metrics.ran(spec.lang, elapsed)
            now = datetime.now(UTC)
            releases: list[Release] = []
            for job in jobs:
                result = by_id.get(job.id)
                releases.append(batch.release(job, result, now=now))
                if result is not None and result.ran and result.log:
                    self._queuelog.log(job.type, job.id, result.log)
            flushed = await batch.flush()
        except BaseException:
            # cancelled (a deadline, a drain) or failed before the flush: its
            # follow-on jobs will never be journaled
            batch.abandon()
            raise
        if not flushed:
            # follow-on jobs could not be made durable: run the jobs again later
            releases = [put_back(job) for job in jobs]
        return releases

    async def flush_progress(self, ids: Collection[str]) -> None:
        """The batch's last progress reports, written before its release (so the
        done jobs keep them), within PROGRESS_WAIT_S: advice never holds a
        release up for long."""
        board = self._progress
        if board is not None and board.pending(ids):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PROGRESS_WAIT_S):
                    await board.flush(ids)


def seconds_left(jobs: list[ClaimedJob]) -> float | None:
    """Seconds a batch of ``jobs`` may run: until the soonest deadline (a moment
    after, so the store's check ends that job first), None when none has one."""
    deadlines = [job.deadline for job in jobs if job.deadline is not None]
    if not deadlines:
        return None
    return max(0.0, (min(deadlines) - datetime.now(UTC)).total_seconds()) + DEADLINE_GRACE_S
