"""The dashboard's JSON routes and page on a real daemon: ``GET /admin/overview``
(operator token), ``GET /{client}/overview`` (the tenant's own, or the
operator's) and ``GET /``.

One daemon for the module with tenants ``acme`` and ``globex``; each test uses
its own jobtypes, so they can share it.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from harness.api import Api, Handlers, assert_error, until, wait_all_done
from harness.daemons import (
    DaemonFactory,
    Deployment,
    deploy,
    give_admin_token,
    reachable_dir,
)

# a python handler that runs until the file named by its payload exists
WAIT_FOR_FILE = """
def handler(payload, ctx):
    import os, time
    deadline = time.time() + 60
    while not os.path.exists(payload) and time.time() < deadline:
        time.sleep(0.02)
    return 200, "released"
"""
FAIL_WITH_PAYLOAD = "def handler(payload, ctx):\n    return 400, payload\n"


@pytest.fixture(scope="module")
def deployment(module_daemons: DaemonFactory, module_dsn: str) -> Iterator[Deployment]:
    root = reachable_dir("qd-overview-")  # handlers must reach the data dir
    deployed = deploy(module_daemons, module_dsn, root, ["acme", "globex"])
    give_admin_token(deployed)
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def acme(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "acme")


@pytest.fixture
def globex(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "globex")


@pytest.fixture
def admin(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "*admin")


async def overview(api: Api, path: str, **params: str) -> dict[str, Any]:
    reply = await api.request("GET", path, params=params or None)
    assert reply.status == 200, reply
    assert reply.content_type == "application/json", reply
    body: dict[str, Any] = reply.json
    return body


def queue(body: dict[str, Any], client: str, jobtype: str) -> dict[str, Any] | None:
    for row in body["queues"]:
        if row["client"] == client and row["type"] == jobtype:
            found: dict[str, Any] = row
            return found
    return None


async def test_operator_route_needs_the_operator_token(acme: Api, admin: Api) -> None:
    assert_error(await acme.request("GET", "/admin/overview", auth=False), 401, "unauthorized")
    bad = acme.as_("acme", "not-a-token")
    assert_error(await bad.request("GET", "/admin/overview"), 401, "unauthorized")
    assert_error(await acme.request("GET", "/admin/overview"), 403, "forbidden")
    body = await overview(admin, "/admin/overview")
    assert body["scope"] == "operator" and body["client"] is None
    assert body["sysid"]
    assert any(d["state"] == "live" and d["host"] for d in body["daemons"])


async def test_tenant_route_needs_its_token(acme: Api, globex: Api, admin: Api) -> None:
    assert_error(await acme.request("GET", "/acme/overview", auth=False), 401, "unauthorized")
    assert_error(await globex.request("GET", "/acme/overview"), 403, "forbidden")
    # the same 403 for a tenant that does not exist: no names are given away
    assert_error(await globex.request("GET", "/nobody/overview"), 403, "forbidden")
    assert_error(await acme.request("GET", "/Bad-Name/overview"), 400, "bad_name")
    assert (await overview(acme, "/acme/overview"))["scope"] == "tenant"
    by_operator = await overview(admin, "/acme/overview")
    assert by_operator["scope"] == "tenant" and by_operator["client"] == "acme"


async def test_each_tenant_sees_only_its_own_queues(acme: Api, globex: Api, admin: Api) -> None:
    await acme.add("iso_a", ["1", "2", "3"])
    await globex.add("iso_g", ["1"])

    async def both_listed() -> dict[str, Any] | None:
        body = await overview(admin, "/admin/overview")
        if queue(body, "acme", "iso_a") and queue(body, "globex", "iso_g"):
            return body
        return None

    everything = await until(both_listed, 20, "both tenants' queues in the operator view")
    row = queue(everything, "acme", "iso_a")
    assert row is not None and row["waiting"] == 3 and row["running"] == 0

    async def mine_listed() -> dict[str, Any] | None:
        body = await overview(acme, "/acme/overview")
        return body if queue(body, "acme", "iso_a") else None

    # a body is kept for a second, so the tenant's may still be an older one
    mine = await until(mine_listed, 20, "the tenant's queue in its own view")
    assert {row["client"] for row in mine["queues"]} == {"acme"}
    # another tenant's name appears nowhere in a tenant's view, nor where daemons run
    text = (await acme.request("GET", "/acme/overview")).body.decode()
    assert "globex" not in text and "iso_g" not in text
    assert all("host" not in d and "data_dir" not in d for d in mine["daemons"])


async def test_running_jobs_failures_and_throughput(
    deployment: Deployment, acme: Api, admin: Api, module_daemons: DaemonFactory
) -> None:
    marks = module_daemons.shared_dir("overview-marks")
    flag = marks / "go"
    handlers = Handlers(acme)
    await handlers.add("slow", "python", WAIT_FOR_FILE, timeout=120)
    await handlers.add("bad", "python", FAIL_WITH_PAYLOAD, maxAttempts=1)
    [slow_id] = await acme.add("slow", [str(flag)])
    evil = "<img src=x onerror=alert(1)> " + "x" * 700
    bad_ids = await acme.add("bad", [evil, "second failure", "third failure"])

    async def running_seen() -> dict[str, Any] | None:
        body = await overview(acme, "/acme/overview")
        ids = [job["id"] for job in body["running"]["oldest"]]
        return body if slow_id in ids else None

    body = await until(running_seen, 30, "the slow job among the running ones")
    [job] = [j for j in body["running"]["oldest"] if j["id"] == slow_id]
    assert job["sysid"] == slow_id.rsplit("-", 1)[1]  # added and run by the one daemon
    assert job["client"] == "acme" and job["type"] == "slow" and job["age_s"] >= 0
    await asyncio.to_thread(flag.write_text, "go")
    await wait_all_done(acme, [slow_id, *bad_ids])

    async def failures_seen() -> dict[str, Any] | None:
        body = await overview(acme, "/acme/overview")
        ids = {f["id"] for f in body["failures"]}
        return body if ids >= set(bad_ids) else None

    body = await until(failures_seen, 20, "the failed jobs among the recent failures")
    [failure] = [f for f in body["failures"] if f["id"] == bad_ids[0]]
    assert failure["code"] == "failed" and failure["exitcode"] == 400
    assert failure["result"] == evil[:500] and failure["result_cut"] is True
    assert failure["client"] == "acme" and failure["type"] == "bad"
    # bounded lists: ?limit= caps failures and running jobs
    capped = await overview(acme, "/acme/overview", limit="1")
    assert len(capped["failures"]) == 1 and len(capped["running"]["oldest"]) <= 1
    for bad in ["0", "501", "x", "-1"]:
        reply = await acme.request("GET", "/acme/overview", params={"limit": bad})
        assert_error(reply, 400, "bad_request")
        assert_error(await admin.request("GET", "/admin/overview", params={"limit": bad}), 400)

    async def throughput_seen() -> dict[str, Any] | None:
        body = await overview(admin, "/admin/overview")
        row = queue(body, "acme", "bad")
        return row if row and any(point > 0 for point in row["throughput"]) else None

    row = await until(throughput_seen, 40, "the bad jobs in the sampled throughput", 0.5)
    assert row["done_failed"] == 3 and row["waiting"] == 0
    assert row["per_s"] is not None and row["per_s"] > 0


async def test_a_types_dead_letters_alone(acme: Api, globex: Api, admin: Api) -> None:
    handlers = Handlers(acme)
    await handlers.add("dl_one", "python", FAIL_WITH_PAYLOAD, maxAttempts=1)
    await handlers.add("dl_two", "python", FAIL_WITH_PAYLOAD, maxAttempts=1)
    ones = await acme.add("dl_one", ["a", "b"])
    twos = await acme.add("dl_two", ["c"])
    await wait_all_done(acme, [*ones, *twos])

    async def listed(api: Api, path: str, **params: str) -> dict[str, Any] | None:
        body = await overview(api, path, **params)
        return body if {f["id"] for f in body["failures"]} >= set(ones) else None

    mine = await until(lambda: listed(acme, "/acme/overview", type="dl_one"), 20, "dl_one's")
    assert {f["type"] for f in mine["failures"]} == {"dl_one"}
    assert mine["failures_of"] == "acme/dl_one"
    every = await until(
        lambda: listed(admin, "/admin/overview", type="dl_one", client="acme"), 20, "as operator"
    )
    assert {f["type"] for f in every["failures"]} == {"dl_one"}
    assert (await overview(acme, "/acme/overview"))["failures_of"] is None
    # another tenant's type of the same name is its own: none of acme's show
    theirs = await overview(globex, "/globex/overview", type="dl_one")
    assert theirs["failures"] == [] and theirs["failures_of"] == "globex/dl_one"
    for params, kind in (
        ({"type": "bad name!"}, "bad_name"),
        ({"type": "dl_one", "client": "acme"}, "bad_request"),  # a tenant names no client
        ({"client": "acme"}, "bad_request"),
    ):
        assert_error(await acme.request("GET", "/acme/overview", params=params), 400, kind)
    for params in ({"type": "dl_one"}, {"type": "dl_one", "client": "Bad"}, {"client": "acme"}):
        reply = await admin.request("GET", "/admin/overview", params=params)
        assert_error(reply, 400, "bad_request")


async def test_the_page_is_served_without_a_token(acme: Api) -> None:
    reply = await acme.request("GET", "/", auth=False)
    assert reply.status == 200, reply
    assert reply.content_type == "text/html"
    assert b"/admin/overview" in reply.body and b"sessionStorage" in reply.body
    policy = reply.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    # self-contained: nothing is loaded from anywhere else
    assert b"http://" not in reply.body.replace(b"http://www.w3.org/2000/svg", b"")
    assert b"https://" not in reply.body
