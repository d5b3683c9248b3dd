"""The retry policy: exit-code classes, backoff, attempts and time limits."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from queue_daemon.domain.jobs import ClaimedJob, ReleaseHow, epoch_ms
from queue_daemon.domain.outcomes import (
    RETRY_CAP_S,
    Policy,
    code_of,
    no_handler,
    put_back,
    release_for,
    retry_delay,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job(attempts: int = 1, age: float = 0.0) -> ClaimedJob:
    return ClaimedJob(
        id="j",
        type="a-t",
        data="p",
        attempts=attempts,
        created_ms=epoch_ms(NOW - timedelta(seconds=age)),
    )


@pytest.mark.parametrize(
    ("exitcode", "code"),
    [
        (100, "retry"),
        (199, "retry"),
        (200, "ok"),
        (204, "ok"),
        (404, "failed"),
        (499, "failed"),
        (500, "error"),
        (503, "error"),
        (0, "error"),
        (300, "error"),
        (600, "error"),
        (-1, "error"),
    ],
)
def test_code_of(exitcode: int, code: str) -> None:
    assert code_of(exitcode) == code


@pytest.mark.parametrize(("exitcode", "code"), [(200, "ok"), (201, "ok"), (400, "failed")])
def test_ok_and_failed_end_the_job_at_once(exitcode: int, code: str) -> None:
    release = release_for(job(attempts=1), exitcode, "r", Policy(job_ttl=86_400.0), now=NOW)
    assert (release.how, release.code, release.exitcode, release.result) == (
        ReleaseHow.ARCHIVE,
        code,
        exitcode,
        "r",
    )


@pytest.mark.parametrize(("exitcode", "code"), [(100, "retry"), (500, "error"), (302, "error")])
def test_retry_and_error_run_again_until_attempts_are_used(exitcode: int, code: str) -> None:
    policy = Policy(max_attempts=3, job_ttl=86_400.0)
    for attempts in (1, 2):
        release = release_for(job(attempts=attempts), exitcode, None, policy, now=NOW)
        assert (release.how, release.code) == (ReleaseHow.RETRY, code)
        assert release.delay > 0
    last = release_for(job(attempts=3), exitcode, "x", policy, now=NOW)
    assert (last.how, last.code, last.exitcode, last.result) == (
        ReleaseHow.ARCHIVE,
        code,
        exitcode,
        "x",
    )


def test_retries_stop_when_the_jobs_time_runs_out() -> None:
    policy = Policy(max_attempts=100, job_ttl=60)
    assert release_for(job(attempts=1, age=10), 500, None, policy, now=NOW).how == ReleaseHow.RETRY
    assert release_for(job(attempts=1, age=59.5), 500, None, policy, now=NOW).how == (
        ReleaseHow.ARCHIVE
    )


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    rng = random.Random(1)
    means = [sum(retry_delay(a, rng) for _ in range(200)) / 200 for a in (1, 2, 3, 4)]
    assert means == sorted(means)
    assert 0.75 <= means[0] <= 1.25 and 6 <= means[3] <= 10
    samples = {round(retry_delay(3, rng), 3) for _ in range(50)}
    assert len(samples) > 10  # jittered
    assert all(retry_delay(a, rng) <= RETRY_CAP_S for a in (20, 50, 1000))


def test_put_back_and_no_handler_do_not_use_attempts() -> None:
    back = put_back(job())
    assert (back.how, back.refund_attempt) == (ReleaseHow.UNGET, True)
    waiting = no_handler(job(age=3599), Policy(job_ttl=3600), now=NOW)
    assert (waiting.how, waiting.refund_attempt, waiting.code) == (ReleaseHow.UNGET, True, None)
    expired = no_handler(job(age=3601), Policy(job_ttl=3600), now=NOW)
    assert (expired.how, expired.code, expired.exitcode) == (ReleaseHow.ARCHIVE, "error", 503)
