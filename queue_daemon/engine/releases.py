"""Results to releases: the one step that turns runs' results into the store's
releases, for the run loop's batches and the pull workers' completes alike.

Each run's outcome is ``domain.outcomes.release_for`` (the exit-code class, the
handler's ``maxAttempts``, the job's time, backoff) with its result clipped to
its tenant's limit; its follow-on jobs go through ``engine.admit.followons``
(the tenant's limits, then ``engine.admit.adds``: the add rate and waiting
limit, the intake). A batch
whose follow-on jobs could not be made durable is never released as run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from queue_daemon.domain.jobs import Attempt, Release
from queue_daemon.domain.outcomes import Policy, no_handler, put_back, release_for
from queue_daemon.engine.admit.adds import Adds
from queue_daemon.engine.admit.followons import FollowOns
from queue_daemon.engine.admit.limits import Limits
from queue_daemon.observe.metrics import Metrics
from queue_daemon.runners.models import HandlerSpec, JobResult
from queue_daemon.runners.output import clip


class Releases:
    """Builds each batch's ``BatchReleases``; follow-on jobs go through ``adds``."""

    def __init__(
        self,
        *,
        adds: Adds,
        limits: Limits,
        metrics: Metrics,
        job_ttl: float,
        progress: Callable[[str, object, object], None] | None = None,
    ) -> None:
        self._adds = adds
        self._limits = limits
        self._metrics = metrics
        self._job_ttl = job_ttl
        self._progress = progress  # a running job's report (engine.progress)

    def of(self, spec: HandlerSpec) -> BatchReleases:
        """The step for one batch of ``spec``'s jobs (one object a batch, none a job)."""
        limits = self._limits.of(spec.client)
        follow = FollowOns(
            spec, limits, self._adds, self._metrics.follow_ons_dropped, self._progress
        )
        policy = Policy(max_attempts=spec.max_attempts, job_ttl=self._job_ttl)
        return BatchReleases(follow, policy, limits.result)

    def result_limit(self, client: str) -> int:
        """The UTF-8 bytes of a result that ``client``'s jobs keep."""
        return self._limits.of(client).result

    def no_handler(self, jobs: Sequence[Attempt], *, now: datetime | None = None) -> list[Release]:
        """The releases of jobs whose type lost its handler before they ran: they
        wait again, unless their time ran out (503)."""
        policy = Policy(job_ttl=self._job_ttl)
        return [no_handler(job, policy, now=now) for job in jobs]


class BatchReleases:
    """One batch's results to releases: ``take`` each result as it arrives (its
    follow-on jobs pending or written), ``release`` each job, then ``flush``."""

    __slots__ = ("_policy", "_result_limit", "follow")

    def __init__(self, follow: FollowOns, policy: Policy, result_limit: int) -> None:
        self.follow = follow  # the runner pool's sink: results taken as they arrive
        self._policy = policy
        self._result_limit = result_limit

    async def take(self, result: JobResult) -> JobResult:
        """``result`` without its follow-on jobs (taken once, however it came)."""
        if self.follow.took(result.id):
            return result
        return await self.follow.take(result)

    def release(self, job: Attempt, result: JobResult | None, *, now: datetime) -> Release:
        """The release of ``job`` after ``result`` (taken); put back, its attempt
        not counted, when it did not run."""
        if result is None or not result.ran:
            return put_back(job)
        text = result.result
        if text is not None:
            text = clip(text, self._result_limit)
        release = release_for(job, result.exitcode, text, self._policy, now=now)
        if result.log and release.code != "ok":  # what a dead letter's page shows
            release.log = log_excerpt(result.log)
        return release

    async def flush(self) -> bool:
        """Journal the pending follow-on jobs; False when any of the batch's could
        not be made durable (then none of its jobs may be released as run)."""
        try:
            return await self.follow.flush()
        finally:
            self.follow.end()

    def abandon(self) -> None:
        """The batch ends without ``flush``: its pending follow-on jobs are dropped."""
        self.follow.abandon()
        self.follow.end()


LOG_EXCERPT_LINES = 20  # a run's last log lines kept with its job (a run not ok)
LOG_EXCERPT_CHARS = 4000  # and at most this many characters of them, the last


def log_excerpt(lines: Sequence[str]) -> str:
    """The last lines of a run's log, as one text (a GET of the job shows it):
    the newest kept, the start of the oldest cut when they are too long."""
    text = "\n".join(lines[-LOG_EXCERPT_LINES:])
    return text[-LOG_EXCERPT_CHARS:]
