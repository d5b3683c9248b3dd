"""Jobs that wait for other jobs (docs/api.md "Dependencies"): a diamond on two
daemons runs in order, a failure ends its all-completed dependents (424,
transitively), all-resolved dependents run whatever the outcome, and bad
dependencies are refused."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import aiohttp

from harness.api import Api, Handlers, assert_error, wait_done
from harness.daemons import DaemonFactory, add_tenant

# ends as its payload says: "ok" 200, "fail" 400
HANDLER = """
def handler(payload, ctx):
    return (200, "did " + payload) if not payload.startswith("fail") else (400, "no")
"""


async def _two(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> tuple[Api, Api]:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp / "a", cwd=open_tmp)
    first = daemons.start(open_tmp / "a", pg_dsn)
    second = daemons.start(open_tmp / "b", pg_dsn)
    a, b = Api(session, first.url, "t", token), Api(session, second.url, "t", token)
    await Handlers(a).add("step", "python", HANDLER)
    return a, b


async def add_after(api: Api, payload: str, after: list[str], **params: str) -> str:
    [job_id] = await api.add("step", [payload], params={"after": ",".join(after), **params})
    return job_id


def _span(job: dict[str, Any]) -> tuple[str, str]:
    [run] = job["runs"]
    return run["started"], run["ended"]


async def test_a_diamond_runs_in_order_on_two_daemons(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    a, b = await _two(daemons, pg_dsn, open_tmp, session)
    # chained without a pause: each add may name a job still on its way to the store
    [top] = await a.add("step", ["A"])
    left = await add_after(b, "B", [top])
    right = await add_after(a, "C", [top])
    bottom = await add_after(b, "D", [left, right])
    done = {i: await wait_done(a, i, within=60) for i in (top, left, right, bottom)}
    assert all(job["code"] == "ok" for job in done.values()), done
    jobs = {i: (await a.get_job(i)).json for i in done}
    assert _span(jobs[left])[0] >= _span(jobs[top])[1]
    assert _span(jobs[right])[0] >= _span(jobs[top])[1]
    assert _span(jobs[bottom])[0] >= max(_span(jobs[left])[1], _span(jobs[right])[1])


async def test_a_failure_ends_all_completed_dependents_transitively(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    a, b = await _two(daemons, pg_dsn, open_tmp, session)
    [top] = await a.add("step", ["fail-A"])
    left = await add_after(b, "B", [top])
    right = await add_after(a, "C", [top])
    bottom = await add_after(b, "D", [left, right])
    resolved = await add_after(a, "E", [bottom], requires="all-resolved")
    assert (await wait_done(a, top, within=60))["exitcode"] == 400
    # each names a failed job it depends on: the top, or for the bottom, which
    # may be added after the cascade reached its own dependencies, one of those
    for job_id, named in ((left, [top]), (right, [top]), (bottom, [top, left, right])):
        job = await wait_done(a, job_id, within=60)
        assert job["code"] == "failed" and job["exitcode"] == 424, job
        assert any(f"dependency {n} did not complete" == job["result"] for n in named), job
        assert (await a.get_job(job_id)).json["runs"] == []  # never ran
    job = await wait_done(a, resolved, within=60)  # D failed: resolved all the same
    assert job["code"] == "ok" and job["result"] == "did E", job


async def test_all_resolved_dependents_run_whatever_the_outcome(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    a, b = await _two(daemons, pg_dsn, open_tmp, session)
    [top] = await a.add("step", ["fail-A"])
    left = await add_after(b, "B", [top], requires="all-resolved")
    right = await add_after(a, "C", [top], requires="all-resolved")
    bottom = await add_after(b, "D", [left, right], requires="all-resolved")
    for job_id, code in ((top, "failed"), (left, "ok"), (right, "ok"), (bottom, "ok")):
        assert (await wait_done(a, job_id, within=60))["code"] == code
    # a dependency already done counts at once: failed under all-completed, run under all-resolved
    failed_now = await add_after(a, "F", [top])
    job = await wait_done(a, failed_now, within=30)
    assert job["exitcode"] == 424, job
    assert (await wait_done(a, await add_after(a, "G", [top, bottom]), within=30))[
        "code"
    ] == "failed"


async def test_blocked_jobs_are_listed_counted_and_cancelled_with_their_dependents(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    a, _ = await _two(daemons, pg_dsn, open_tmp, session)
    [top] = await a.add("step", ["A"], params={"delay": "3600"})
    middle = await add_after(a, "B", [top])
    bottom = await add_after(a, "C", [middle], delay="5")
    job = await a.wait_job(bottom)
    assert job["state"] == "blocked" and job["dt"] is None, job
    stats = (await a.stats()).json["types"]["step"]
    assert stats["blocked"] == 2 and stats["scheduled"] == 1, stats
    listed = (await a.jobs(state="blocked")).json["jobs"]
    assert {j["id"] for j in listed} == {middle, bottom}
    assert (await a.cancel(top)).status == 200
    for job_id in (middle, bottom):
        job = await wait_done(a, job_id, within=30)
        assert job["exitcode"] == 424, job


async def test_bad_dependencies_are_refused(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    a, _ = await _two(daemons, pg_dsn, open_tmp, session)
    other_token = add_tenant("u", store=pg_dsn, data_dir=open_tmp / "a", cwd=open_tmp)
    other = a.as_("u", other_token)
    [theirs] = await other.add("step", ["x"])
    await other.wait_job(theirs)
    [mine] = await a.add("step", ["x"])
    too_many = ",".join([mine] * 1 + [f"{mine}{n}" for n in range(100)])
    for params in (
        {"after": theirs},  # another tenant's
        {"after": "nosuchjob-1"},
        {"after": ""},
        {"after": "bad id"},
        {"after": too_many},
        {"after": mine, "requires": "some"},
        {"requires": "all-resolved"},
        {"deadline": "-5"},
        {"deadline": "2001-01-01T00:00:00Z"},
        {"deadline": "soon"},
    ):
        reply = await a.add_raw("step", "x", params=params)
        assert_error(reply, 400, "bad_request")
    # a job cannot depend on itself: its ids are known up front with an idempotency key
    reply = await a.add_raw("step", "x", headers={"Idempotency-Key": "k"})
    [own] = reply.json["ids"]
    again = await a.add_raw("step", "x", params={"after": own}, headers={"Idempotency-Key": "k"})
    assert_error(again, 400, "bad_request")


SLOW_TOP = """
import random, time
def handler(payload, ctx):
    if payload == "A":
        time.sleep(random.random() * 0.3)
    return "did " + payload
"""


async def test_a_kill_of_the_daemon_archiving_a_dependency_loses_no_dependent(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp, cwd=open_tmp)
    rng = random.Random(7)
    for round_ in range(4):
        daemon = daemons.start(open_tmp, pg_dsn, "--lease", "3")
        api = Api(session, daemon.url, "t", token)
        await Handlers(api).add("step", "python", SLOW_TOP)
        [top] = await api.add("step", ["A"])
        left = await add_after(api, "B", [top])
        right = await add_after(api, "C", [top])
        bottom = await add_after(api, "D", [left, right])
        await asyncio.sleep(rng.random() * 0.6)  # a random moment around A's end
        daemon.kill()
        daemon = daemons.start(open_tmp, pg_dsn, "--lease", "3")
        api = api.at(daemon.url)
        job = await wait_done(api, bottom, within=60)
        assert job["code"] == "ok" and job["result"] == "did D", (round_, job)
        runs = (await api.get_job(bottom)).json["runs"]
        # D runs to completion once; a run before it can only be one that the kill
        # cut (D started and was not released before the kill: its lease ran out)
        reasons = [r["reason"] for r in runs]
        assert reasons[-1] == "completed" and set(reasons[:-1]) <= {"lease-expired"}, (
            round_,
            runs,
        )
        assert len(reasons) <= 2, (round_, runs)
        daemon.close()
