"""Reruns: a done job waits again with fresh attempts, its runs kept and growing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queue_daemon.domain.jobs import JobState, Release, ReleaseHow
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.store.errors import Conflict, NotFound
from queue_daemon.store.queries.jobs import MAX_RUNS
from tests.contract.conftest import Rig, new

ARCHIVE = ReleaseHow.ARCHIVE


async def _ended(rig: Rig, job_id: str, code: str, exitcode: int, type: str = "a-t") -> None:
    """``job_id`` claimed and released with ``code``."""
    s = rig.store
    claimed = await s.claim(type, 100, sysid="1", lease=30)
    assert job_id in {job.id for job in claimed}
    others = [job.id for job in claimed if job.id != job_id]
    if others:
        await s.release([Release(id=i, how=ReleaseHow.UNGET) for i in others], sysid="1")
    release = Release(id=job_id, how=ARCHIVE, code=code, exitcode=exitcode, result=code)
    assert await s.release([release], sysid="1") == {job_id}


async def test_a_done_job_runs_again_with_fresh_attempts_and_its_runs_kept(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("j")])
    await _ended(rig, "j", "failed", 404)
    job = await s.rerun_job("a", "j")
    assert (job.state, job.attempts, job.code, job.exitcode, job.result, job.done_dt) == (
        JobState.WAITING,
        0,
        None,
        None,
        None,
        None,
    )
    assert [run["code"] for run in job.runs or []] == ["failed"]
    assert (await s.stats("a"))["t"].done_failed == 0
    assert (await s.stats("a"))["t"].waiting == 1
    await _ended(rig, "j", "ok", 200)
    again = await s.get_job("a", "j")
    assert (again.state, again.attempts, again.code) == (JobState.DONE, 1, "ok")
    assert [run["code"] for run in again.runs or []] == ["failed", "ok"]
    assert (await s.stats("a"))["t"].done_ok == 1


async def test_a_job_ended_in_place_reruns_too(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("c")])
    await s.cancel_job("a", "c")  # marked done in jobs, not moved
    job = await s.rerun_job("a", "c")
    assert (job.state, job.code) == (JobState.WAITING, None)
    assert [run["reason"] for run in job.runs or []] == ["cancelled"]
    assert [j.id for j in await s.claim("a-t", 5, sysid="1", lease=30)] == ["c"]


async def test_only_a_done_job_of_ones_own_reruns(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("w"), new("r")])
    with pytest.raises(Conflict):
        await s.rerun_job("a", "w")  # waiting
    await s.claim("a-t", 1, sysid="1", lease=30)
    with pytest.raises(Conflict):
        await s.rerun_job("a", "w")  # running
    with pytest.raises(NotFound):
        await s.rerun_job("b", "w")  # another tenant's
    with pytest.raises(NotFound):
        await s.rerun_job("a", "nope")


async def test_bulk_reruns_take_failed_and_errored_jobs_bounded(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new(f"f{n}") for n in range(3)] + [new("e"), new("ok"), new("u", "a-u")])
    for n in range(3):
        await _ended(rig, f"f{n}", "failed", 400)
    await _ended(rig, "e", "error", 500)
    await _ended(rig, "ok", "ok", 200)
    await _ended(rig, "u", "failed", 400, type="a-u")
    now = datetime.now(UTC) + timedelta(seconds=1)
    past = now - timedelta(hours=1)
    rerun = s.rerun_done
    assert await rerun("a", type="a-t", codes=["failed"], before=past, limit=10) == {}
    assert await rerun("b", type=None, codes=["failed", "error"], before=now, limit=10) == {}
    assert await rerun("a", type="a-t", codes=["failed"], before=now, limit=2) == {"a-t": 2}
    assert await rerun("a", type="a-t", codes=["failed"], before=now, limit=10) == {"a-t": 1}
    assert await rerun("a", type=None, codes=["ok", "error"], before=now, limit=10) == {"a-t": 1}
    assert await rerun("a", type=None, codes=["failed"], before=now, limit=10) == {"a-u": 1}
    assert (await s.get_job("a", "ok")).state is JobState.DONE  # never a bulk rerun of ok
    waiting = {j.id for j in await s.claim("a-t", 10, sysid="1", lease=30)}
    assert waiting == {"f0", "f1", "f2", "e"}


async def test_bulk_reruns_leave_cancelled_jobs_and_failed_dependents(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("d"), new("c", ago=-600)])
    await s.add_opted([OptedJobs(jobs=[new("w")], after=["d"])])
    await s.cancel_job("a", "c")  # 499
    await _ended(rig, "d", "failed", 400)  # w fails with 424
    assert (await s.get_job("a", "w")).exitcode == 424
    later = datetime.now(UTC) + timedelta(seconds=1)
    assert await s.rerun_done("a", type=None, codes=["failed"], before=later, limit=10) == {
        "a-t": 1
    }
    assert (await s.get_job("a", "d")).state is JobState.WAITING
    assert (await s.get_job("a", "c")).state is JobState.DONE
    assert (await s.get_job("a", "w")).state is JobState.DONE


async def test_a_job_cancelled_while_blocked_reruns_waiting_for_nothing(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("d")])
    await s.add_opted([OptedJobs(jobs=[new("b")], after=["d"])])
    await s.cancel_job("a", "b")
    await s.rerun_job("a", "b")
    await _ended(rig, "d", "failed", 400)  # b's old dependency fails: b runs all the same
    job = await s.get_job("a", "b")
    assert (job.state, job.exitcode) == (JobState.WAITING, None)
    assert [j.id for j in await s.claim("a-t", 5, sysid="1", lease=30)] == ["b"]


async def test_a_job_reruns_at_most_so_many_times(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("j", ago=-600)])
    for _ in range(MAX_RUNS):
        await s.cancel_job("a", "j")
        if len((await s.get_job("a", "j")).runs or ()) < MAX_RUNS:
            await s.rerun_job("a", "j")
    assert len((await s.get_job("a", "j")).runs or ()) == MAX_RUNS
    with pytest.raises(Conflict):
        await s.rerun_job("a", "j")
