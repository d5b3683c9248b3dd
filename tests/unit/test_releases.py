"""Results to releases (``engine.releases``): the one step that the run loop's
batches and the pull workers' completes share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest

from queue_daemon.domain.jobs import ClaimedJob, Release, ReleaseHow, epoch_ms
from queue_daemon.domain.names import JobType
from queue_daemon.domain.pulled import HeldJob
from queue_daemon.engine.admit.adds import Adds, KnownJobs
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits, TenantLimits
from queue_daemon.engine.admit.quotas import RateLimiter, WaitingLimiter
from queue_daemon.engine.releases import Releases
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.runners.models import HandlerSpec, JobResult
from queue_daemon.store.ports import TenantStore
from tests.fakes.intake import RecordingIntake
from tests.fakes.store import FakeStore

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
SPEC = HandlerSpec(version="v1", client="acme", type="t", lang="python", body="...", max_attempts=2)


@pytest.fixture
def intake() -> RecordingIntake:
    return RecordingIntake()


@pytest.fixture
def releases(intake: RecordingIntake, tmp_path: Path) -> Releases:
    store, metrics = FakeStore(), Metrics()
    limits = Limits(TenantLimits(waiting=0, result=8))
    adds = Adds(
        intake=cast(Intake, intake),
        limits=limits,
        rates=RateLimiter(0, 1),
        waiting=WaitingLimiter(cast(TenantStore, store)),
        jobs=cast(KnownJobs, store),
        queuelog=QueueLog(tmp_path / "queue.log"),
        metrics=metrics,
    )
    return Releases(adds=adds, limits=limits, metrics=metrics, job_ttl=3600.0)


def claimed(job_id: str, attempts: int = 1, age: float = 10.0) -> ClaimedJob:
    return ClaimedJob(
        id=job_id,
        type="acme-t",
        data="p",
        attempts=attempts,
        created_ms=epoch_ms(NOW - timedelta(seconds=age)),
    )


async def test_each_outcome_class_and_the_result_clipped_to_the_tenants_limit(
    releases: Releases,
) -> None:
    batch = releases.of(SPEC)
    results = [
        JobResult(id="ok", exitcode=200, result="a long result"),
        JobResult(id="failed", exitcode=404, result="no"),
        JobResult(id="retry", exitcode=500),
        JobResult(id="last", exitcode=500),
    ]
    jobs = [claimed("ok"), claimed("failed"), claimed("retry"), claimed("last", attempts=2)]
    taken = [await batch.take(r) for r in results]
    got = [batch.release(job, r, now=NOW) for job, r in zip(jobs, taken, strict=True)]
    assert await batch.flush()
    assert [(r.how, r.code, r.exitcode) for r in got] == [
        (ReleaseHow.ARCHIVE, "ok", 200),
        (ReleaseHow.ARCHIVE, "failed", 404),
        (ReleaseHow.RETRY, "error", 500),
        (ReleaseHow.ARCHIVE, "error", 500),  # maxAttempts 2 reached
    ]
    assert got[0].result is not None and len(got[0].result.encode()) <= 8
    assert got[2].delay > 0


async def test_a_job_that_did_not_run_is_put_back_its_attempt_not_counted(
    releases: Releases,
) -> None:
    batch = releases.of(SPEC)
    unrun = await batch.take(JobResult(id="a", exitcode=0, ran=False))
    assert [
        batch.release(claimed("a"), unrun, now=NOW),
        batch.release(claimed("b"), None, now=NOW),
    ] == [
        Release(id="a", how=ReleaseHow.UNGET, refund_attempt=True),
        Release(id="b", how=ReleaseHow.UNGET, refund_attempt=True),
    ]


async def test_a_pulled_job_is_released_as_held_without_a_claimed_job(releases: Releases) -> None:
    held = HeldJob(id="h", type="acme-t", attempts=1, create_dt=NOW - timedelta(seconds=5))
    batch = releases.of(SPEC)
    ran = await batch.take(JobResult(id="h", exitcode=200, result="done"))
    assert batch.release(held, ran, now=NOW) == Release(
        id="h", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="done"
    )


async def test_follow_on_jobs_go_through_the_adds_once_each(
    releases: Releases, intake: RecordingIntake
) -> None:
    batch = releases.of(SPEC)
    result = JobResult(id="a", exitcode=200, emits=[("next", "x"), ("next", "y")])
    taken = await batch.take(result)
    assert taken.emits == [] and await batch.take(taken) is taken  # taken once
    assert await batch.flush()
    assert intake.added == [(JobType("acme", "next"), ["x", "y"])]


async def test_follow_on_jobs_not_durable_fail_the_flush(
    releases: Releases, intake: RecordingIntake
) -> None:
    intake.broken = True
    batch = releases.of(SPEC)
    await batch.take(JobResult(id="a", exitcode=200, emits=[("next", "x")]))
    assert not await batch.flush()


def test_jobs_whose_handler_went_wait_again_until_their_time_ends(releases: Releases) -> None:
    young, old = claimed("young"), claimed("old", age=7200.0)
    got = releases.no_handler([young, old], now=NOW)
    assert got[0] == Release(id="young", how=ReleaseHow.UNGET, refund_attempt=True)
    assert (got[1].how, got[1].exitcode) == (ReleaseHow.ARCHIVE, 503)
