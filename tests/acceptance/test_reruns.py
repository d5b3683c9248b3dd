"""Reruns (docs/api.md): a done job waits again, one by one or the failed ones
in bulk. One real daemon on a real PostgreSQL for the module."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from harness.api import Api, Handlers, assert_error, wait_all_done, wait_done
from harness.daemons import DaemonFactory, Deployment, deploy, give_admin_token
from tests.acceptance.scrape import scrape, value

FAILS = "def handler(p, ctx):\n    return 404, 'not yet'\n"
WORKS = "def handler(p, ctx):\n    return p\n"


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(module_daemons, module_dsn, tmp_path_factory.mktemp("reruns"), ["r", "s"])
    give_admin_token(deployed)
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def r(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "r")


async def test_failed_jobs_rerun_once_their_handler_is_fixed(r: Api) -> None:
    await Handlers(r).add("fix", "python", FAILS)
    one, two, three = await r.add("fix", ["1", "2", "3"])
    failed = await wait_all_done(r, [one, two, three])
    assert {job["code"] for job in failed.values()} == {"failed"}
    await Handlers(r).add("fix", "python", WORKS)
    reply = await r.request("POST", f"/r/job/{one}/rerun")
    assert reply.status == 200, reply
    assert reply.json["id"] == one and reply.json["state"] in ("waiting", "running", "done")
    assert [run["code"] for run in reply.json["runs"]][:1] == ["failed"]
    done = await wait_done(r, one)
    assert (done["code"], done["result"], done["attempts"]) == ("ok", "1", 1)
    assert [run["code"] for run in done["runs"]] == ["failed", "ok"]
    bulk = await r.request("POST", "/r/jobs/rerun", params={"type": "fix", "code": "failed"})
    assert bulk.status == 200 and bulk.json == {"rerun": 2, "more": False}, bulk
    rest = await wait_all_done(r, [two, three])
    assert {job["code"] for job in rest.values()} == {"ok"}
    again = await r.request("POST", "/r/jobs/rerun", params={"type": "fix"})
    assert again.json == {"rerun": 0, "more": False}  # none failed now


async def test_reruns_answer_bad_requests_with_errors(r: Api) -> None:
    await Handlers(r).add("busy", "python", WORKS)
    [waiting] = await r.add("busy", ["x"], params={"delay": "600"})
    await r.wait_caught_up()  # in the store
    assert_error(await r.request("POST", f"/r/job/{waiting}/rerun"), 409, "conflict")
    assert_error(await r.request("POST", "/r/job/nosuchjob-1/rerun"), 404, "not_found")
    assert_error(await r.request("POST", f"/s/job/{waiting}/rerun"), 403)
    assert_error(await r.request("GET", f"/r/job/{waiting}/rerun"), 405)
    for params in ({"code": "ok"}, {"code": "retry"}, {"before": "yesterday"}):
        assert_error(await r.request("POST", "/r/jobs/rerun", params=params), 400)
    assert_error(await r.request("POST", "/r/jobs/rerun", params={"type": "a b"}), 400, "bad_name")


async def test_the_rerun_counter_counts(deployment: Deployment, r: Api) -> None:
    await Handlers(r).add("counted", "python", FAILS)
    [job] = await r.add("counted", ["c"])
    await wait_done(r, job)
    assert (await r.request("POST", f"/r/job/{job}/rerun")).status == 200
    samples = await scrape(deployment.api(r.session, "*admin"))
    assert value(samples, "queue_jobs_rerun_total", tenant="r", type="counted") == 1
