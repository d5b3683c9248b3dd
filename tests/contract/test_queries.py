"""JobQueries: a tenant's view of its jobs, walled off from the others'."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queue_daemon.domain.jobs import JobState, Release, ReleaseHow
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.domain.views import TypeStats
from queue_daemon.store.errors import BadCursor, Conflict, NotFound
from tests.contract.conftest import Rig, new


async def test_get_job_strips_the_prefix_and_walls_off_tenants(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("j1", "acme-t-x", data="payload")])
    job = await s.get_job("acme", "j1")
    assert (job.id, job.type, job.state, job.data, job.attempts) == (
        "j1",
        "t-x",
        JobState.WAITING,
        "payload",
        0,
    )
    assert job.runs == [] and job.code is None and job.done_dt is None
    for client, job_id in (("other", "j1"), ("acme", "nope")):
        with pytest.raises(NotFound):
            await s.get_job(client, job_id)


async def test_list_jobs_pages_newest_first_with_filters(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new(f"j{n}", ago=100 - n) for n in range(5)])
    await s.add_jobs([new("u1", "a-u"), new("other", "b-t")])
    await s.claim("a-t", 1, sysid="1", lease=30)  # j0, the oldest
    page = await s.list_jobs("a", limit=2)
    assert [j.id for j in page.jobs] == ["u1", "j4"] and page.next is not None
    rest = await s.list_jobs("a", limit=10, after=page.next)
    assert [j.id for j in rest.jobs] == ["j3", "j2", "j1", "j0"] and rest.next is None
    assert all(j.runs is None for j in rest.jobs)
    only_u = await s.list_jobs("a", type="u")
    assert [j.id for j in only_u.jobs] == ["u1"]
    running = await s.list_jobs("a", state=JobState.RUNNING)
    assert [j.id for j in running.jobs] == ["j0"]
    assert (await s.list_jobs("a", state=JobState.DONE)).jobs == []
    assert (await s.list_jobs("nobody")).jobs == []
    clamped = await s.list_jobs("a", limit=0)
    assert len(clamped.jobs) == 1 and clamped.next is not None


async def test_list_jobs_refuses_a_bad_cursor(rig: Rig) -> None:
    with pytest.raises(BadCursor):
        await rig.store.list_jobs("a", after="not-a-cursor")


async def test_stats_count_each_state_per_type(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("w1"), new("w2"), new("f1", ago=-3600), new("r1", "a-u")])
    await s.add_jobs([new("d1", "a-u"), new("d2", "a-u"), new("x", "b-t")])
    await s.add_opted([OptedJobs(jobs=[new("b1")], after=["w1"])])
    await s.claim("a-u", 3, sysid="1", lease=30)
    await s.release(
        [
            Release(id="d1", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200),
            Release(id="d2", how=ReleaseHow.ARCHIVE, code="error", exitcode=500),
        ],
        sysid="1",
    )
    assert await s.stats("a") == {
        "t": TypeStats(waiting=2, scheduled=1, blocked=1),
        "u": TypeStats(running=1, done_ok=1, done_error=1),
    }
    assert await s.stats("nobody") == {}
    assert await s.count_waiting("a") == 4
    assert await s.count_waiting("b") == 1


async def test_cancel_ends_a_waiting_or_running_job(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("w"), new("r")])
    await s.claim("a-t", 1, sysid="1", lease=30)  # one of the two (the same dt)
    running = "w" if (await rig.row("w")).lock == "1" else "r"  # type: ignore[union-attr]
    waiting = "r" if running == "w" else "w"
    job = await s.cancel_job("a", waiting)
    assert (job.state, job.code, job.exitcode, job.result) == (
        JobState.DONE,
        "failed",
        499,
        "cancelled",
    )
    assert [r["reason"] for r in (await s.get_job("a", waiting)).runs or []] == ["cancelled"]
    stopped = await s.cancel_job("a", running)
    assert (stopped.state, stopped.code, stopped.exitcode) == (JobState.DONE, "cancelled", 499)
    [run] = (await s.get_job("a", running)).runs or []
    assert (run["reason"], run["by"], run["code"]) == ("cancelled", "sysid:1", "cancelled")
    assert isinstance(run["started"], int) and isinstance(run["ended"], int)
    # its holder's release finds it done: refused
    release = Release(id=running, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="r")
    assert await s.release([release], sysid="1") == set()
    assert (await s.get_job("a", running)).code == "cancelled"
    assert (await s.stats("a"))["t"].done_failed == 2  # a cancel is counted as failed
    for job_id in (waiting, running):  # done now
        with pytest.raises(Conflict):
            await s.cancel_job("a", job_id)
    with pytest.raises(NotFound):
        await s.cancel_job("b", waiting)
    with pytest.raises(NotFound):
        await s.cancel_job("a", "nope")


async def test_delete_done_deletes_a_tenants_old_done_jobs(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("d1"), new("d2"), new("d3", "a-u"), new("w"), new("x", "b-t")])
    await s.claim("a-t", 2, sysid="1", lease=30)
    await s.claim("a-u", 1, sysid="1", lease=30)
    await s.claim("b-t", 1, sysid="1", lease=30)
    done = [
        Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200)
        for i in ("d1", "d2", "d3", "x")
    ]
    await s.release(done, sysid="1")
    later = datetime.now(UTC) + timedelta(minutes=1)
    assert await s.delete_done("a", type="a-t", before=later, limit=1) == {"a-t": 1}
    assert await s.delete_done("a", type=None, before=later - timedelta(hours=1), limit=9) == {}
    assert await s.delete_done("a", type=None, before=later, limit=9) == {"a-t": 1, "a-u": 1}
    assert await rig.row("w") is not None and await rig.row("x") is not None


async def test_a_job_failed_at_its_add_counts_as_done_failed(rig: Rig) -> None:
    """A job whose dependency had already failed is stored failed (424) by its
    add: it is done, and counted so by stats and the dashboard."""
    s = rig.store
    await s.add_jobs([new("d1")])
    await s.cancel_job("a", "d1")
    await s.add_opted([OptedJobs(jobs=[new("w1")], after=["d1"])])
    assert (await s.get_job("a", "w1")).exitcode == 424
    assert await s.stats("a") == {"t": TypeStats(done_failed=2)}
