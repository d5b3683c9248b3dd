"""Ending the jobs whose deadline passed (failed, 408), and resolving the
dependencies that a crash left unresolved."""

from __future__ import annotations

from dataclasses import dataclass

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.domain.names import JobType
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.store.ports import JobQueue

# how often; the run loop stops a batch a moment after its soonest deadline
# (engine.run.batch.DEADLINE_GRACE_S), after this check has ended that job
CHECK_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlineSettings:
    every: float = CHECK_S


class Deadlines:
    name = "deadlines"

    def __init__(
        self, *, store: JobQueue, queuelog: QueueLog, metrics: Metrics, settings: DeadlineSettings
    ) -> None:
        self._store = store
        self._queuelog = queuelog
        self._metrics = metrics
        self.every = self.first = settings.every

    async def step(self) -> None:
        ended = await self._store.expire_deadlines()
        if ended:
            self._queuelog.deadline(ended)
            by_type: dict[str, list[Release]] = {}
            for job_id, jobtype, _ in ended:
                by_type.setdefault(jobtype, []).append(
                    Release(id=job_id, how=ReleaseHow.ARCHIVE, code="failed", exitcode=408)
                )
            for jobtype, releases in by_type.items():
                self._queuelog.finished(jobtype, releases)
                self._metrics.finished(jobtype, releases)
                self._metrics.graph(JobType.parse(jobtype).client, "deadline", len(releases))
        await self._store.resolve_pending()
