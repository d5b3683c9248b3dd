"""A job's log excerpt (migration 0022): the last run's, written with its
release (kept when a release leaves the outcome as it was), moved to the archive,
shown by get_job alone, cleared by a rerun."""

from __future__ import annotations

from queue_daemon.domain.jobs import Release, ReleaseHow
from tests.contract.conftest import Rig, new


async def _run(rig: Rig, job_id: str, release: Release) -> None:
    claimed = await rig.store.claim("a-t", 1, sysid="1", lease=30)
    assert [j.id for j in claimed] == [job_id]
    assert await rig.store.release([release], sysid="1") == {job_id}


async def test_the_last_runs_log_is_kept_and_archived(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("j")])
    retry = Release(id="j", how=ReleaseHow.RETRY, code="error", exitcode=500, log="first\nrun")
    await _run(rig, "j", retry)
    assert (await s.get_job("a", "j")).log == "first\nrun"
    await rig.age("j", dt=1)
    done = Release(id="j", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, log="second")
    await _run(rig, "j", done)
    job = await s.get_job("a", "j")
    assert (job.log, job.code) == ("second", "ok")
    assert [j.log for j in (await s.list_jobs("a", limit=10)).jobs] == [None]  # GET alone
    assert (await s.rerun_job("a", "j")).log is None


async def test_a_run_that_printed_nothing_leaves_no_log(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("q")])
    retry = Release(id="q", how=ReleaseHow.RETRY, code="error", exitcode=500, log="noisy")
    await _run(rig, "q", retry)
    await rig.age("q", dt=1)
    await _run(rig, "q", Release(id="q", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200))
    assert (await s.get_job("a", "q")).log is None


async def test_a_put_back_keeps_the_log_of_the_run_before(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("p")])
    retry = Release(id="p", how=ReleaseHow.RETRY, code="error", exitcode=500, log="kept")
    await _run(rig, "p", retry)
    await rig.age("p", dt=1)
    await _run(rig, "p", Release(id="p", how=ReleaseHow.UNGET, refund_attempt=True))
    assert (await s.get_job("a", "p")).log == "kept"
