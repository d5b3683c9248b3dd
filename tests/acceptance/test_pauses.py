"""Pause and resume (docs/api.md): a tenant's types, the operator's whole tenant.
One real daemon on a real PostgreSQL for the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import (
    Api,
    Handlers,
    assert_error,
    claim_jobs,
    pulled_type,
    until,
    wait_all_done,
)
from harness.daemons import DaemonFactory, Deployment, deploy, give_admin_token, run_cli, store_args
from tests.acceptance.scrape import scrape, value

NOOP = "def handler(p, ctx):\n    return p\n"


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(module_daemons, module_dsn, tmp_path_factory.mktemp("pauses"), ["p", "q"])
    give_admin_token(deployed)
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def p(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "p")


@pytest.fixture
def q(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "q")


@pytest.fixture
def admin(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "*admin")


async def post(api: Api, path: str) -> dict[str, object]:
    reply = await api.request("POST", path)
    assert reply.status == 200, reply
    body: dict[str, object] = reply.json
    return body


async def states(api: Api, ids: list[str]) -> list[str]:
    return [(await api.get_job(i)).json["state"] for i in ids]


async def test_a_paused_type_waits_while_others_run_then_runs_once_resumed(p: Api) -> None:
    for jobtype in ("held", "free"):
        await Handlers(p).add(jobtype, "python", NOOP)
    assert await post(p, "/p/type/held/pause") == {"type": "held", "paused": True}
    assert await post(p, "/p/type/held/pause") == {"type": "held", "paused": True}
    held = await p.add("held", ["a", "b"])
    free = await p.add("free", ["c"])
    await wait_all_done(p, free)  # the daemon ran what came after the held ones
    assert await states(p, held) == ["waiting", "waiting"]
    stats = (await p.stats()).json
    assert stats["paused"] is False
    assert stats["types"]["held"]["paused"] is True and stats["types"]["held"]["waiting"] == 2
    assert stats["types"]["free"]["paused"] is False
    assert await post(p, "/p/type/held/resume") == {"type": "held", "paused": False}
    done = await wait_all_done(p, held)
    assert {job["result"] for job in done.values()} == {"a", "b"}
    assert all(job["attempts"] == 1 for job in done.values())
    assert (await p.type_stats("held")) is not None
    assert (await p.type_stats("held"))["paused"] is False  # type: ignore[index]


async def test_a_type_paused_before_it_has_jobs_is_listed(p: Api) -> None:
    await post(p, "/p/type/future/pause")
    assert await p.type_stats("future") == {
        "waiting": 0,
        "scheduled": 0,
        "blocked": 0,
        "running": 0,
        "done_ok": 0,
        "done_failed": 0,
        "done_error": 0,
        "paused": True,
    }
    await post(p, "/p/type/future/resume")
    await post(p, "/p/type/never-paused/resume")  # not paused: no change
    assert await p.type_stats("future") is None


async def test_workers_claim_nothing_of_a_paused_type(p: Api) -> None:
    await pulled_type(p, "pulled")
    ids = await p.add("pulled", ["x"])
    await post(p, "/p/type/pulled/pause")
    await p.wait_caught_up()  # the job is in the store
    assert await claim_jobs(p, "pulled", "w1") == []
    await post(p, "/p/type/pulled/resume")
    assert [job["id"] for job in await claim_jobs(p, "pulled", "w1")] == ids


async def test_the_operator_pauses_a_whole_tenant_and_no_other(p: Api, q: Api, admin: Api) -> None:
    for api in (p, q):
        await Handlers(api).add("all", "python", NOOP)
    assert await post(admin, "/admin/tenants/p/pause") == {"client": "p", "paused": True}
    held = await p.add("all", ["1", "2"])
    other = await q.add("all", ["3"])
    await wait_all_done(q, other)
    assert await states(p, held) == ["waiting", "waiting"]
    stats = (await p.stats()).json
    assert stats["paused"] is True and stats["types"]["all"]["paused"] is True
    assert (await q.stats()).json["paused"] is False
    assert await post(admin, "/admin/tenants/p/resume") == {"client": "p", "paused": False}
    await wait_all_done(p, held)


async def test_pausing_answers_bad_requests_with_errors(p: Api, admin: Api) -> None:
    assert_error(await p.request("POST", "/p/type/bad%20name/pause"), 400, "bad_name")
    assert_error(await p.request("POST", "/p/type/" + "x" * 101 + "/pause"), 400, "bad_name")
    assert_error(await p.request("GET", "/p/type/t/pause"), 405)
    assert_error(await p.request("POST", "/q/type/t/pause"), 403)  # another tenant's
    assert_error(await p.request("POST", "/p/type/t/pause", auth=False), 401)
    assert_error(await p.request("POST", "/admin/tenants/p/pause"), 403)  # not the operator
    assert_error(await admin.request("POST", "/admin/tenants/nobody/pause"), 404, "not_found")
    assert_error(await admin.request("POST", "/admin/tenants/Bad-Name/pause"), 400, "bad_name")
    await post(admin, "/admin/tenants/nobody/resume")  # nothing to resume: no change


async def test_the_operator_pauses_a_tenant_from_the_command_line(
    deployment: Deployment, q: Api
) -> None:
    def cli(*args: str) -> tuple[int, str, str]:
        done = run_cli(
            *args[:2],
            *store_args(deployment.dsn, deployment.data_dir),
            *args[2:],
            cwd=deployment.cwd,
        )
        return done.returncode, done.stdout, done.stderr

    assert cli("tenant", "pause", "q")[:2] == (0, "tenant q paused\n")
    assert (await q.stats()).json["paused"] is True
    assert cli("tenant", "resume", "q")[:2] == (0, "tenant q resumed\n")
    assert (await q.stats()).json["paused"] is False
    code, _, err = cli("tenant", "pause", "nobody")
    assert code != 0 and "no active tenant nobody" in err and "Traceback" not in err


async def test_the_metrics_count_paused_types_and_tenants(q: Api, admin: Api) -> None:
    await post(q, "/q/type/m1/pause")
    await post(q, "/q/type/m2/pause")
    await post(admin, "/admin/tenants/q/pause")

    async def counted() -> tuple[float, float] | None:
        samples = await scrape(admin)
        found = (
            value(samples, "queue_paused_types", tenant="q"),
            value(samples, "queue_paused_tenants", tenant="q"),
        )
        return found if found == (2, 1) else None

    try:
        await until(counted, 30, "the paused gauges")
    finally:
        await post(admin, "/admin/tenants/q/resume")
        await post(q, "/q/type/m1/resume")
        await post(q, "/q/type/m2/resume")


async def test_under_no_auth_any_tenant_name_is_paused_and_resumed(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """--no-auth has no stored tenants: every name is one (its pause is not a 404)."""
    daemon = daemons.start(tmp_path / "data", pg_dsn, "--no-auth")
    api = Api(session, daemon.url, "n", None)
    await Handlers(api).add("t", "python", NOOP)
    assert await post(api, "/admin/tenants/n/pause") == {"client": "n", "paused": True}
    [job_id] = await api.add("t", ["x"])
    assert (await api.request("GET", "/n/stats")).json["paused"] is True

    async def stored() -> bool | None:
        reply = await api.get_job(job_id)  # 404 until it is ingested
        return (reply.status == 200 and reply.json["state"] == "waiting") or None

    await until(stored, 30, "the job stored, waiting")
    assert await post(api, "/admin/tenants/n/resume") == {"client": "n", "paused": False}
    await wait_all_done(api, [job_id])
