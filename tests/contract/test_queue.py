"""JobQueue: the claim path, leases, releases, expiry, purge and sweeps."""

from __future__ import annotations

import asyncio

from queue_daemon.domain.jobs import ExpiredLock, JobState, Release, ReleaseHow
from tests.contract.conftest import Rig, new

ARCHIVE, RETRY, UNGET = ReleaseHow.ARCHIVE, ReleaseHow.RETRY, ReleaseHow.UNGET


async def test_waiting_jobtypes_counts_due_jobs_of_types_daemons_run(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a1"), new("a2"), new("a3"), new("later", ago=-3600)])
    await s.add_jobs([new("i1", "a-idle"), new("p1", "a-pulled")])
    assert await s.waiting_jobtypes() == {}  # no handler yet
    await s.put_handler("a-t", {"lang": "python", "body": "x"})
    await s.put_handler("a-pulled", {"lang": "worker"})
    assert await s.waiting_jobtypes() == {"a-t": 3}
    assert await s.waiting_jobtypes(limit_per_type=2) == {"a-t": 2}
    assert await s.waiting_jobtypes(limit_per_type=0) == {"a-t": 1}  # at least one


async def test_claim_takes_the_oldest_due_first_up_to_its_limit(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("c", ago=10), new("a", ago=30), new("b", ago=20), new("f", ago=-60)])
    handler = await s.put_handler("a-t", {"lang": "python", "body": "x"})
    first = await s.claim("a-t", 2, sysid="1", lease=30)
    assert [j.id for j in first] == ["a", "b"]
    assert all(j.attempts == 1 and j.handler == handler.id for j in first)
    assert all(j.due_ms is not None and j.type == "a-t" for j in first)
    assert [j.id for j in await s.claim("a-t", 5, sysid="2", lease=30)] == ["c"]
    assert await s.claim("a-t", 5, sysid="2", lease=30) == []  # f is not due yet
    assert (await rig.row("a")).lock == "1"  # type: ignore[union-attr]


async def test_claims_of_zero_or_an_unknown_type_take_nothing(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a")])
    assert await s.claim("a-t", 0, sysid="1", lease=30) == []
    assert await s.claim("a-t", -1, sysid="1", lease=30) == []
    assert await s.claim("a-none", 5, sysid="1", lease=30) == []
    claimed = await s.claim("a-t", 5, sysid="1", lease=30)
    assert claimed[0].handler is None  # no handler when it was claimed


async def test_concurrent_claims_never_take_a_job_twice(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new(f"j{n:03}") for n in range(60)])
    rounds = await asyncio.gather(*(s.claim("a-t", 7, sysid=str(n), lease=30) for n in range(12)))
    ids = [j.id for claimed in rounds for j in claimed]
    assert len(ids) == len(set(ids)) == 60


async def test_nothing_is_claimed_under_a_lapsed_or_released_sysid(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a"), new("b")])
    one = await s.reserve_sysid(None, holder="h1", host="x", data_dir="/d1", lease=60)
    two = await s.reserve_sysid(None, holder="h2", host="x", data_dir="/d2", lease=60)
    await rig.lapse_sysid(one)
    assert await s.claim("a-t", 5, sysid=one, lease=30) == []
    await s.release_sysid(two, holder="h2")
    assert await s.claim("a-t", 5, sysid=two, lease=30) == []
    assert len(await s.claim("a-t", 5, sysid="never-reserved", lease=30)) == 2


async def test_renew_extends_only_the_holders_jobs(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a"), new("b"), new("w")])
    await s.claim("a-t", 2, sysid="1", lease=30)
    assert await s.renew([], sysid="1", lease=30) == 0
    assert await s.renew(["a", "b", "w", "nope"], sysid="1", lease=30) == 2
    assert await s.renew(["a"], sysid="2", lease=30) == 0


async def test_release_each_way(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("r"), new("u"), new("x")])
    await s.claim("a-t", 3, sysid="1", lease=30)
    applied = await s.release(
        [
            Release(id="r", how=RETRY, code="retry", exitcode=500, result="e", delay=3600),
            Release(id="u", how=UNGET),
            Release(id="x", how=ARCHIVE, code="ok", exitcode=200, result="done"),
        ],
        sysid="1",
    )
    assert applied == {"r", "u", "x"}
    r, u, x = await rig.row("r"), await rig.row("u"), await rig.row("x")
    assert r is not None and r.lock == "" and not r.due and r.attempts == 1
    assert (r.code, r.exitcode, r.result) == ("retry", 500, "e")
    assert u is not None and u.lock == "" and u.due and u.code is None
    assert x is not None and x.lock == "__done" and (x.code, x.result) == ("ok", "done")
    job = await s.get_job("a", "x")
    assert job.state is JobState.DONE and job.done_dt is not None
    assert [(run["by"], run["code"], run["reason"]) for run in job.runs or []] == [
        ("sysid:1", "ok", "completed")
    ]


async def test_a_release_without_a_code_keeps_the_previous_outcome(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a")])
    await s.claim("a-t", 1, sysid="1", lease=30)
    await s.release([Release(id="a", how=UNGET, code="retry", exitcode=500, result="r")], sysid="1")
    await s.claim("a-t", 1, sysid="1", lease=30)
    await s.release([Release(id="a", how=ARCHIVE)], sysid="1")
    job = await s.get_job("a", "a")
    assert (job.code, job.exitcode, job.result, job.attempts) == ("retry", 500, "r", 2)
    assert len(job.runs or []) == 1  # a release without a code is not a run


async def test_a_refunded_attempt_does_not_count(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a")])
    await s.claim("a-t", 1, sysid="1", lease=30)
    refund = Release(id="a", how=UNGET, code="retry", exitcode=503, refund_attempt=True)
    assert await s.release([refund], sysid="1") == {"a"}
    row = await rig.row("a")
    assert row is not None and row.attempts == 0 and row.due
    assert (await s.get_job("a", "a")).runs == []


async def test_release_applies_only_to_the_holders_jobs(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a"), new("w")])
    await s.claim("a-t", 1, sysid="1", lease=30)
    assert await s.release([], sysid="1") == set()
    ok = [Release(id=i, how=ARCHIVE, code="ok", exitcode=200) for i in ("a", "w", "unknown")]
    assert await s.release(ok, sysid="2") == set()  # not its job
    assert await s.release(ok, sysid="1") == {"a"}  # w waits, unknown is absent
    assert await s.release(ok, sysid="1") == set()  # done already
    assert (await rig.row("w")).lock == ""  # type: ignore[union-attr]


async def test_expired_leases_unlock_and_the_last_attempt_ends(rig: Rig) -> None:
    s = rig.store
    await s.put_handler("a-t", {"lang": "python", "body": "x", "maxAttempts": 2})
    await s.add_jobs([new("a"), new("b"), new("live")])
    await s.claim("a-t", 3, sysid="1", lease=30)
    assert await s.expire_locks() == []
    await rig.age("a", dt=1)
    await rig.age("b", dt=1)
    assert sorted(await s.expire_locks()) == [
        ExpiredLock("a", "a-t", 1, False),
        ExpiredLock("b", "a-t", 1, False),
    ]
    assert (await rig.row("a")).due  # type: ignore[union-attr]
    await s.claim("a-t", 1, sysid="1", lease=30)  # a's second attempt
    await rig.age("a", dt=1)
    assert await s.expire_locks() == [ExpiredLock("a", "a-t", 2, True)]
    job = await s.get_job("a", "a")
    assert (job.state, job.code, job.exitcode) == (JobState.DONE, "error", 500)
    assert [run["reason"] for run in job.runs or []] == ["lease-expired", "lease-expired"]
    assert (await rig.row("live")).lock == "1"  # type: ignore[union-attr]


async def test_the_jobs_of_a_lapsed_sysid_expire_whatever_their_lease(rig: Rig) -> None:
    s = rig.store
    sysid = await s.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    await s.add_jobs([new("a")])
    await s.claim("a-t", 1, sysid=sysid, lease=3600)
    await rig.lapse_sysid(sysid)
    assert await s.expire_locks() == [ExpiredLock("a", "a-t", 1, False)]


async def test_purge_deletes_jobs_done_long_enough_ago(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("old"), new("young"), new("waiting"), new("o2", "a-u")])
    await s.claim("a-t", 2, sysid="1", lease=30)
    await s.claim("a-u", 1, sysid="1", lease=30)
    done = [Release(id=i, how=ARCHIVE, code="ok", exitcode=200) for i in ("old", "young", "o2")]
    await s.release(done, sysid="1")
    await rig.age("old", done_dt=7200)
    await rig.age("o2", done_dt=7200)
    assert await s.purge(3600) == {"a-t": 1, "a-u": 1}
    assert await rig.row("old") is None and await rig.row("young") is not None
    assert await s.purge(3600) == {}


async def test_expire_waiting_ends_old_jobs_of_a_type(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("old", ago=600), new("young", ago=1), new("other", "a-u", ago=600)])
    assert await s.expire_waiting("a-t", 60, "no handler") == ["old"]
    job = await s.get_job("a", "old")
    assert (job.code, job.exitcode, job.result) == ("error", 503, "no handler")
    assert await s.expire_waiting("a-t", 60, "no handler") == []
    assert (await rig.row("young")).due  # type: ignore[union-attr]


async def test_unhandled_types_names_old_types_no_daemon_runs(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("h", "a-handled", ago=600), new("n", "a-none", ago=600)])
    await s.add_jobs([new("p", "a-pulled", ago=600), new("y", "a-young", ago=1)])
    await s.put_handler("a-handled", {"lang": "python", "body": "x"})
    await s.put_handler("a-pulled", {"lang": "worker"})
    sweep = await s.unhandled_types(60)
    assert sweep is not None
    assert sweep.expired == [("a-none", False), ("a-pulled", True)] and sweep.next_after is None
    first = await s.unhandled_types(60, steps=2)
    assert first is not None and first.next_after == "a-none"
    assert first.expired == [("a-none", False)]
    rest = await s.unhandled_types(60, after="a-none", steps=2)
    assert rest is not None and rest.expired == [("a-pulled", True)]
    assert rest.next_after == "a-young"


async def test_housekeeping_calls_answer_on_an_empty_store(rig: Rig) -> None:
    s = rig.store
    assert await s.fold_counts() is True
    await s.notify_jobs()
    assert await s.forget_workers() == 0
    assert await s.expire_locks() == []
    assert await s.purge(0) == {}
    assert await s.expire_deadlines() == []
    await s.ping()
