"""A batch's follow-on jobs: per-run limits, the add rate and waiting limit, and
chunks journaled as results arrive (``queue_daemon.engine.admit.followons``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import pytest

from queue_daemon.domain.names import JobType
from queue_daemon.domain.options import JobOptions
from queue_daemon.domain.outcomes import Policy
from queue_daemon.engine.admit import followons
from queue_daemon.engine.admit.adds import Adds, OverWaiting
from queue_daemon.engine.admit.followons import OVER_LIMITS, FollowOns
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits, TenantLimits
from queue_daemon.engine.admit.quotas import RateLimiter, WaitingLimiter
from queue_daemon.engine.releases import BatchReleases
from queue_daemon.journal import JournalError
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.runners.models import HandlerSpec, JobResult
from queue_daemon.store.ports import TenantStore

SPEC = HandlerSpec(version="1", client="acme", type="parent", lang="shell", body="true")


class Waiting:
    """The store's count of waiting jobs, as the waiting limiter reads it."""

    def __init__(self, count: int = 0) -> None:
        self.count = count

    async def count_waiting(self, client: str) -> int:
        return self.count

    async def existing_jobs(self, ids: Sequence[str], *, client: str) -> set[str]:
        return set()


class Journal:
    """The intake's side of the journal: what was written, or failing."""

    def __init__(self, fail: bool = False) -> None:
        self.written: list[tuple[str, list[str]]] = []
        self.fail = fail

    async def add(
        self,
        jobtype: JobType,
        payloads: Sequence[str],
        *,
        create_ms: int,
        dt_ms: int,
        ids: list[str] | None = None,
        options: JobOptions | None = None,
    ) -> list[str]:
        if self.fail:
            raise JournalError("no space left on device")
        self.written.append((jobtype.name, list(payloads)))
        return [f"j{i}" for i in range(len(payloads))]

    def payloads(self) -> list[str]:
        return [p for _, chunk in self.written for p in chunk]


def make(
    journal: Journal,
    *,
    limits: TenantLimits | None = None,
    rate: tuple[float, float] = (0, 1),
    waiting: Waiting | None = None,
    spec: HandlerSpec = SPEC,
) -> tuple[FollowOns, dict[str, int]]:
    """Follow-ons of one batch, through a real admission over a fake store."""
    dropped: dict[str, int] = {}

    def count(client: str, reason: str, n: int) -> None:
        dropped[reason] = dropped.get(reason, 0) + n

    limits = limits or TenantLimits()
    store = waiting or Waiting()
    adds = Adds(
        intake=cast(Intake, journal),
        limits=Limits(limits),
        rates=RateLimiter(*rate),
        waiting=WaitingLimiter(cast(TenantStore, store)),
        jobs=store,
        queuelog=cast(QueueLog, None),  # only adds with dependencies write to it
        metrics=Metrics(),
    )
    return FollowOns(spec, limits, adds, count), dropped


def result(*emits: tuple[str, str], exitcode: int = 200, text: str | None = "done") -> JobResult:
    return JobResult(id="j1", exitcode=exitcode, result=text, emits=list(emits))


def said(kept: JobResult) -> str:
    return kept.result or ""


async def test_a_run_adds_at_most_its_count_and_bytes_and_says_what_it_dropped() -> None:
    journal = Journal()
    follow, dropped = make(journal, limits=TenantLimits(follow_ons=3, emit=10))
    kept = await follow.take(result(*[("kid", "abcd")] * 5))
    assert await follow.flush()
    assert journal.payloads() == ["abcd", "abcd"]  # the third is past 10 bytes
    assert kept.emits == []
    assert kept.result == (
        "done\n[3 follow-on job(s) dropped: 3 over this tenant's limit of 10 bytes of"
        " follow-on jobs per job]"
    )
    assert dropped == {"bytes": 3}
    follow, dropped = make(Journal(), limits=TenantLimits(follow_ons=2))
    kept = await follow.take(result(*[("kid", "a")] * 5))
    assert (
        kept.result is not None and "3 over this tenant's limit of 2 follow-on jobs" in kept.result
    )
    assert dropped == {"count": 3}


async def test_what_a_context_dropped_itself_counts_as_over_the_bytes() -> None:
    follow, dropped = make(Journal(), limits=TenantLimits(emit=10))
    kept = await follow.take(JobResult(id="j1", exitcode=200, emits=[("kid", "a")], emit_over=56))
    assert said(kept).startswith("[56 follow-on job(s) dropped")
    assert dropped == {"bytes": 56}
    assert follow.emit_limit() == 10  # what the context is told


async def test_invalid_follow_on_jobs_are_counted_and_leave_the_result_alone() -> None:
    follow, dropped = make(Journal())
    kept = await follow.take(
        JobResult(id="j1", exitcode=202, result="own", emits=[("kid", "a")], dropped=["bad type"])
    )
    assert (kept.exitcode, kept.result) == (202, "own")
    assert dropped == {"invalid": 1}


async def test_chunks_are_journaled_as_results_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(followons, "CHUNK_BYTES", 8)
    journal = Journal()
    follow, _ = make(journal)
    await follow.take(result(("kid", "abcd"), ("other", "efgh")))
    assert journal.written == [("kid", ["abcd"]), ("other", ["efgh"])]  # before the batch ends
    await follow.take(result(("kid", "ij")))
    assert await follow.flush()
    assert journal.written[-1] == ("kid", ["ij"])


async def test_a_failed_chunk_fails_the_batch() -> None:
    follow, _ = make(Journal(fail=True))
    await follow.take(result(("kid", "a")))
    assert not await follow.flush()


async def test_then_chains_an_ok_result_and_counts_like_any_follow_on_job() -> None:
    journal = Journal()
    spec = HandlerSpec(version="1", client="acme", type="p", lang="shell", body="", then="next")
    follow, _ = make(journal, spec=spec, limits=TenantLimits(follow_ons=1))
    kept = await follow.take(result(("kid", "a"), text="line one\nline two"))
    assert await follow.flush()
    assert journal.written == [("kid", ["a"])]
    assert "1 over this tenant's limit of 1" in said(kept)
    follow, _ = make(journal := Journal(), spec=spec)
    await follow.take(result(text="line one\nline two"))
    await follow.take(result(exitcode=500, text="failed"))
    assert await follow.flush()
    assert journal.written == [("next", ["line one line two"])]


async def test_over_the_add_rate_the_run_is_retried_and_nothing_is_added() -> None:
    journal = Journal()
    limits = TenantLimits(rate=1, burst=3)
    follow, dropped = make(journal, limits=limits, rate=(1, 3))
    assert (await follow.take(result(("kid", "a"), ("kid", "b")))).exitcode == 200
    refused = await follow.take(result(("kid", "c"), ("kid", "d")))
    assert refused.exitcode == OVER_LIMITS  # a retry code
    assert refused.result == "its 2 follow-on jobs are over this tenant's add rate; retried later"
    assert dropped == {"rate": 2}
    never = await follow.take(result(*[("kid", "e")] * 4))  # more than the burst: never fits
    assert never.exitcode == 200
    assert "4 at once is over this tenant's burst of 3" in said(never)
    assert await follow.flush()
    assert journal.payloads() == ["a", "b"]


async def test_contexts_are_told_to_send_no_more_than_the_add_rate_takes() -> None:
    emit = 4 << 20
    follow, _ = make(Journal(), limits=TenantLimits(rate=0, emit=emit), rate=(0, 1))
    assert (follow.emit_limit(), follow.emit_budget()) == (emit, None)  # no rate
    full = TenantLimits(rate=100, burst=200, emit=emit)
    follow, _ = make(Journal(), limits=full, rate=(100, 200))
    assert (follow.emit_limit(), follow.emit_budget()) == (emit, 200 * 65536)
    small = TenantLimits(rate=10, burst=20, emit=emit)
    follow, dropped = make(Journal(), limits=small, rate=(10, 20))
    assert follow.emit_limit() == 20 * 65536  # a run: the burst's bytes, never more fits
    # over that (not short of the budget): dropped as never fitting, not retried
    kept = await follow.take(JobResult(id="j1", exitcode=200, emit_over=2))
    assert kept.exitcode == 200 and dropped == {"bytes": 2}
    # the bucket spent: the batch's budget is what the rate takes now, and a run
    # whose context dropped follow-on jobs short of it runs again later
    half = "x" * (9 * 65536)
    spent = await follow.take(result(("kid", half), ("kid", half)))  # 2 + 18 tokens: all
    assert spent.exitcode == 200
    budget = follow.emit_budget()
    assert budget is not None and budget < 65536
    retried = await follow.take(
        JobResult(id="j2", exitcode=200, emit_over=3, emit_short=3, emit_cost=3 * 65536)
    )
    assert retried.exitcode == OVER_LIMITS
    assert retried.result == "its follow-on jobs are over this tenant's add rate; retried later"
    assert dropped == {"bytes": 2, "rate": 3}
    # short, but what it wanted could never fit the burst: dropped, not retried
    never = await follow.take(
        JobResult(id="j3", exitcode=200, emit_over=1, emit_short=1, emit_cost=21 * 65536)
    )
    assert never.exitcode == 200 and dropped["bytes"] == 3


async def test_batches_running_at_once_share_the_rates_room() -> None:
    # each batch told all of it, 25 contexts at once sent the daemon 25 times what
    # the rate then took: megabytes read and decoded only to be refused
    limits = TenantLimits(rate=100, burst=200)
    first, _ = make(Journal(), limits=limits, rate=(100, 200))
    adds = first._adds  # one daemon's admission: every batch of the tenant meets here
    token = 65536  # the bucket refills while the test runs: figures within one token

    def near(budget: int | None, expected: float) -> bool:
        return budget is not None and abs(budget - expected) <= token

    def another(type: str = "parent") -> FollowOns:
        spec = HandlerSpec(version="1", client="acme", type=type, lang="shell", body="true")
        return FollowOns(spec, limits, adds, lambda client, reason, n: None)

    assert near(first.emit_budget(), 200 * token)  # alone in its type's pool
    await first.take(result(("kid", "a")))  # now its type's runs have emitted (a token)
    assert adds.emits("acme", "parent")
    room = 199 * token
    # a type that never emitted shares with its own other batches only, never
    # with those of the types that emit, nor with other quiet types
    quiet = another("quiet")
    assert near(quiet.emit_budget(), room)
    second, third = another(), another()
    assert near(first.emit_budget(), room)  # asked again: now with those that emit
    assert near(second.emit_budget(), room / 2)
    assert near(third.emit_budget(), room / 3)
    assert near(third.emit_budget(), room / 3)  # asked again: its own share counts once
    assert near(another("quiet").emit_budget(), room / 2)  # beside the first quiet one
    assert near(another("hush").emit_budget(), room)
    assert await first.flush()  # a chunk's flush does not end the batch
    assert near(another().emit_budget(), room / 4)
    first.end()
    second.abandon()
    second.end()
    first.end()  # ended once only
    assert near(another().emit_budget(), room / 3)  # third and the one before: 2 others
    # the first batches of a type not yet seen to emit share too: of a tenant
    # starting batches at once of a type that emits megabytes, the k-th gets
    # 1/k of the room (25 of them about 3.8 rooms in all, not 25)
    other = HandlerSpec(version="1", client="other", type="parent", lang="shell", body="true")
    untried = [FollowOns(other, limits, adds, lambda c, r, n: None) for _ in range(4)]
    budgets = [batch.emit_budget() for batch in untried]
    assert all(near(budget, 200 * token / k) for k, budget in enumerate(budgets, 1))
    assert adds._sharing[("other", "parent")] == 4
    await untried[0].take(result(("kid", "b")))  # the type emits now
    for batch in untried:
        batch.end()  # each gives back to the pool it took from
    assert not any(client == "other" for client, _ in adds._sharing)


async def test_a_batch_ends_its_share_however_it_ends() -> None:
    limits = TenantLimits(rate=100, burst=200)
    releases_ok, _ = make(Journal(), limits=limits, rate=(100, 200))
    adds = releases_ok._adds
    adds.emitted("acme", "parent")
    batch = BatchReleases(releases_ok, Policy(job_ttl=60.0), limits.result)
    releases_ok.emit_budget()
    assert adds._sharing == {("acme", None): 1}
    assert await batch.flush()
    failed = FollowOns(SPEC, limits, adds, lambda c, r, n: None)
    failed.emit_budget()
    BatchReleases(failed, Policy(job_ttl=60.0), limits.result).abandon()
    assert adds._sharing == {}


async def test_over_the_waiting_limit_the_run_is_retried_and_nothing_is_added() -> None:
    journal = Journal()
    follow, dropped = make(journal, limits=TenantLimits(waiting=10), waiting=Waiting(count=8))
    assert (await follow.take(result(("kid", "a"), ("kid", "b")))).exitcode == 200
    refused = await follow.take(result(("kid", "c")))
    assert refused.exitcode == OVER_LIMITS
    assert (
        refused.result is not None and "limit of 10 waiting jobs; retried later" in refused.result
    )
    never = await follow.take(result(*[("kid", "x")] * 11))
    assert never.exitcode == 200
    assert (
        never.result is not None and "11 is over this tenant's waiting limit of 10" in never.result
    )
    assert await follow.flush()
    assert journal.payloads() == ["a", "b"]
    assert dropped == {"waiting": 12}


async def test_a_batch_that_ends_without_its_flush_gives_its_follow_ons_back() -> None:
    """Admitted follow-on jobs hold waiting-limit slots until journaled: a batch
    cancelled (a deadline, a drain) before its flush gives them back, or the
    tenant would stay at its limit until the daemon restarts."""
    limits = TenantLimits(waiting=10)
    follow, _ = make(Journal(), limits=limits)
    for _ in range(2):
        await follow.take(result(*[("kid", "a")] * 5))
    adds = follow._adds
    with pytest.raises(OverWaiting):
        await adds.admit("acme", 1, 1)
    follow.abandon()
    await adds.admit("acme", 10, 10)  # every slot is free again


async def test_a_flush_cancelled_midway_gives_back_the_chunks_not_written() -> None:
    writing = asyncio.Event()

    class Stalling(Journal):
        async def add(self, jobtype: JobType, payloads: Sequence[str], **kw: object) -> list[str]:
            writing.set()
            await asyncio.Event().wait()  # a journal write that never ends
            raise AssertionError("unreachable")

    follow, _ = make(cast(Journal, Stalling()), limits=TenantLimits(waiting=10))
    await follow.take(result(("a", "x"), ("b", "y"), ("c", "z")))
    flushing = asyncio.ensure_future(follow.flush())
    await asyncio.wait_for(writing.wait(), 5)
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    # the chunk being written and the two not begun are all given back
    await follow._adds.admit("acme", 10, 10)
