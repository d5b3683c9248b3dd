"""Dashboard: depths, running jobs, failures, leases, throughput. Compared as
counts and ids; times only by order."""

from __future__ import annotations

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.domain.views import QueueDepth
from tests.contract.conftest import Rig, new

LOCK = "w:" + "0" * 32 + ":w9"


async def _world(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("w1", ago=30), new("w2", ago=20), new("f1", ago=-3600)])
    await s.add_jobs([new("r1", "a-u"), new("d1", "a-u"), new("d2", "a-u"), new("p1", "a-p")])
    await s.add_jobs([new("x1", "b-t")])
    await s.add_opted([OptedJobs(jobs=[new("b1")], after=["w1"])])
    await s.claim("a-u", 3, sysid="1", lease=30)
    await s.claim_pulled("a-p", 1, lock=LOCK, lease=30, client="a", worker="w9")
    await s.release(
        [
            Release(id="d1", how=ReleaseHow.ARCHIVE, code="failed", exitcode=1, result="x" * 50),
            Release(id="d2", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200),
        ],
        sysid="1",
    )


async def test_queue_depths_per_type(rig: Rig) -> None:
    await _world(rig)
    s = rig.store
    assert await s.queue_depths("a", 10, 100) == [
        QueueDepth(type="a-p", running=1),
        QueueDepth(type="a-t", waiting=2, scheduled=1, blocked=1),
        QueueDepth(type="a-u", running=1, done_ok=1, done_failed=1),
    ]
    everyone = await s.queue_depths(None, 2, 100)
    assert [d.type for d in everyone] == ["a-p", "a-t"]
    capped = await s.queue_depths("a", 10, 1)
    assert [(d.type, d.waiting, d.scheduled, d.capped) for d in capped][1] == ("a-t", 1, 1, True)
    assert await s.queue_depths("nobody", 10, 100) == []
    await s.pause_type("a", "a-t", paused=True, most=10)
    await s.pause_tenant("b", paused=True, known=False)
    paused = {d.type: d.paused for d in await s.queue_depths(None, 10, 100)}
    assert paused == {"a-p": False, "a-t": True, "a-u": False, "b-t": True}


async def test_running_jobs_oldest_first_with_the_total(rig: Rig) -> None:
    await _world(rig)
    s = rig.store
    running = await s.running_jobs(None, 1)
    assert running.total == 2 and len(running.oldest) == 1
    both = await s.running_jobs("a", 10)
    assert {(j.id, j.sysid) for j in both.oldest} == {("r1", "1"), ("p1", "worker:w9")}
    assert (await s.running_jobs("b", 10)).total == 0


async def test_recent_failures_newest_first_cut_to_size(rig: Rig) -> None:
    await _world(rig)
    s = rig.store
    (failed,) = await s.recent_failures("a", 10, 10)
    assert (failed.id, failed.code, failed.result, failed.result_cut) == (
        "d1",
        "failed",
        "x" * 10,
        True,
    )
    assert await s.recent_failures("b", 10, 10) == []
    assert [f.id for f in await s.recent_failures(None, 10, 100)] == ["d1"]


async def test_daemon_leases_live_first(rig: Rig) -> None:
    s = rig.store
    one = await s.reserve_sysid(None, holder="h1", host="x", data_dir="/d1", lease=60)
    two = await s.reserve_sysid(None, holder="h2", host="y", data_dir="/d2", lease=60)
    await s.release_sysid(one, holder="h1")
    leases = await s.daemon_leases(10)
    assert [(d.sysid, d.state, d.host, d.data_dir) for d in leases] == [
        (two, "live", "y", "/d2"),
        (one, "released", "x", "/d1"),
    ]
    assert len(await s.daemon_leases(1)) == 1


async def test_archived_counts_only_grow(rig: Rig) -> None:
    await _world(rig)
    s = rig.store
    assert await s.archived_counts() == {"a-u": 2}
    await rig.age("d1", done_dt=7200)
    await s.purge(3600)
    assert await s.archived_counts() == {"a-u": 2}
    assert (await s.queue_depths("a", 10, 100))[2] == QueueDepth(type="a-u", running=1, done_ok=1)
