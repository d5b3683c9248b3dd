"""JobIntake: adds idempotent by id, jobs that wait for others, deadlines, flushes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from queue_daemon.domain.jobs import Dispatch, JobState, Release, ReleaseHow
from queue_daemon.domain.pulled import OptedJobs
from tests.contract.conftest import Rig, new

ARCHIVE_OK = ReleaseHow.ARCHIVE


async def test_an_empty_add_adds_nothing(rig: Rig) -> None:
    assert await rig.store.add_jobs([]) == 0
    assert await rig.store.add_opted([]) == 0


async def test_adds_are_idempotent_by_id(rig: Rig) -> None:
    s = rig.store
    assert await s.add_jobs([new("j1"), new("j2")]) == 2
    assert await s.add_jobs([new("j2"), new("j3")]) == 1
    assert await s.add_jobs([new("j1", data="other")], durable=False) == 0
    assert (await s.get_job("a", "j1")).data == "p"  # the first add's row stays


async def test_a_large_batch_with_duplicates_counts_only_new_rows(rig: Rig) -> None:
    s = rig.store
    first = [new(f"b{n:04}") for n in range(150)]
    assert await s.add_jobs(first[:70]) == 70
    assert await s.add_jobs(first) == 80
    assert await s.count_waiting("a") == 150


async def test_flush_and_epoch_name_the_same_incarnation(rig: Rig) -> None:
    s = rig.store
    epoch = await s.epoch()
    await s.add_jobs([new("j1")], durable=False)
    assert await s.flush() == epoch
    assert await s.epoch() == epoch


async def test_a_job_waits_for_its_dependencies_and_is_freed_when_they_complete(
    rig: Rig,
) -> None:
    s = rig.store
    await s.add_jobs([new("d1"), new("d2")])
    assert await s.add_opted([OptedJobs(jobs=[new("w1")], after=["d1", "d2"])]) == 1
    row = await rig.row("w1")
    assert row is not None and row.blocked and not row.due
    assert (await s.get_job("a", "w1")).state is JobState.BLOCKED
    assert (await rig.row("d1")) is not None and (await rig.row("d1")).dependents  # type: ignore[union-attr]
    assert [j.id for j in await s.claim("a-t", 10, sysid="1", lease=30)] == ["d1", "d2"]
    await s.release([Release(id="d1", how=ARCHIVE_OK, code="ok", exitcode=200)], sysid="1")
    assert not (await rig.row("w1")).due  # type: ignore[union-attr]  # one of two done
    await s.release([Release(id="d2", how=ARCHIVE_OK, code="ok", exitcode=200)], sysid="1")
    row = await rig.row("w1")
    assert row is not None and row.due and not row.blocked
    assert (await s.get_job("a", "w1")).state is JobState.WAITING


async def test_a_failed_dependency_fails_its_dependents_transitively(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("d1")])
    await s.add_opted([OptedJobs(jobs=[new("w1")], after=["d1"])])
    await s.add_opted([OptedJobs(jobs=[new("w2")], after=["w1"])])
    await s.add_opted([OptedJobs(jobs=[new("any")], after=["w1"], resolve_any=True)])
    await s.claim("a-t", 10, sysid="1", lease=30)
    await s.release(
        [Release(id="d1", how=ARCHIVE_OK, code="failed", exitcode=500, result="x")], sysid="1"
    )
    for job_id in ("w1", "w2"):
        job = await s.get_job("a", job_id)
        assert (job.state, job.code, job.exitcode) == (JobState.DONE, "failed", 424)
        assert job.result == "dependency d1 did not complete"
    row = await rig.row("any")  # all-resolved: any outcome counts
    assert row is not None and row.due


async def test_a_dependency_already_failed_fails_the_job_at_once(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("d1")])
    await s.claim("a-t", 1, sysid="1", lease=30)
    await s.release([Release(id="d1", how=ARCHIVE_OK, code="error", exitcode=503)], sysid="1")
    assert await s.add_opted([OptedJobs(jobs=[new("w1")], after=["d1"])]) == 1
    job = await s.get_job("a", "w1")
    assert (job.state, job.exitcode, job.result) == (
        JobState.DONE,
        424,
        "dependency d1 did not complete",
    )
    assert await s.add_opted([OptedJobs(jobs=[new("w2")], after=["d1"], resolve_any=True)]) == 1
    assert (await rig.row("w2")).due  # type: ignore[union-attr]


async def test_unknown_and_done_dependencies_count_as_completed(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("d1")])
    await s.claim("a-t", 1, sysid="1", lease=30)
    await s.release([Release(id="d1", how=ARCHIVE_OK, code="ok", exitcode=200)], sysid="1")
    groups = [OptedJobs(jobs=[new("w1"), new("w2")], after=["d1", "purged-long-ago"])]
    assert await s.add_opted(groups) == 2
    assert await s.add_opted(groups) == 0  # idempotent by id
    assert (await rig.row("w1")).due and (await rig.row("w2")).due  # type: ignore[union-attr]


async def test_a_job_with_a_deadline_ends_when_it_passes(rig: Rig) -> None:
    s = rig.store
    soon = datetime.now(UTC) + timedelta(hours=1)
    await s.add_opted([OptedJobs(jobs=[new("w1"), new("r1")], after=[], deadline=soon)])
    await s.add_jobs([new("plain", "a-u")])
    assert await s.expire_deadlines() == []
    await rig.age("w1", deadline=1)
    await rig.age("r1", deadline=1)
    assert [j.id for j in await s.claim("a-t", 5, sysid="1", lease=30)] == []  # past: unclaimable
    ended = sorted(await s.expire_deadlines())
    assert ended == [("r1", "a-t", False), ("w1", "a-t", False)]
    job = await s.get_job("a", "w1")
    assert (job.code, job.exitcode) == ("failed", 408)
    assert await s.expire_deadlines() == []


async def test_a_running_job_whose_deadline_passes_is_taken_from_its_holder(rig: Rig) -> None:
    s = rig.store
    soon = datetime.now(UTC) + timedelta(hours=1)
    await s.add_opted([OptedJobs(jobs=[new("r1")], after=[], deadline=soon)])
    (claimed,) = await s.claim("a-t", 1, sysid="1", lease=30)
    assert claimed.deadline is not None
    await rig.age("r1", deadline=1)
    assert await s.expire_deadlines() == [("r1", "a-t", True)]
    late = Release(id="r1", how=ARCHIVE_OK, code="ok", exitcode=200)
    assert await s.release([late], sysid="1") == set()
    job = await s.get_job("a", "r1")
    assert job.exitcode == 408 and [r["reason"] for r in job.runs or []] == ["deadline"]


async def test_resolve_pending_finds_done_jobs_with_unresolved_dependents(rig: Rig) -> None:
    s = rig.store
    assert await s.resolve_pending() == 0
    await s.add_jobs([new("d1")])
    await s.add_opted([OptedJobs(jobs=[new("w1")], after=["d1"])])
    await s.cancel_job("a", "d1")  # resolves at once
    assert await s.resolve_pending() == 0
    job = await s.get_job("a", "w1")
    assert (job.state, job.exitcode) == (JobState.DONE, 424)


async def test_a_dispatched_add_stores_its_jobs_claimed_by_the_daemon(rig: Rig) -> None:
    """A fresh batch's jobs that the ingesting daemon runs at once are stored
    claimed by it, with the live handler of their type; the others wait."""
    s = rig.store
    handler = await s.put_handler("a-t", {"lang": "python", "body": "x"})
    sysid = await s.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    batch = [new("d1", ago=0.5), new("d2", ago=0.4), new("d3", "a-u", ago=0.3)]
    dispatch = Dispatch(ids=frozenset({"d1", "d2"}), sysid=sysid, lease=60.0)
    added, claimed = await s.add_dispatched(batch, dispatch)
    assert added == 3
    assert [(c.id, c.attempts, c.handler) for c in claimed] == [
        ("d1", 1, handler.id),
        ("d2", 1, handler.id),
    ]
    assert all(c.due_ms is not None and c.deadline is None for c in claimed)
    row = await rig.row("d1")
    assert row is not None and row.lock == sysid and row.attempts == 1
    assert await s.claim("a-t", 10, sysid=sysid, lease=60.0) == []  # nothing left to claim
    assert [c.id for c in await s.claim("a-u", 10, sysid=sysid, lease=60.0)] == ["d3"]
    ok = [Release(id=c.id, how=ARCHIVE_OK, code="ok", exitcode=200) for c in claimed]
    assert await s.release(ok, sysid=sysid) == {"d1", "d2"}
    assert (await s.get_job("a", "d1")).state == JobState.DONE


async def test_a_lapsed_sysid_stores_a_dispatched_add_waiting(rig: Rig) -> None:
    s = rig.store
    await s.put_handler("a-t", {"lang": "python", "body": "x"})
    sysid = await s.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    await s.release_sysid(sysid, holder="h")
    dispatch = Dispatch(ids=frozenset({"d1"}), sysid=sysid, lease=60.0)
    assert await s.add_dispatched([new("d1")], dispatch) == (1, [])
    row = await rig.row("d1")
    assert row is not None and row.lock == "" and row.due


async def test_a_dispatched_batch_stored_again_skips_done_jobs_and_claims_the_rest(
    rig: Rig,
) -> None:
    """After a store crash took a dispatched batch's rows, the jobs the daemon
    still runs are stored claimed by it again; a job of the batch done since
    (its row survived and was archived) is not stored again."""
    s = rig.store
    await s.put_handler("a-t", {"lang": "python", "body": "x"})
    sysid = await s.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    await s.add_dispatched([new("d1")], Dispatch(ids=frozenset({"d1"}), sysid=sysid, lease=60.0))
    done = Release(id="d1", how=ARCHIVE_OK, code="ok", exitcode=200)
    assert await s.release([done], sysid=sysid) == {"d1"}
    again = Dispatch(ids=frozenset({"d1", "d2"}), sysid=sysid, lease=60.0)
    added, claimed = await s.add_dispatched([new("d1"), new("d2")], again, fresh=False)
    assert added == 1 and [c.id for c in claimed] == ["d2"]
    assert (await s.get_job("a", "d1")).state == JobState.DONE
    row = await rig.row("d2")
    assert row is not None and row.lock == sysid
    assert await s.claim("a-t", 10, sysid=sysid, lease=60.0) == []


async def test_a_refused_adds_rows_are_removed_unless_another_daemon_holds_them(
    rig: Rig,
) -> None:
    s = rig.store
    await s.put_handler("a-t", {"lang": "python", "body": "x"})
    sysid = await s.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    mine = Dispatch(ids=frozenset({"r1", "r2"}), sysid=sysid, lease=60.0)
    await s.add_dispatched([new("r1"), new("r2"), new("r3")], mine)  # r3 waits
    await s.add_jobs([new("o1")])
    claimed = await s.claim("a-t", 10, sysid="other", lease=60.0)
    assert sorted(c.id for c in claimed) == ["o1", "r3"]
    assert await s.remove_refused(["r1", "r2", "r3", "o1", "nope"], sysid) == 2
    assert await rig.row("r1") is None and await rig.row("r2") is None
    assert await rig.row("r3") is not None and await rig.row("o1") is not None


async def test_an_early_add_for_a_lapsed_sysid_stores_nothing(rig: Rig) -> None:
    """An add stored before its journal write is durable must not be taken by
    another daemon: with its sysid lapsed, nothing is stored (the ingester
    stores the jobs once the write is durable)."""
    s = rig.store
    await s.put_handler("a-t", {"lang": "python", "body": "x"})
    sysid = await s.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    await s.release_sysid(sysid, holder="h")
    dispatch = Dispatch(ids=frozenset({"e1"}), sysid=sysid, lease=60.0)
    assert await s.add_dispatched([new("e1")], dispatch, early=True) == (0, [])
    assert await rig.row("e1") is None
