"""Pull workers over HTTP (docs/api.md "Pull workers"): claims, leases, completes,
hand-backs, the registry, held claims and held GETs, with real daemons sharing
one store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from harness.api import (
    Api,
    Handlers,
    assert_error,
    claim_jobs,
    claimed,
    post_json,
    pulled_type,
)
from harness.daemons import DaemonFactory, add_tenant, run_cli, store_args

FORGED = "0" * 32


async def complete(api: Api, job: dict[str, Any], worker: str, **fields: Any) -> Any:
    body = {"claim": job["claim"], "worker": worker, **fields}
    return await post_json(api, f"/job/{job['id']}/complete", body)


async def test_claim_renew_complete_with_follow_ons_then_and_the_registry(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn).url, "t", token)
    stored = await pulled_type(api, "gpu", then="after")
    assert stored["lang"] == "worker" and stored["timeout"] == 60
    await pulled_type(api, "after")
    await pulled_type(api, "next")
    ids = await api.add("gpu", ["a", "b", "c"])
    jobs = await claimed(api, "gpu", "box-1", limit=10)
    jobs += await claim_jobs(api, "gpu", "box-1", limit=10)
    assert sorted(j["id"] for j in jobs) == sorted(ids)
    assert {j["payload"] for j in jobs} == {"a", "b", "c"}
    assert all(j["attempts"] == 1 and j["type"] == "gpu" for j in jobs)
    assert {j["lease_s"] for j in jobs} == {60}  # the handler's timeout
    renewed = await post_json(
        api, f"/job/{jobs[0]['id']}/renew", {"claim": jobs[0]["claim"], "worker": "box-1"}
    )
    assert renewed.status == 200 and renewed.json["lease_until"] >= jobs[0]["lease_until"], renewed
    done = await complete(
        api,
        jobs[0],
        "box-1",
        exitcode=200,
        result="r0",
        jobs=[{"type": "next", "payload": {"n": 1}}],
    )
    assert done.status == 200, done
    assert (
        done.json["state"] == "done" and done.json["code"] == "ok" and done.json["result"] == "r0"
    )
    batch = await post_json(
        api,
        "/jobs/complete",
        {
            "worker": "box-1",
            "results": [
                {"id": jobs[1]["id"], "claim": jobs[1]["claim"], "exitcode": 404, "result": "no"},
                {"id": jobs[2]["id"], "claim": FORGED, "exitcode": 200},
                {"id": "nosuchjob", "claim": jobs[2]["claim"], "exitcode": 200},
            ],
        },
    )
    assert [r["status"] for r in batch.json["results"]] == [200, 409, 404], batch
    failed = await api.get_job(jobs[1]["id"])
    assert failed.json["code"] == "failed" and failed.json["exitcode"] == 404
    # the follow-on job and the then job arrive, each of the tenant's own type
    nexts = await claimed(api, "next", "box-2")
    assert nexts[0]["payload"] == '{"n":1}'
    afters = await claimed(api, "after", "box-2")
    assert afters[0]["payload"] == "r0"
    workers = await api.request("GET", "/t/workers")
    seen = {w["name"]: w for w in workers.json["workers"]}
    assert seen["box-1"]["done_ok"] == 1 and seen["box-1"]["done_failed"] == 1, seen
    assert seen["box-1"]["holding"] == 1 and seen["box-1"]["live"] is True, seen
    assert seen["box-2"]["holding"] == 2, seen


async def test_a_batch_complete_chains_then_jobs_and_answers_bad_tokens_per_item(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """Results of ok and failed runs without follow-on jobs are archived in one
    statement: an ok run of a type whose handler chains a ``then`` job still
    gets that job, and an id or claim that was never given out (a space in it)
    is that item's 404 or 409, not the request's error."""
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn).url, "t", token)
    await pulled_type(api, "chain", then="after")
    await pulled_type(api, "after")
    await api.add("chain", ["a", "b", "c"])
    jobs = await claimed(api, "chain", "box-1", limit=10)
    jobs += await claim_jobs(api, "chain", "box-1", limit=10)
    assert len(jobs) == 3
    ok, no, spaced = jobs
    batch = await post_json(
        api,
        "/jobs/complete",
        {
            "worker": "box-1",
            "results": [
                {"id": ok["id"], "claim": ok["claim"], "result": "r"},
                {"id": no["id"], "claim": no["claim"], "exitcode": 404},
                {"id": spaced["id"], "claim": "a claim", "exitcode": 200},
                {"id": "no such job", "claim": ok["claim"], "exitcode": 200},
            ],
        },
    )
    assert [r["status"] for r in batch.json["results"]] == [200, 200, 409, 404], batch
    assert (await api.get_job(ok["id"])).json["code"] == "ok"
    assert (await api.get_job(no["id"])).json["code"] == "failed"
    assert (await api.get_job(spaced["id"])).json["state"] == "running"
    afters = await claimed(api, "after", "box-2")
    assert [a["payload"] for a in afters] == ["r"]  # the ok run's chained job, once
    one = await complete(api, spaced, "box-1", exitcode=200, result="s")
    assert one.status == 200 and one.json["code"] == "ok", one
    afters = await claimed(api, "after", "box-2")
    assert [a["payload"] for a in afters] == ["s"]
    workers = await api.request("GET", "/t/workers")
    seen = {w["name"]: w for w in workers.json["workers"]}
    assert seen["box-1"]["done_ok"] == 2 and seen["box-1"]["done_failed"] == 1, seen


async def test_a_stalled_worker_cannot_overwrite_the_result_of_the_one_that_took_over(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn, "--lease", "4").url, "t", token)
    await pulled_type(api, "slow", timeout=1)
    [job_id] = await api.add("slow", ["x"])
    [first] = await claimed(api, "slow", "a")
    # a's lease (1 s) runs out; the daemon's expiry makes the job claimable again
    [second] = await claimed(api, "slow", "b", wait=2)
    assert second["id"] == job_id and second["attempts"] == 2 and second["claim"] != first["claim"]
    stale = await post_json(api, f"/job/{job_id}/renew", {"claim": first["claim"], "worker": "a"})
    assert_error(stale, 409, "conflict")
    assert_error(await complete(api, first, "a", exitcode=200, result="late"), 409, "conflict")
    assert (await complete(api, second, "b", exitcode=200, result="fresh")).status == 200
    assert_error(await complete(api, first, "a", exitcode=500), 409, "conflict")
    job = (await api.get_job(job_id)).json
    assert job["result"] == "fresh" and job["attempts"] == 2, job


async def test_retries_hand_backs_and_attempts(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn).url, "t", token)
    await pulled_type(api, "flaky", maxAttempts=2)
    [job_id] = await api.add("flaky", ["x"])
    [job] = await claimed(api, "flaky", "w")
    back = await post_json(
        api, "/jobs/release", {"worker": "w", "claims": [{"id": job_id, "claim": job["claim"]}]}
    )
    assert [r["status"] for r in back.json["results"]] == [200], back
    [job] = await claim_jobs(api, "flaky", "w")
    assert job["attempts"] == 1  # the hand-back did not count
    retried = await complete(api, job, "w", exitcode=503, result="busy")
    assert retried.status == 200 and retried.json["state"] == "waiting", retried
    assert retried.json["code"] == "error"
    [job] = await claimed(api, "flaky", "w", wait=5)
    assert job["attempts"] == 2
    last = await complete(api, job, "w", exitcode=503, result="still busy")
    assert last.json["state"] == "done" and last.json["exitcode"] == 503, last  # maxAttempts


async def test_bad_requests_and_other_tenants(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    tokens = {c: add_tenant(c, store=pg_dsn, data_dir=tmp_path, cwd=tmp_path) for c in ("t", "u")}
    url = daemons.start(tmp_path, pg_dsn).url
    api, other = Api(session, url, "t", tokens["t"]), Api(session, url, "u", tokens["u"])
    await pulled_type(api, "p")
    await pulled_type(other, "p")
    await Handlers(api).add("run", "shell", "true")
    assert_error(await post_json(api, "/job/run/claim", {"worker": "w"}), 409, "conflict")
    assert_error(await post_json(api, "/job/none/claim", {"worker": "w"}), 409, "conflict")
    bad: Any
    for bad in (
        {},
        {"worker": ""},
        {"worker": "has space"},
        {"worker": "w", "limit": 0},
        {"worker": "w", "limit": 1001},
        {"worker": "w", "limit": 1.5},
        {"worker": "w", "wait": 61},
        {"worker": "w", "wait": "soon"},
        [],
    ):
        assert_error(await post_json(api, "/job/p/claim", bad), 400, "bad_request")
    not_json = await api.request(
        "POST", "/t/job/p/claim", data="{", headers={"Content-Type": "application/json"}
    )
    assert_error(not_json, 400, "bad_request")
    [job_id] = await other.add("p", ["theirs"])
    [theirs] = await claimed(other, "p", "w")
    # their job id with their own claim token, sent by this tenant: no such job here
    stolen = await post_json(
        api, f"/job/{job_id}/complete", {"claim": theirs["claim"], "worker": "w"}
    )
    assert_error(stolen, 404, "not_found")
    stolen = await post_json(api, f"/job/{job_id}/renew", {"claim": theirs["claim"], "worker": "w"})
    assert_error(stolen, 404, "not_found")
    # a forged token, or the right token under another worker's name: not held
    assert_error(await complete(other, {**theirs, "claim": FORGED}, "w"), 409, "conflict")
    assert_error(await complete(other, theirs, "someone-else"), 409, "conflict")
    for bad_fields in (
        {"exitcode": "200"},
        {"exitcode": 1000},
        {"exitcode": True},
        {"jobs": [{"type": "bad type", "payload": "x"}]},
        {"jobs": [{"type": "ok", "payload": ""}]},
        {"jobs": "nope"},
        {"result": "nul\u0000"},
    ):
        assert_error(await complete(other, theirs, "w", **bad_fields), 400, "bad_request")
    assert_error(
        await post_json(other, f"/job/{job_id}/complete", {"worker": "w"}), 400, "bad_request"
    )
    twice = {"worker": "w", "claims": [{"id": job_id, "claim": FORGED}] * 2}
    assert_error(await post_json(other, "/jobs/renew", twice), 400, "bad_request")
    assert_error(
        await post_json(other, "/jobs/renew", {"worker": "w", "claims": []}), 400, "bad_request"
    )
    assert (await complete(other, theirs, "w")).status == 200  # untouched by all of that


async def test_a_held_claim_wakes_when_another_daemon_adds(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path / "a", cwd=tmp_path)
    first = daemons.start(tmp_path / "a", pg_dsn)
    second = daemons.start(tmp_path / "b", pg_dsn)
    a, b = Api(session, first.url, "t", token), Api(session, second.url, "t", token)
    await pulled_type(a, "q")
    assert await claim_jobs(a, "q", "w") == []
    began = time.monotonic()
    assert await claim_jobs(a, "q", "w", wait=0.3) == []  # nothing comes: empty when wait runs out
    assert time.monotonic() - began >= 0.3
    held = asyncio.ensure_future(claim_jobs(a, "q", "w", wait=30))
    await asyncio.sleep(0.3)  # the claim is held (nothing to synchronise with from outside)
    added = time.monotonic()
    [job_id] = await b.add("q", ["x"])
    jobs = await asyncio.wait_for(held, 30)
    woke = time.monotonic() - added
    assert [j["id"] for j in jobs] == [job_id]
    assert woke < 2.0, f"the held claim took {woke:.3f} s to see the job"  # generous: CI


async def test_a_held_get_returns_when_the_job_is_done(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path / "a", cwd=tmp_path)
    first = daemons.start(tmp_path / "a", pg_dsn)
    second = daemons.start(tmp_path / "b", pg_dsn)
    a, b = Api(session, first.url, "t", token), Api(session, second.url, "t", token)
    await pulled_type(a, "q")
    [job_id] = await a.add("q", ["x"])
    await b.wait_job(job_id)  # in the store (b cannot know of it before)
    waiting = await b.request("GET", f"/t/job/{job_id}", params={"wait": "0.2"})
    assert waiting.status == 200 and waiting.json["state"] == "waiting", waiting
    held = asyncio.ensure_future(b.request("GET", f"/t/job/{job_id}", params={"wait": "30"}))
    [job] = await claimed(a, "q", "w")
    assert (await complete(a, job, "w", result="r")).status == 200
    finished = time.monotonic()
    reply = await asyncio.wait_for(held, 30)
    assert reply.json["state"] == "done" and reply.json["result"] == "r", reply
    assert time.monotonic() - finished < 2.0
    for bad in ("-1", "61", "x", "nan"):
        assert_error(await a.request("GET", f"/t/job/{job_id}", params={"wait": bad}), 400)


async def test_the_operator_sees_every_tenants_workers_and_every_daemon(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    daemon = daemons.start(tmp_path, pg_dsn)
    done = run_cli("admin", "token", *store_args(pg_dsn, tmp_path), cwd=tmp_path)
    admin = Api(session, daemon.url, "t", done.stdout.strip().splitlines()[-1])
    api = Api(session, daemon.url, "t", token)
    await pulled_type(api, "q")
    await claim_jobs(api, "q", "box")
    assert_error(await api.request("GET", "/admin/workers"), 403)
    seen = (await admin.request("GET", "/admin/workers")).json
    assert [(w["tenant"], w["name"]) for w in seen["workers"]] == [("t", "box")]
    assert any(d["state"] == "live" for d in seen["daemons"]), seen
