"""Priorities (migration 0018): among the due jobs of a type, the higher first,
then the oldest; a job keeps its priority when done and when it runs again."""

from __future__ import annotations

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.domain.pulled import OptedJobs
from tests.contract.conftest import Rig, new


async def _add(rig: Rig, priority: int, *ids_ago: tuple[str, float]) -> None:
    jobs = [new(i, ago=ago) for i, ago in ids_ago]
    assert await rig.store.add_opted([OptedJobs(jobs=jobs, after=[], priority=priority)]) == len(
        jobs
    )


async def _mixed(rig: Rig) -> None:
    """Plain jobs p1 (oldest) and p2, high ones h5 and h9, low ones l1 and l9,
    and a high one not due yet."""
    await rig.store.add_jobs([new("p1", ago=50), new("p2", ago=5)])
    await _add(rig, 5, ("h5", 1))
    await _add(rig, 9, ("h9", 2))
    await _add(rig, 100, ("future", -3600))
    await _add(rig, -1, ("l1", 40))
    await _add(rig, -100, ("l9", 60))


ORDER = ["h9", "h5", "p1", "p2", "l1", "l9"]


async def test_a_claim_takes_the_higher_priority_first_then_the_oldest(rig: Rig) -> None:
    await _mixed(rig)
    taken = []
    for _ in range(4):
        taken += [j.id for j in await rig.store.claim("a-t", 2, sysid="1", lease=30)]
    assert taken == ORDER
    one = await rig.store.claim("a-t", 100, sysid="1", lease=30)
    assert one == []  # the future one is not due


async def test_one_claim_returns_its_jobs_in_that_order(rig: Rig) -> None:
    await _mixed(rig)
    assert [j.id for j in await rig.store.claim("a-t", 100, sysid="1", lease=30)] == ORDER


async def test_a_pull_worker_claims_in_the_same_order(rig: Rig) -> None:
    await _mixed(rig)
    taken = []
    for n in range(3):
        claimed = await rig.store.claim_pulled(
            "a-t", 2, lock=f"w:{n:032x}:w1", lease=30, client="a", worker="w1"
        )
        taken += [j.id for j in claimed]
    assert taken == ORDER


async def test_a_job_keeps_its_priority_when_done_and_rerun(rig: Rig) -> None:
    s = rig.store
    await _add(rig, -7, ("j", 1))
    assert (await s.get_job("a", "j")).priority == -7
    await s.claim("a-t", 1, sysid="1", lease=30)
    release = Release(id="j", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="r")
    assert await s.release([release], sysid="1") == {"j"}
    assert (await s.get_job("a", "j")).priority == -7
    assert (await s.rerun_job("a", "j")).priority == -7
    page = await s.list_jobs("a", limit=10)
    assert [(job.id, job.priority) for job in page.jobs] == [("j", -7)]
