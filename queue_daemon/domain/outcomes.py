"""What happens to a job after a run: the exit-code classes of docs/api.md as store releases.

Pure functions, so the retry policy is unit-tested without processes or SQL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime

from queue_daemon.domain.jobs import Attempt, Release, ReleaseHow

RETRY_BASE_S = 1.0  # first retry after about a second
RETRY_CAP_S = 300.0  # never wait more than five minutes between runs
_RNG = random.Random()


def code_of(exitcode: int) -> str:
    """retry (1xx), ok (2xx), failed (4xx), error (5xx and anything else)."""
    klass = exitcode // 100
    if klass == 1:
        return "retry"
    if klass == 2:
        return "ok"
    if klass == 4:
        return "failed"
    return "error"


def retry_delay(attempts: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: ~1 s, 2 s, 4 s … capped at five minutes."""
    base = min(RETRY_CAP_S, RETRY_BASE_S * 2.0 ** min(30, max(0, attempts - 1)))
    jitter = (rng or _RNG).uniform(0.75, 1.25)
    return min(RETRY_CAP_S, base * jitter)


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    job_ttl: float  # seconds from creation after which retries stop (--job-ttl)
    max_attempts: int = 5


def release_for(
    job: Attempt,
    exitcode: int,
    result: str | None,
    policy: Policy,
    *,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> Release:
    """The release of one finished run."""
    code = code_of(exitcode)
    if code in ("ok", "failed"):
        return Release(
            id=job.id, how=ReleaseHow.ARCHIVE, code=code, exitcode=exitcode, result=result
        )
    age = ((now or datetime.now(UTC)) - job.create_dt).total_seconds()
    delay = retry_delay(job.attempts, rng)
    if job.attempts >= policy.max_attempts or age + delay > policy.job_ttl:
        return Release(
            id=job.id, how=ReleaseHow.ARCHIVE, code=code, exitcode=exitcode, result=result
        )
    return Release(
        id=job.id, how=ReleaseHow.RETRY, code=code, exitcode=exitcode, result=result, delay=delay
    )


def put_back(job: Attempt) -> Release:
    """The job did not run (shutdown, its context died before it): eligible at once, no attempt."""
    return Release(id=job.id, how=ReleaseHow.UNGET, refund_attempt=True)


def no_handler(job: Attempt, policy: Policy, *, now: datetime | None = None) -> Release:
    """A job whose type has no handler waits, without using attempts, until a
    handler is added or its time runs out (then it is done with 503)."""
    age = ((now or datetime.now(UTC)) - job.create_dt).total_seconds()
    if age > policy.job_ttl:
        return Release(
            id=job.id,
            how=ReleaseHow.ARCHIVE,
            code="error",
            exitcode=503,
            result="no handler for this type before the job's time ran out",
        )
    return Release(id=job.id, how=ReleaseHow.UNGET, refund_attempt=True)
