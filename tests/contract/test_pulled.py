"""PulledJobs: claims by tenants' workers, renewals, completes, hand-backs, registry."""

from __future__ import annotations

import pytest

from queue_daemon.domain.jobs import JobState, Release, ReleaseHow
from queue_daemon.domain.pulled import HeldJob
from tests.contract.conftest import Rig, new

LOCK = "w:" + "0" * 32 + ":w1"
OTHER = "w:" + "1" * 32 + ":w1"


async def test_a_worker_claims_renews_and_completes(rig: Rig) -> None:
    s = rig.store
    await s.put_handler("a-t", {"lang": "worker", "timeout": 120})
    await s.add_jobs([new("a", ago=20), new("b", ago=10), new("c")])
    jobs = await s.claim_pulled("a-t", 2, lock=LOCK, lease=30, client="a", worker="w1")
    assert [(j.id, j.attempts) for j in jobs] == [("a", 1), ("b", 1)]
    assert await s.claim_pulled("a-t", 0, lock=OTHER, lease=30, client="a", worker="w1") == []
    renewed = await s.renew_pulled(
        [("a", LOCK), ("b", OTHER), ("zz", LOCK)], client="a", worker="w1"
    )
    assert set(renewed) == {"a"} and renewed["a"] > jobs[0].lease_until
    assert await s.renew_pulled([("a", LOCK)], client="b", worker="w1") == {}
    seen: list[list[HeldJob]] = []

    async def decide(held: list[HeldJob]) -> list[Release]:
        seen.append(held)
        return [
            Release(id=h.id, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="r")
            for h in held
        ]

    done = await s.complete_pulled([("a", LOCK), ("b", OTHER)], decide, client="a", worker="w1")
    assert done == {"a"} and [[h.id for h in held] for held in seen] == [["a"]]
    job = await s.get_job("a", "a")
    assert (job.state, job.result) == (JobState.DONE, "r")
    assert [run["by"] for run in job.runs or []] == ["worker:w1"]
    assert await s.done_among(["a", "b", "nope"]) == {"a"}
    (worker,) = await s.workers("a")
    assert (worker.name, worker.holding, worker.done_ok, worker.live) == ("w1", 1, 1, True)
    assert await s.live_workers() == {"a": 1, "b": 1}  # a renewal is a heartbeat


async def test_a_complete_whose_decision_fails_changes_nothing(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a")])
    await s.claim_pulled("a-t", 1, lock=LOCK, lease=30, client="a", worker="w1")

    async def refuse(held: list[HeldJob]) -> list[Release]:
        raise RuntimeError("the follow-on jobs could not be written")

    with pytest.raises(RuntimeError):
        await s.complete_pulled([("a", LOCK)], refuse, client="a", worker="w1")
    assert (await rig.row("a")).lock == LOCK  # type: ignore[union-attr]
    # nothing held: decide is not asked
    assert await s.complete_pulled([("a", OTHER)], refuse, client="a", worker="w1") == set()


async def test_a_retry_from_a_worker_is_due_after_its_delay(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a")])
    await s.claim_pulled("a-t", 1, lock=LOCK, lease=30, client="a", worker="w1")

    async def retry(held: list[HeldJob]) -> list[Release]:
        return [Release(id="a", how=ReleaseHow.RETRY, code="retry", exitcode=500, delay=0)]

    assert await s.complete_pulled([("a", LOCK)], retry, client="a", worker="w1") == {"a"}
    row = await rig.row("a")
    assert row is not None and row.due and row.attempts == 1 and row.code == "retry"
    (worker,) = await s.workers()
    assert worker.done_retry == 1 and worker.holding == 0


async def test_an_archive_takes_only_what_its_claims_hold_of_the_client(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a", ago=20), new("b", ago=10), new("c"), new("x", "b-t")])
    await s.claim_pulled("a-t", 3, lock=LOCK, lease=30, client="a", worker="w1")
    await s.claim_pulled("b-t", 1, lock=LOCK, lease=30, client="b", worker="w1")

    def done(job_id: str, code: str, exitcode: int) -> Release:
        return Release(id=job_id, how=ReleaseHow.ARCHIVE, code=code, exitcode=exitcode, result="r")

    releases = [done("a", "ok", 200), done("b", "failed", 404), done("c", "ok", 200)]
    releases.append(done("x", "ok", 200))
    claims = [("a", LOCK), ("b", LOCK), ("c", OTHER), ("x", LOCK), ("nope", LOCK)]
    archived = await s.archive_pulled(releases, claims, client="a", worker="w1")
    # c: another claim holds it; x: another client's job, whatever its lock
    assert sorted(archived) == [("a", "a-t", 1), ("b", "a-t", 1)]
    a, b = await s.get_job("a", "a"), await s.get_job("a", "b")
    assert (a.state, a.code, a.result, b.code, b.exitcode) == (
        JobState.DONE,
        "ok",
        "r",
        "failed",
        404,
    )
    assert [run["by"] for run in b.runs or []] == ["worker:w1"]
    assert (await rig.row("c")).lock == LOCK  # type: ignore[union-attr]
    assert (await rig.row("x")).lock == LOCK  # type: ignore[union-attr]
    assert await s.done_among(["a", "b", "c"]) == {"a", "b"}
    (worker,) = await s.workers("a")
    assert (worker.done_ok, worker.done_failed, worker.holding) == (1, 1, 1)
    # again: nothing held any more, nothing counted
    assert await s.archive_pulled(releases[:2], claims[:2], client="a", worker="w1") == []
    (worker,) = await s.workers("a")
    assert (worker.done_ok, worker.done_failed) == (1, 1)


async def test_an_archive_leaves_ok_runs_of_a_type_that_chains_a_then_job(rig: Rig) -> None:
    s = rig.store
    await s.put_handler("a-c", {"lang": "worker", "then": "next"})
    await s.put_handler("a-t", {"lang": "worker", "then": "next"})
    await s.put_handler("a-t", {"lang": "worker"})  # its live version chains nothing
    await s.add_jobs([new("a", "a-c", ago=20), new("b", "a-c", ago=10), new("c", "a-t")])
    await s.claim_pulled("a-c", 2, lock=LOCK, lease=30, client="a", worker="w1")
    await s.claim_pulled("a-t", 1, lock=LOCK, lease=30, client="a", worker="w1")
    releases = [
        Release(id=i, how=ReleaseHow.ARCHIVE, code=code, exitcode=exitcode)
        for i, code, exitcode in [("a", "ok", 200), ("b", "failed", 400), ("c", "ok", 200)]
    ]
    claims = [("a", LOCK), ("b", LOCK), ("c", LOCK)]
    archived = await s.archive_pulled(releases, claims, client="a", worker="w1")
    assert sorted(archived) == [("b", "a-c", 1), ("c", "a-t", 1)]
    assert (await rig.row("a")).lock == LOCK  # type: ignore[union-attr]
    assert await s.archive_pulled([], [], client="a", worker="w1") == []


async def test_a_hand_back_puts_jobs_back_without_the_attempt(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a"), new("b")])
    await s.claim_pulled("a-t", 2, lock=LOCK, lease=30, client="a", worker="w1")
    back = await s.hand_back([("a", LOCK), ("b", OTHER)], client="a", worker="w1")
    assert back == {"a": "a-t"}
    row = await rig.row("a")
    assert row is not None and row.due and row.attempts == 0
    assert await s.hand_back([("b", LOCK)], client="other", worker="w1") == {}


async def test_existing_jobs_are_the_clients_own(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a"), new("x", "b-t")])
    assert await s.existing_jobs(["a", "x", "nope"], client="a") == {"a"}
    assert await s.existing_jobs([], client="a") == set()


async def test_workers_not_seen_for_a_day_are_forgotten(rig: Rig) -> None:
    s = rig.store
    await s.claim_pulled("a-t", 1, lock=LOCK, lease=30, client="a", worker="w1")
    await s.claim_pulled("a-t", 1, lock=OTHER, lease=30, client="a", worker="w2")
    await rig.age_worker("a", "w2", 60)
    assert [(w.name, w.live) for w in await s.workers("a")] == [("w1", True), ("w2", False)]
    assert await s.live_workers() == {"a": 1}
    await rig.age_worker("a", "w2", 2 * 86400)
    assert [w.name for w in await s.workers()] == ["w1"]
    assert await s.forget_workers() == 1
    assert await s.workers("b") == []


async def test_daemons_lists_sysids_with_the_jobs_they_run(rig: Rig) -> None:
    s = rig.store
    one = await s.reserve_sysid(None, holder="h1", host="x", data_dir="/d1", lease=60)
    two = await s.reserve_sysid(None, holder="h2", host="y", data_dir="/d2", lease=60)
    await s.release_sysid(two, holder="h2")
    await s.add_jobs([new("a"), new("b")])
    await s.claim("a-t", 1, sysid=one, lease=30)
    await s.claim_pulled("a-t", 1, lock=LOCK, lease=30, client="a", worker="w1")
    seen = {d.sysid: (d.host, d.state, d.running) for d in await s.daemons()}
    assert seen == {one: ("x", "live", 1), two: ("y", "released", 0)}


async def test_a_pulled_job_cancelled_while_held_is_told_apart(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("c"), new("k")])
    claimed = await s.claim_pulled("a-t", 2, lock=LOCK, lease=30, client="a", worker="w1")
    assert {j.id for j in claimed} == {"c", "k"}
    job = await s.cancel_job("a", "c")
    assert (job.code, job.exitcode) == ("cancelled", 499)
    [run] = (await s.get_job("a", "c")).runs or []
    assert (run["reason"], run["by"]) == ("cancelled", "worker:w1")
    assert set(await s.renew_pulled([("c", LOCK), ("k", LOCK)], client="a", worker="w1")) == {"k"}
    assert await s.cancelled_jobs(["c", "k", "nope"], client="a") == {"c"}
    assert await s.cancelled_jobs(["c"], client="b") == set()
