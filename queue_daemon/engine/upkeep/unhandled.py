"""The sweep of the types no daemon runs: their jobs wait for a handler (or,
for a pulled type, for a worker's claim) until their time runs out, then end
(error, 503)."""

from __future__ import annotations

from dataclasses import dataclass

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.settings import DEFAULTS
from queue_daemon.store.ports import JobQueue

NO_HANDLER_RESULT = "no handler for this type before the job's time ran out"
NO_WORKER_RESULT = "no worker claimed this job before its time ran out"


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSettings:
    """The types are swept a slice at a time: 5,000 waiting types a round (about
    20 ms of the store's time), a round every 5 s: 100,000 idle types are all
    looked at every 100 s, at a steady cost instead of in one burst."""

    job_ttl: float = DEFAULTS.job_ttl  # seconds from a job's creation to the end of its time
    round_s: float = 5.0
    steps: int = 5_000  # waiting types a round

    @property
    def every(self) -> float:
        """A few seconds, or a quarter of the jobs' time when that is shorter."""
        return max(1.0, min(self.round_s, self.job_ttl / 4))


class SweepUnhandled:
    name = "sweep-unhandled"
    first = 1.0

    def __init__(
        self, *, store: JobQueue, queuelog: QueueLog, metrics: Metrics, settings: SweepSettings
    ) -> None:
        self._store = store
        self._queuelog = queuelog
        self._metrics = metrics
        self._job_ttl = settings.job_ttl
        self._steps = settings.steps
        self.every = settings.every
        self._after = ""  # where the next round goes on

    async def step(self) -> None:
        """A round: archive the jobs whose time ran out in the next slice of the
        types no daemon runs (one daemon at a time; a round another daemon is
        doing is skipped)."""
        swept = await self._store.unhandled_types(
            self._job_ttl, after=self._after, steps=self._steps
        )
        if swept is None:
            return
        self._after = swept.next_after or ""
        for jobtype, pulled in swept.expired:
            await self._expire(jobtype, pulled=pulled)

    async def _expire(self, jobtype: str, *, pulled: bool) -> None:
        result = NO_WORKER_RESULT if pulled else NO_HANDLER_RESULT
        ids = await self._store.expire_waiting(jobtype, self._job_ttl, result)
        if ids:
            releases = [
                Release(id=i, how=ReleaseHow.ARCHIVE, code="error", exitcode=503) for i in ids
            ]
            self._queuelog.finished(jobtype, releases)
            self._metrics.finished(jobtype, releases)
