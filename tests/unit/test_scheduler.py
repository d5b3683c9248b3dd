"""The scheduler: fairness between tenants and types, caps and warm preference, by simulation."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Mapping

import pytest

from queue_daemon.domain.names import JobType
from queue_daemon.scheduler import Pick, Scheduler, SchedulerError, busy_tenants

STEPS = 10_000
TOLERANCE = 0.10  # a share may be off its fair value by 10% of that value


class Sim:
    """A deterministic workload: pick, claim, finish some running jobs, refill queues.

    `queues` maps each jobtype to its starting depth; jobtypes in `refill` are
    topped back up to that depth after every step (continuous arrivals).
    Each step makes up to `picks_per_step` picks, as the daemon does while slots
    are free, then each running job finishes with probability `finish_p`.
    Every invariant is checked on every pick.
    """

    def __init__(
        self,
        queues: Mapping[str, int],
        *,
        concurrency: int = 20,
        tenant_running: int | None = None,
        refill: bool = True,
        finish_p: float = 0.2,
        picks_per_step: int = 1,
        seed: int = 1,
        warm: frozenset[str] = frozenset(),
    ) -> None:
        self.scheduler = Scheduler(concurrency=concurrency, tenant_running=tenant_running)
        self.depth = dict(queues)
        self.waiting = dict(queues)
        self.concurrency = concurrency
        self.cap = tenant_running
        self.refill = refill
        self.finish_p = finish_p
        self.picks_per_step = picks_per_step
        self.rng = random.Random(seed)
        self.warm = warm
        self.running: Counter[str] = Counter()
        self.started: Counter[str] = Counter()
        self.picks = 0
        self.history: list[Pick | None] = []

    def pick(self) -> Pick | None:
        free_before = self.scheduler.free_slots()
        pick = self.scheduler.select_jobtype(self.waiting, self.warm)
        self.history.append(pick)
        self.picks += 1
        if pick is None:
            assert free_before == 0 or self._all_waiting_tenants_capped()
            return None
        assert free_before > 0
        assert 1 <= pick.limit <= min(free_before, self.waiting[pick.jobtype])
        claimed = pick.limit  # the store hands back as many as asked for (they are waiting)
        self.waiting[pick.jobtype] -= claimed
        self.scheduler.jobs_started(pick.jobtype, claimed)
        self.running[pick.jobtype] += claimed
        self.started[pick.jobtype] += claimed
        self._check_counts()
        return pick

    def step(self) -> None:
        for _ in range(self.picks_per_step):
            if self.pick() is None:
                break
        self.finish_some()
        if self.refill:
            for jobtype, depth in self.depth.items():
                self.waiting[jobtype] = max(self.waiting[jobtype], depth)

    def finish_some(self) -> None:
        for jobtype in sorted(self.running):
            done = sum(self.rng.random() < self.finish_p for _ in range(self.running[jobtype]))
            if done:
                self.running[jobtype] -= done
                self.scheduler.jobs_stopped(jobtype, done)
        self._check_counts()

    def run(self, picks: int) -> None:
        start = self.picks
        while self.picks - start < picks:
            self.step()

    def tenant_shares(self) -> dict[str, float]:
        by_tenant: Counter[str] = Counter()
        for jobtype, count in self.started.items():
            by_tenant[JobType.client_of(jobtype)] += count
        total = sum(by_tenant.values())
        return {tenant: count / total for tenant, count in sorted(by_tenant.items())}

    def type_shares(self, tenant: str) -> dict[str, float]:
        mine = {jt: n for jt, n in self.started.items() if JobType.client_of(jt) == tenant}
        total = sum(mine.values())
        return {jt: n / total for jt, n in sorted(mine.items())}

    def tenant_running(self) -> Counter[str]:
        by_tenant: Counter[str] = Counter()
        for jobtype, count in self.running.items():
            by_tenant[JobType.client_of(jobtype)] += count
        return by_tenant

    def _all_waiting_tenants_capped(self) -> bool:
        if self.cap is None:
            return False
        running = self.tenant_running()
        tenants = {JobType.client_of(jt) for jt, n in self.waiting.items() if n > 0}
        return all(running[t] >= self.cap for t in tenants)

    def _check_counts(self) -> None:
        total = sum(self.running.values())
        assert self.scheduler.running == total
        assert total <= self.concurrency
        assert self.scheduler.free_slots() == self.concurrency - total
        for jobtype, count in self.running.items():
            assert count >= 0
            assert self.scheduler.running_of(jobtype) == count
        for tenant, count in self.tenant_running().items():
            assert self.scheduler.running_of_tenant(tenant) == count
            if self.cap is not None:
                assert count <= self.cap


def assert_fair(shares: Mapping[str, float], what: str) -> None:
    fair = 1 / len(shares)
    print(f"{what}: " + ", ".join(f"{name}={share:.3f}" for name, share in shares.items()))
    for name, share in shares.items():
        assert abs(share - fair) <= TOLERANCE * fair, (name, share, fair)


# --- fairness between tenants -------------------------------------------------------------


@pytest.mark.parametrize("picks_per_step", [1, 4])
def test_deep_queue_does_not_starve_shallow_tenant(picks_per_step: int) -> None:
    sim = Sim({"big-work": 1_000_000, "small-work": 10}, picks_per_step=picks_per_step)
    sim.run(STEPS)
    assert_fair(sim.tenant_shares(), f"two tenants, {picks_per_step} picks/step")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_five_tenants_with_different_types_and_depths_share_equally(seed: int) -> None:
    queues = {"t1-only": 1_000_000}
    queues |= {f"t2-k{i}": 200_000 for i in range(3)}
    queues |= {f"t3-k{i}": 50 for i in range(5)}
    queues |= {f"t4-k{i}": 4 for i in range(2)}
    queues |= {f"t5-k{i}": 1_000 for i in range(10)}
    sim = Sim(queues, concurrency=50, seed=seed, picks_per_step=3)
    sim.run(STEPS)
    assert_fair(sim.tenant_shares(), f"five tenants, seed {seed}")


def test_types_of_one_tenant_share_equally() -> None:
    queues = {"acme-a": 1_000_000, "acme-b": 100, "acme-c": 10, "acme-d": 6, "other-x": 1_000_000}
    sim = Sim(queues, concurrency=40, picks_per_step=2)
    sim.run(STEPS)
    assert_fair(sim.tenant_shares(), "tenants")
    assert_fair(sim.type_shares("acme"), "acme's types")


def test_equal_tenants_alternate_one_slot() -> None:
    scheduler = Scheduler(concurrency=1)
    waiting = {"a-x": 100, "b-x": 100}
    order = []
    for _ in range(6):
        pick = scheduler.select_jobtype(waiting)
        assert pick is not None
        assert pick.limit == 1
        order.append(JobType.client_of(pick.jobtype))
        scheduler.jobs_started(pick.jobtype, 1)
        assert scheduler.select_jobtype(waiting) is None
        scheduler.jobs_stopped(pick.jobtype, 1)
    assert order == ["a", "b", "a", "b", "a", "b"]


# --- a newcomer is served at once ---------------------------------------------------------


def test_newcomer_with_one_job_takes_the_next_free_slot() -> None:
    scheduler = Scheduler(concurrency=10)
    waiting = {"big-work": 1_000_000}
    while (pick := scheduler.select_jobtype(waiting)) is not None:
        scheduler.jobs_started(pick.jobtype, pick.limit)
    assert scheduler.running == 10
    waiting["new-job"] = 1
    assert scheduler.select_jobtype(waiting) is None  # full: nothing to hand out
    scheduler.jobs_stopped("big-work", 1)
    assert scheduler.select_jobtype(waiting) == Pick(jobtype="new-job", limit=1)


@pytest.mark.parametrize("busy_tenants", [1, 5])
def test_newcomer_started_within_two_picks_in_a_running_workload(busy_tenants: int) -> None:
    queues = {f"busy{i}-work": 1_000_000 for i in range(busy_tenants)}
    sim = Sim(queues, concurrency=30, picks_per_step=2, refill=False)
    sim.run(2_000)
    for arrival in range(20):
        newcomer = f"new{arrival}-job"
        sim.waiting[newcomer] = 1
        picks_with_free_slot = 0
        while sim.started[newcomer] == 0:
            if sim.scheduler.free_slots() > 0:
                picks_with_free_slot += 1
            if sim.pick() is None:
                sim.finish_some()
        assert picks_with_free_slot <= 2, (arrival, picks_with_free_slot)
        sim.run(50)


# --- caps ---------------------------------------------------------------------------------


def test_tenant_running_and_concurrency_hold_at_every_step() -> None:
    queues = {"a-x": 1_000_000, "a-y": 1_000_000, "b-x": 1_000_000, "c-x": 3}
    sim = Sim(queues, concurrency=20, tenant_running=6, picks_per_step=5)
    sim.run(STEPS)  # Sim checks both caps after every pick and every finish
    assert max(sim.scheduler.running_of_tenant(t) for t in "abc") <= 6
    assert_fair(sim.tenant_shares(), "capped a/b/c")


def test_capped_tenant_gets_none_while_slots_are_free() -> None:
    scheduler = Scheduler(concurrency=10, tenant_running=3)
    waiting = {"a-x": 100, "a-y": 100}
    pick = scheduler.select_jobtype(waiting)
    assert pick == Pick(jobtype="a-x", limit=3)
    scheduler.jobs_started("a-x", 3)
    assert scheduler.free_slots() == 7
    assert scheduler.select_jobtype(waiting) is None
    waiting["b-x"] = 100
    pick = scheduler.select_jobtype(waiting)
    assert pick is not None
    assert pick.jobtype == "b-x"
    assert pick.limit == 3  # b's remaining cap, not all 7 free slots
    scheduler.jobs_started("b-x", 3)
    scheduler.jobs_stopped("a-x", 1)
    # a is below its cap again; of its types, a-y has fewer running
    assert scheduler.select_jobtype(waiting) == Pick(jobtype="a-y", limit=1)


def test_per_tenant_caps_override_the_default() -> None:
    scheduler = Scheduler(concurrency=10, tenant_running=4)
    scheduler.set_tenant_caps({"a": 1, "b": None})
    waiting = {"a-x": 100, "b-x": 100, "c-x": 100}
    picks = {}
    for _ in range(3):
        pick = scheduler.select_jobtype(waiting)
        assert pick is not None
        picks[pick.jobtype] = pick.limit
        scheduler.jobs_started(pick.jobtype, pick.limit)
    assert picks["a-x"] == 1  # its own cap
    assert picks["c-x"] <= 4  # the default cap
    assert scheduler.running_of_tenant("b") > 0  # no cap: the rest of its fair share
    assert scheduler.select_jobtype({"a-x": 100}) is None  # a is at its cap
    scheduler.set_tenant_caps({})  # back to the default for everyone
    assert scheduler.select_jobtype({"a-x": 100}) is not None
    with pytest.raises(SchedulerError):
        scheduler.set_tenant_caps({"a": 0})


def test_none_when_full_or_nothing_waiting() -> None:
    scheduler = Scheduler(concurrency=2)
    assert scheduler.select_jobtype({}) is None
    assert scheduler.select_jobtype({"a-x": 0}) is None
    scheduler.jobs_started("a-x", 2)
    assert scheduler.free_slots() == 0
    assert scheduler.select_jobtype({"b-x": 5}) is None
    assert Scheduler(concurrency=0).select_jobtype({"a-x": 1}) is None


# --- limit --------------------------------------------------------------------------------


def test_limit_is_bounded_by_batch_free_slots_and_waiting() -> None:
    assert Scheduler(concurrency=500, max_batch=100).select_jobtype({"a-x": 10**6}) == Pick(
        jobtype="a-x", limit=100
    )
    assert Scheduler(concurrency=30).select_jobtype({"a-x": 10**6}) == Pick(jobtype="a-x", limit=30)
    assert Scheduler(concurrency=30).select_jobtype({"a-x": 7}) == Pick(jobtype="a-x", limit=7)


def test_limit_leaves_slots_for_other_waiting_tenants() -> None:
    scheduler = Scheduler(concurrency=30)
    waiting = {"a-x": 10**6, "b-x": 10**6, "c-x": 10**6}
    limits = []
    for _ in range(3):
        pick = scheduler.select_jobtype(waiting)
        assert pick is not None
        limits.append((JobType.client_of(pick.jobtype), pick.limit))
        scheduler.jobs_started(pick.jobtype, pick.limit)
    assert limits == [("a", 10), ("b", 6), ("c", 4)]
    # every tenant came up within one round; the rest is handed out by running count
    assert scheduler.free_slots() == 10


def test_limit_is_at_least_one_with_more_tenants_than_slots() -> None:
    scheduler = Scheduler(concurrency=3)
    waiting = {f"t{i}-x": 5 for i in range(10)}
    seen = set()
    for _ in range(3):
        pick = scheduler.select_jobtype(waiting)
        assert pick is not None
        assert pick.limit == 1
        seen.add(pick.jobtype)
        scheduler.jobs_started(pick.jobtype, 1)
    assert len(seen) == 3


# --- types of one tenant, warm contexts ---------------------------------------------------


def test_warm_type_wins_between_equally_served_types() -> None:
    for hot in ("acme-x", "acme-y"):
        scheduler = Scheduler(concurrency=10)
        pick = scheduler.select_jobtype({"acme-x": 5, "acme-y": 5}, frozenset({hot}))
        assert pick is not None
        assert pick.jobtype == hot


def test_warm_does_not_beat_a_less_served_type() -> None:
    scheduler = Scheduler(concurrency=10)
    scheduler.jobs_started("acme-y", 1)
    pick = scheduler.select_jobtype({"acme-x": 5, "acme-y": 5}, frozenset({"acme-y"}))
    assert pick is not None
    assert pick.jobtype == "acme-x"


def test_warm_does_not_pick_the_tenant() -> None:
    scheduler = Scheduler(concurrency=10)
    scheduler.jobs_started("a-x", 1)
    pick = scheduler.select_jobtype({"a-x": 5, "b-x": 5}, frozenset({"a-x"}))
    assert pick is not None
    assert pick.jobtype == "b-x"


@pytest.mark.parametrize("picks_per_step", [1, 4])
def test_warmth_never_buys_a_tenant_more_than_its_share(picks_per_step: int) -> None:
    queues = {"a-hot": 1_000_000, "a-cold": 1_000_000, "b-x": 10}
    sim = Sim(queues, picks_per_step=picks_per_step, warm=frozenset({"a-hot"}))
    sim.run(STEPS)
    assert_fair(sim.tenant_shares(), f"warm a-hot, {picks_per_step} picks/step")


def test_empty_claim_still_moves_the_turn_on() -> None:
    scheduler = Scheduler(concurrency=10)
    waiting = {"acme-x": 5, "acme-y": 5}  # counts are estimates: acme-x is really empty
    first = scheduler.select_jobtype(waiting)
    assert first is not None
    second = scheduler.select_jobtype(waiting)  # nothing started for the first pick
    assert second is not None
    assert {first.jobtype, second.jobtype} == {"acme-x", "acme-y"}


# --- counting -----------------------------------------------------------------------------


def test_tenant_is_the_name_before_the_first_dash() -> None:
    assert JobType.client_of("acme-img-resize") == "acme"
    scheduler = Scheduler(concurrency=10, tenant_running=3)
    scheduler.jobs_started("acme-img-resize", 2)
    scheduler.jobs_started("acme-mail", 1)
    assert scheduler.running_of_tenant("acme") == 3
    assert scheduler.running_of("acme-img-resize") == 2
    assert scheduler.select_jobtype({"acme-img-resize": 5, "acme-mail": 5}) is None


def test_counts_never_go_negative() -> None:
    scheduler = Scheduler(concurrency=10)
    scheduler.jobs_stopped("nobody-x", 5)  # unknown: no-op
    assert scheduler.running == 0
    scheduler.jobs_started("a-x", 2)
    scheduler.jobs_started("a-y", 1)
    scheduler.jobs_stopped("a-x", 5)
    assert scheduler.running_of("a-x") == 0
    assert scheduler.running_of("a-y") == 1
    assert scheduler.running_of_tenant("a") == 1
    assert scheduler.running == 1
    scheduler.jobs_started("a-x", 0)
    scheduler.jobs_stopped("a-y", 0)
    assert scheduler.running == 1
    assert scheduler.free_slots() == 9


def test_running_past_concurrency_reports_no_free_slots() -> None:
    scheduler = Scheduler(concurrency=2)
    scheduler.jobs_started("a-x", 5)  # the daemon reports what it really started
    assert scheduler.free_slots() == 0
    assert scheduler.select_jobtype({"b-x": 1}) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": -1},
        {"concurrency": 1, "tenant_running": 0},
        {"concurrency": 1, "max_batch": 0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(SchedulerError):
        Scheduler(**kwargs)


def test_negative_counts_are_refused() -> None:
    scheduler = Scheduler(concurrency=2)
    with pytest.raises(SchedulerError):
        scheduler.jobs_started("a-x", -1)
    with pytest.raises(SchedulerError):
        scheduler.jobs_stopped("a-x", -1)


# --- performance --------------------------------------------------------------------------


def test_select_with_a_thousand_waiting_types_is_fast() -> None:
    rng = random.Random(7)
    waiting = {f"t{t}-type{k}": rng.randint(1, 10**6) for t in range(100) for k in range(10)}
    scheduler = Scheduler(concurrency=10_000, tenant_running=200)
    for jobtype in rng.sample(sorted(waiting), 400):
        scheduler.jobs_started(jobtype, rng.randint(1, 5))
    warm = frozenset(rng.sample(sorted(waiting), 100))
    rounds = 500
    began = time.perf_counter()
    for _ in range(rounds):
        pick = scheduler.select_jobtype(waiting, warm)
        assert pick is not None
    per_call = (time.perf_counter() - began) / rounds
    print(f"select_jobtype over {len(waiting)} waiting types: {per_call * 1e6:.0f} µs per call")


# ---- busy tenants: more contexts at once than their share of the cores


def test_no_tenant_is_busy_when_nothing_runs() -> None:
    assert busy_tenants({}, 2) == frozenset()
    assert busy_tenants({"acme": 0}, 2) == frozenset()


def test_a_flood_of_contexts_is_busy_beside_a_tenant_with_one() -> None:
    assert busy_tenants({"calm": 1, "flood": 4}, 2) == {"flood"}
    # alone, the flood's share is every core, and there is no one to yield to
    assert busy_tenants({"flood": 2}, 2) == frozenset()
    assert busy_tenants({"flood": 3}, 2) == frozenset()


def test_one_context_at_a_time_is_never_busy() -> None:
    """A share is never less than one context, however many tenants share few cores."""
    assert busy_tenants({"a": 1, "b": 1, "c": 1}, 1) == frozenset()
    assert busy_tenants({"a": 1, "b": 2, "c": 1}, 1) == {"b"}


def test_tenants_within_their_share_of_many_cores_are_not_busy() -> None:
    assert busy_tenants({"a": 4, "b": 4}, 8) == frozenset()
    assert busy_tenants({"a": 5, "b": 3}, 8) == {"a"}
    assert busy_tenants({"a": 5, "b": 5, "c": 1}, 8) == {"a", "b"}


def test_no_one_is_busy_when_every_tenant_is_over_its_share() -> None:
    """Marked busy, a tenant's handlers wait behind every other process on the
    machine; that is only worth it for a tenant within its share to gain."""
    assert busy_tenants({"a": 5, "b": 5, "idle": 0}, 8) == frozenset()
    assert busy_tenants({"a": 64}, 2) == frozenset()
