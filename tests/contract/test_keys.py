"""Concurrency keys (migration 0020): in a type whose live handler sets
keyConcurrency N, at most N jobs of one key are running at once, counted over
daemons' and workers' claims; the keys are served in turn; jobs without a key
are not capped; a type without the setting ignores keys."""

from __future__ import annotations

from collections import Counter

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.domain.pulled import OptedJobs
from tests.contract.conftest import Rig, new


async def _keyed(rig: Rig, key: str | None, *ids_ago: tuple[str, float], priority: int = 0) -> None:
    jobs = [new(i, ago=ago) for i, ago in ids_ago]
    group = OptedJobs(jobs=jobs, after=[], key=key, priority=priority)
    assert await rig.store.add_opted([group]) == len(jobs)


async def _cap(rig: Rig, n: int | None, lang: str = "python") -> None:
    data: dict[str, object] = {"lang": lang, "body": "" if lang == "worker" else "x"}
    if n is not None:
        data["keyConcurrency"] = n
    await rig.store.put_handler("a-t", data)


def _ok(*ids: str) -> list[Release]:
    return [Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for i in ids]


async def test_a_key_at_its_cap_is_skipped_until_one_of_its_jobs_ends(rig: Rig) -> None:
    s = rig.store
    await _cap(rig, 2)
    await _keyed(rig, "k", *((f"k{n}", 50 - n) for n in range(5)))
    first = await s.claim("a-t", 100, sysid="1", lease=30)
    assert [j.id for j in first] == ["k0", "k1"]
    assert {j.key for j in first} == {"k"}
    assert await s.claim("a-t", 100, sysid="2", lease=30) == []
    # a pull worker's claim is held to the same cap
    assert (
        await s.claim_pulled(
            "a-t", 9, lock="w:" + "0" * 32 + ":w", lease=30, client="a", worker="w"
        )
        == []
    )
    assert await s.release(_ok("k0"), sysid="1") == {"k0"}
    assert [j.id for j in await s.claim("a-t", 100, sysid="2", lease=30)] == ["k2"]


async def test_other_keys_and_jobs_without_a_key_are_taken_past_a_full_key(rig: Rig) -> None:
    s = rig.store
    await _cap(rig, 1)
    await _keyed(rig, "hot", *((f"h{n}", 100 - n) for n in range(20)))
    await _keyed(rig, "cold", ("c0", 10), ("c1", 9))
    await _keyed(rig, None, ("free0", 5), ("free1", 4))
    taken = {j.id for j in await s.claim("a-t", 100, sysid="1", lease=30)}
    assert taken == {"h0", "c0", "free0", "free1"}
    assert await s.claim("a-t", 100, sysid="1", lease=30) == []


async def test_a_claim_takes_a_keys_jobs_by_priority_then_age(rig: Rig) -> None:
    s = rig.store
    await _cap(rig, 2)
    await _keyed(rig, "k", ("old", 50), ("older", 60))
    await _keyed(rig, "k", ("urgent", 1), priority=10)
    assert [j.id for j in await s.claim("a-t", 100, sysid="1", lease=30)] == ["urgent", "older"]


async def test_the_keys_are_served_in_turn(rig: Rig) -> None:
    """Claims of one job each: every key gets one before any gets a second, even
    where one key's jobs are all older than the others' (oldest first would take
    all of a's first)."""
    s = rig.store
    await _cap(rig, 5)
    for age, key in ((300, "a"), (30, "b"), (20, "c")):
        await _keyed(rig, key, *((f"{key}{n}", age - n) for n in range(3)))
    taken: list[str] = []
    for _ in range(6):
        claimed = await s.claim("a-t", 1, sysid="1", lease=30)
        taken += [j.id for j in claimed]
    assert Counter(job[0] for job in taken[:3]) == {"a": 1, "b": 1, "c": 1}
    assert Counter(job[0] for job in taken) == {"a": 2, "b": 2, "c": 2}


async def test_a_type_without_key_concurrency_ignores_keys(rig: Rig) -> None:
    s = rig.store
    await _cap(rig, None)
    await _keyed(rig, "k", *((f"k{n}", 10 - n) for n in range(4)))
    claimed = await s.claim("a-t", 100, sysid="1", lease=30)
    assert [j.id for j in claimed] == ["k0", "k1", "k2", "k3"]


async def test_a_cap_counts_jobs_that_ran_before_it_was_set(rig: Rig) -> None:
    s = rig.store
    await _cap(rig, None)
    await _keyed(rig, "k", *((f"k{n}", 10 - n) for n in range(4)))
    assert len(await s.claim("a-t", 2, sysid="1", lease=30)) == 2
    await _cap(rig, 2)
    assert await s.claim("a-t", 100, sysid="1", lease=30) == []


async def test_a_paused_keyed_type_is_not_claimed(rig: Rig) -> None:
    s = rig.store
    await _cap(rig, 3)
    await _keyed(rig, "k", ("k0", 5))
    await s.pause_type("a", "a-t", paused=True, most=100)
    assert await s.claim("a-t", 100, sysid="1", lease=30) == []
    await s.pause_type("a", "a-t", paused=False, most=100)
    assert [j.id for j in await s.claim("a-t", 100, sysid="1", lease=30)] == ["k0"]


async def test_a_job_keeps_its_key_when_done_and_rerun(rig: Rig) -> None:
    s = rig.store
    await _cap(rig, 1)
    await _keyed(rig, "acct;42|x", ("j", 1))
    assert (await s.get_job("a", "j")).key == "acct;42|x"
    await s.claim("a-t", 1, sysid="1", lease=30)
    assert await s.release(_ok("j"), sysid="1") == {"j"}
    assert (await s.get_job("a", "j")).key == "acct;42|x"
    assert (await s.rerun_job("a", "j")).key == "acct;42|x"
    claimed = await s.claim_pulled(
        "a-t", 9, lock="w:" + "1" * 32 + ":w", lease=30, client="a", worker="w"
    )
    assert [(j.id, j.key) for j in claimed] == [("j", "acct;42|x")]
