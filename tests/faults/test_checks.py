"""The fault campaign's invariant checks (bench/faults/checks.py) on made-up data:
each holds on good data and finds what is wrong with bad data."""

from __future__ import annotations

from bench.faults import checks
from bench.faults.checks import Run, Stored
from bench.faults.plan import KINDS, plan_round


def _stored(job_id: str, data: str, owner: str = "d1", **over: object) -> Stored:
    fields: dict[str, object] = {
        "id": job_id,
        "data": data,
        "done": True,
        "code": "ok",
        "exitcode": 200,
        "result": f"ok {data} {owner}",
    }
    fields.update(over)
    return Stored(**fields)  # type: ignore[arg-type]


P1, P2, P3 = (checks.payload(0.01, f"t.{n}") for n in (1, 2, 3))
ACKED = {"a": P1, "b": P2, "c": P3}
GOOD = {i: _stored(i, p) for i, p in ACKED.items()}
RUNS = [Run(i, "d1", 10.0 + n, 10.5 + n) for n, i in enumerate(ACKED)]


def test_payloads_carry_a_checksum_that_a_flipped_byte_breaks() -> None:
    assert checks.payload_intact(P1)
    flipped = P1[:2] + chr(ord(P1[2]) ^ 1) + P1[3:]
    assert not checks.payload_intact(flipped)
    assert not checks.payload_intact("no checksum")


def test_lost_finds_an_acknowledged_id_missing_from_the_store_unless_forgiven() -> None:
    assert checks.lost(ACKED, GOOD, set()) == []
    partial = {i: s for i, s in GOOD.items() if i != "b"}
    assert checks.lost(ACKED, partial, set()) == ["b"]
    assert checks.lost(ACKED, partial, {"b"}) == []


def test_stored_though_refused_finds_a_job_of_an_add_refused_whole() -> None:
    assert [s for s in (200, 0, 500, 503, 429, 400) if checks.refused_whole(s)] == [503, 429, 400]
    assert checks.stored_though_refused({"never stored"}, GOOD) == []
    assert checks.stored_though_refused({P2}, GOOD) == ["b"]


def test_duplicated_finds_a_payload_stored_twice() -> None:
    assert checks.duplicated({P1: 1, P2: 1}) == []
    assert checks.duplicated({P1: 1, P2: 2}) == [P2]


def test_corrupted_finds_a_payload_that_differs_or_fails_its_checksum() -> None:
    assert checks.corrupted(ACKED, GOOD) == []
    changed = dict(GOOD, b=_stored("b", P3))  # intact, but not what "b" was sent with
    assert checks.corrupted(ACKED, changed) == ["b"]
    foreign = dict(GOOD, x=_stored("x", "0/t.9/00000000"))  # never acknowledged, broken
    assert checks.corrupted(ACKED, foreign) == ["x"]


def test_not_done_ok_finds_jobs_left_waiting_failed_or_with_a_wrong_result() -> None:
    assert checks.not_done_ok(GOOD, ACKED) == []
    bad = dict(GOOD)
    bad["a"] = _stored("a", P1, done=False, code=None, exitcode=None, result=None)
    bad["b"] = _stored("b", P2, code="error", exitcode=500)
    bad["c"] = _stored("c", P3, result="ok something else d1")
    assert checks.not_done_ok(bad, ACKED) == ["a", "b", "c"]


def test_overlapping_finds_two_runs_of_a_job_at_the_same_time_and_not_reruns() -> None:
    rerun = [*RUNS, Run("a", "d2", 10.6, 11.0)]  # after the first run ended: fine
    killed = [*RUNS, Run("a", "d2", 10.2, None)]  # cannot be placed in time
    assert checks.overlapping(rerun) == []
    assert checks.overlapping(killed) == []
    both = [*RUNS, Run("a", "d2", 10.4, 10.9)]
    assert checks.overlapping(both) == [(RUNS[0], both[-1])]
    assert checks.reruns(rerun) == 1 and checks.reruns(RUNS) == 0


def test_accepted_twice_finds_a_job_archived_by_two_releases() -> None:
    once = [
        {"ev": "finished", "id": "a", "how": "archive"},
        {"ev": "finished", "id": "b", "how": "retry"},
        {"ev": "finished", "id": "b", "how": "archive"},
        {"ev": "lost-lease", "id": "a"},
    ]
    assert checks.accepted_twice(once) == []
    twice = [*once, {"ev": "finished", "id": "a", "how": "archive"}]
    assert checks.accepted_twice(twice) == ["a"]


def test_never_ran_finds_an_outcome_no_finished_run_of_its_owner_produced() -> None:
    assert checks.never_ran(GOOD, RUNS) == []
    assert checks.never_ran(dict(GOOD, a=_stored("a", P1, owner="d7")), RUNS) == ["a"]
    unfinished = [Run("a", "d1", 10.0, None), *RUNS[1:]]
    assert checks.never_ran(GOOD, unfinished) == ["a"]


def test_stale_runs_are_runs_by_another_owner_after_the_kept_run_ended() -> None:
    assert checks.stale_runs(GOOD, RUNS) == []
    late = Run("a", "d2", 11.0, 11.2)
    assert checks.stale_runs(GOOD, [*RUNS, late]) == [late]
    earlier = Run("a", "d2", 9.0, 9.5)  # a crashed owner's run, before the kept one
    assert checks.stale_runs(GOOD, [*RUNS, earlier]) == []


def test_the_run_log_parses_runs_killed_runs_and_torn_lines() -> None:
    text = (
        "start a d1 10.0\n"
        "start b d1 11.0\n"
        "end a d1 10.0 10.5\n"
        "start c d2 12.0\n"
        "end c d2 12.0 12.1\n"
        "end b d1 11.0 11.5\n"
        "start z d9\n"  # torn
    )
    runs, bad = checks.parse_run_log(text)
    assert sorted((r.job_id, r.end) for r in runs) == [("a", 10.5), ("b", 11.5), ("c", 12.1)]
    assert bad == ["start z d9"]
    runs, _ = checks.parse_run_log("start a d1 10.0\n")
    assert runs == [Run("a", "d1", 10.0, None)]


def test_leftover_processes_and_cgroups_are_those_of_the_rounds_daemons() -> None:
    cgroups = {5: "/a/queue-daemon-100.1/run-3", 6: "/a/queue-daemon-1000.1/run-1", 7: "/a"}
    assert checks.leftover_processes(cgroups, [100, 200], alive=[7]) == [5]
    assert checks.leftover_processes({7: "/a"}, [100, 200], alive=[200]) == [200]
    assert checks.leftover_processes({7: "/a"}, [100, 200], alive=[7]) == []
    names = ["queue-daemon-100.1", "queue-daemon-1000.2", "other"]
    assert checks.leftover_cgroups(names, [100]) == ["queue-daemon-100.1"]
    assert checks.leftover_cgroups(names, [300]) == []


def test_a_rounds_plan_depends_on_the_seed_and_the_round_alone() -> None:
    assert plan_round(7, 3) == plan_round(7, 3)
    assert [plan_round(7, k) for k in range(1, 6)] != [plan_round(8, k) for k in range(1, 6)]
    for k in range(1, 30):
        p = plan_round(7, k)
        assert p.daemons in (2, 3) and 1 <= len(p.faults) <= 3
        assert all(f.kind in KINDS and 0 <= f.victim < p.daemons for f in p.faults)
        assert len({f.kind for f in p.faults}) == len(p.faults)
