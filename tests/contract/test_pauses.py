"""Pausing: a paused type's or tenant's jobs wait, and no claim of any kind takes them."""

from __future__ import annotations

import pytest

from queue_daemon.domain.jobs import Dispatch
from queue_daemon.domain.views import Paused
from queue_daemon.store.errors import LimitReached, NotFound
from tests.contract.conftest import Rig, new

LOCK = "w:" + "0" * 32 + ":w1"


async def test_a_paused_type_is_neither_listed_nor_claimed_until_resumed(rig: Rig) -> None:
    s = rig.store
    await s.put_handler("a-t", {"lang": "python", "body": "x"})
    await s.put_handler("a-u", {"lang": "python", "body": "x"})
    await s.add_jobs([new("t1"), new("t2"), new("u1", "a-u")])
    await s.pause_type("a", "a-t", paused=True, most=10)
    await s.pause_type("a", "a-t", paused=True, most=10)  # again: still paused
    assert await s.paused("a") == Paused(types=frozenset({"t"}))
    assert await s.waiting_jobtypes() == {"a-u": 1}
    assert await s.claim("a-t", 5, sysid="1", lease=30) == []
    assert [j.id for j in await s.claim("a-u", 5, sysid="1", lease=30)] == ["u1"]
    assert (await rig.row("t1")).due  # type: ignore[union-attr]
    await s.pause_type("a", "a-t", paused=False, most=10)
    await s.pause_type("a", "a-t", paused=False, most=10)  # again: nothing to resume
    assert await s.paused("a") == Paused()
    assert await s.waiting_jobtypes() == {"a-t": 2}
    assert [j.id for j in await s.claim("a-t", 5, sysid="1", lease=30)] == ["t1", "t2"]


async def test_a_paused_tenant_stops_every_type_of_its_own_only(rig: Rig) -> None:
    s = rig.store
    await s.add_tenant("a", b"ta")
    for type in ("a-t", "a-u", "b-t"):
        await s.put_handler(type, {"lang": "python", "body": "x"})
    await s.add_jobs([new("t1"), new("u1", "a-u"), new("b1", "b-t")])
    await s.pause_tenant("a", paused=True)
    await s.pause_type("a", "a-u", paused=True, most=10)
    assert await s.paused("a") == Paused(tenant=True, types=frozenset({"u"}))
    assert await s.paused("b") == Paused()
    assert await s.waiting_jobtypes() == {"b-t": 1}
    assert await s.claim("a-t", 5, sysid="1", lease=30) == []
    await s.pause_tenant("a", paused=False)
    assert await s.waiting_jobtypes() == {"a-t": 1, "b-t": 1}  # a-u is paused itself
    with pytest.raises(NotFound):
        await s.pause_tenant("nobody", paused=True)
    await s.pause_tenant("nobody", paused=False)  # nothing to resume: no error
    # under --no-auth every name is a tenant
    await s.pause_tenant("nobody", paused=True, known=False)
    assert await s.paused("nobody") == Paused(tenant=True)


async def test_a_paused_pulled_type_gives_its_workers_nothing(rig: Rig) -> None:
    s = rig.store
    await s.put_handler("a-t", {"lang": "worker"})
    await s.add_jobs([new("a"), new("b")])
    await s.pause_type("a", "a-t", paused=True, most=10)
    assert await s.claim_pulled("a-t", 5, lock=LOCK, lease=30, client="a", worker="w1") == []
    await s.pause_type("a", "a-t", paused=False, most=10)
    jobs = await s.claim_pulled("a-t", 5, lock=LOCK, lease=30, client="a", worker="w1")
    assert [j.id for j in jobs] == ["a", "b"]


async def test_an_add_dispatched_to_a_paused_type_waits(rig: Rig) -> None:
    s = rig.store
    await s.put_handler("a-t", {"lang": "python", "body": "x"})
    await s.put_handler("a-u", {"lang": "python", "body": "x"})
    sysid = await s.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    await s.pause_type("a", "a-t", paused=True, most=10)
    dispatch = Dispatch(ids=frozenset({"d1", "d2"}), sysid=sysid, lease=60.0)
    added, claimed = await s.add_dispatched([new("d1"), new("d2", "a-u")], dispatch)
    assert added == 2 and [c.id for c in claimed] == ["d2"]
    row = await rig.row("d1")
    assert row is not None and row.lock == "" and row.attempts == 0


async def test_jobs_a_daemon_runs_are_stored_claimed_again_though_paused(rig: Rig) -> None:
    s = rig.store
    sysid = await s.reserve_sysid(None, holder="h", host="x", data_dir="/d", lease=60)
    await s.pause_type("a", "a-t", paused=True, most=10)
    again = Dispatch(ids=frozenset({"r1"}), sysid=sysid, lease=60.0, running=True)
    added, claimed = await s.add_dispatched([new("r1"), new("w1")], again, fresh=False)
    assert added == 2 and [job.id for job in claimed] == ["r1"]
    row = await rig.row("w1")
    assert row is not None and row.lock == ""


async def test_a_paused_type_without_a_handler_is_not_expired(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("n", "a-none", ago=600), new("p", "a-held", ago=600)])
    await s.pause_type("a", "a-held", paused=True, most=10)
    sweep = await s.unhandled_types(60)
    assert sweep is not None and sweep.expired == [("a-none", False)]
    assert await s.expire_waiting("a-held", 60, "no handler") == []  # paused since the sweep


async def test_a_tenant_pauses_at_most_so_many_types(rig: Rig) -> None:
    s = rig.store
    await s.add_tenant("a", b"ta")
    await s.pause_tenant("a", paused=True)  # the tenant's own pause is not a type's
    await s.pause_type("a", "a-t1", paused=True, most=2)
    await s.pause_type("a", "a-t2", paused=True, most=2)
    await s.pause_type("b", "b-t1", paused=True, most=2)  # another tenant's count
    await s.pause_type("a", "a-t2", paused=True, most=2)  # paused already: no error
    with pytest.raises(LimitReached):
        await s.pause_type("a", "a-t3", paused=True, most=2)
    await s.pause_type("a", "a-t1", paused=False, most=2)
    await s.pause_type("a", "a-t3", paused=True, most=2)
    assert await s.paused("a") == Paused(tenant=True, types=frozenset({"t2", "t3"}))
    assert await s.paused_counts() == {"a": (True, 2), "b": (False, 1)}
