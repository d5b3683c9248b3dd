"""Per-tenant limits set by an operator, and the operator (admin) token.

One daemon for the module with two tenants: ``capped`` gets overrides, ``free``
keeps the daemon's defaults and must never feel ``capped``'s limits. Every
limit named in the security model (docs/security.md) has a test here: waiting jobs,
add rate and burst, payload size, result size, handlers, running jobs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from harness.api import Api, Handlers, Reply, assert_error, until, wait_all_done
from harness.daemons import (
    DaemonFactory,
    Deployment,
    deploy,
    reachable_dir,
    run_cli,
    store_args,
)


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = reachable_dir("qd-limits-")  # handlers must reach the data dir
    deployed = deploy(
        module_daemons, module_dsn, root, ["capped", "free", "other"], "--concurrency", "8"
    )
    code, out, err = cli(deployed, "admin", "token")
    assert code == 0, err
    deployed.tokens["*admin"] = out.strip().splitlines()[-1]
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped
        shutil.rmtree(root, ignore_errors=True)


def cli(deployment: Deployment, *args: str) -> tuple[int, str, str]:
    done = run_cli(
        *args[:2], *store_args(deployment.dsn, deployment.data_dir), *args[2:], cwd=deployment.cwd
    )
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def admin(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "*admin")


@pytest.fixture
def capped(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "capped")


@pytest.fixture
def free(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "free")


async def set_limits(admin: Api, client: str, **limits: Any) -> dict[str, Any]:
    reply = await admin.request(
        "POST",
        f"/admin/tenants/{client}/limits",
        data=json.dumps(limits),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == 200, reply
    body: dict[str, Any] = reply.json
    return body


@pytest.fixture(autouse=True)
async def no_overrides(admin: Api) -> None:
    """Every test starts with ``capped`` on the daemon's defaults."""
    await set_limits(admin, "capped")


# --- the operator token ---------------------------------------------------------


async def test_admin_routes_need_the_operator_token(
    admin: Api, capped: Api, deployment: Deployment
) -> None:
    assert_error(await admin.as_("x", None).request("GET", "/admin/tenants"), 401, "unauthorized")
    assert_error(
        await admin.as_("x", "qd_not-a-token").request("GET", "/admin/tenants"), 401, "unauthorized"
    )
    # a tenant's token is no operator token, and the refusal names no tenant
    reply = await capped.request("GET", "/admin/tenants")
    assert_error(reply, 403, "forbidden")
    for name in ("free", "other"):
        assert name.encode() not in reply.body
    reply = await admin.request("GET", "/admin/tenants")
    assert reply.status == 200, reply
    listed = {t["client"]: t for t in reply.json["tenants"]}
    assert {"capped", "free", "other"} <= set(listed)
    assert listed["free"]["state"] == "active" and listed["free"]["limits"] == {}
    assert reply.json["defaults"]["waiting"] == 1_000_000


async def test_the_operator_token_works_on_every_tenants_routes(admin: Api, free: Api) -> None:
    [job_id] = await free.add("t", ["for the operator"])
    as_operator = admin.as_("free", admin.token)
    assert (await as_operator.stats()).status == 200

    async def visible() -> dict[str, Any] | None:
        reply = await as_operator.get_job(job_id)
        return reply.json if reply.status == 200 else None

    job = await until(visible, 20, "the operator to read the tenant's job")
    assert job["payload"] == "for the operator"


async def test_a_tenant_never_sees_another_tenants_name(capped: Api, free: Api) -> None:
    # another tenant's path with one's own token: 403 without naming the owner
    reply = await capped.as_("free", capped.token).stats()
    assert_error(reply, 403, "forbidden")
    assert b"capped" not in reply.body and b"free" not in reply.body.replace(b"/free/", b"")
    # an unknown tenant and a known one look the same to a stranger's token
    unknown = await capped.as_("nosuchtenant", capped.token).stats()
    assert (unknown.status, unknown.json["error"]) == (reply.status, reply.json["error"])


async def test_admin_token_rotation_and_revocation(deployment: Deployment, admin: Api) -> None:
    code, out, err = cli(deployment, "admin", "token", "--grace", "600")
    assert code == 0, err
    new = admin.as_("x", out.strip().splitlines()[-1])
    assert (await new.request("GET", "/admin/tenants")).status == 200  # at once
    assert (await admin.request("GET", "/admin/tenants")).status == 200  # old: in its grace
    code, out, err = cli(deployment, "admin", "revoke")
    assert code == 0, err
    assert "2 operator token(s) revoked" in out

    async def refused() -> bool | None:
        reply = await new.request("GET", "/admin/tenants")
        return True if reply.status == 401 else None

    await until(refused, 10, "the revoked operator token to be refused")
    # the rest of the module goes on with a fresh token
    code, out, err = cli(deployment, "admin", "token")
    assert code == 0, err
    deployment.tokens["*admin"] = out.strip().splitlines()[-1]


# --- setting limits ----------------------------------------------------------------


async def test_limits_set_over_http_are_validated(admin: Api) -> None:
    body = await set_limits(admin, "capped", waiting=5, rate=2.5)
    assert body["overrides"] == {"waiting": 5, "rate": 2.5}
    assert body["effective"]["waiting"] == 5 and body["effective"]["payload"] == 1 << 20
    reply = await admin.request("GET", "/admin/tenants/capped/limits")
    assert reply.status == 200 and reply.json == body
    # null puts a key back on the default
    assert (await set_limits(admin, "capped", waiting=None))["overrides"] == {}
    path = "/admin/tenants/capped/limits"
    json_header = {"Content-Type": "application/json"}
    for bad in (
        b"[1]",
        b'{"waiting": -1}',
        b'{"nope": 1}',
        b'{"waiting": 1.5}',
        b"{",
        b'{"rate": "x"}',
    ):
        assert_error(
            await admin.request("POST", path, data=bad, headers=json_header), 400, "bad_request"
        )
    assert_error(
        await admin.request("POST", "/admin/tenants/nobody/limits", data=b"{}"), 404, "not_found"
    )
    assert_error(await admin.request("GET", "/admin/tenants/Bad-Name/limits"), 400, "bad_name")


def test_limits_from_the_cli(deployment: Deployment) -> None:
    def overrides(*changes: str) -> Any:
        code, out, err = cli(deployment, "tenant", "limits", "other", *changes)
        assert code == 0, err
        shown = json.loads(out.strip().splitlines()[-1])
        assert shown["client"] == "other"
        return shown["overrides"]

    assert overrides("waiting=7", "rate=1.5") == {"waiting": 7, "rate": 1.5}
    assert overrides("rate=default") == {"waiting": 7}
    assert overrides() == {"waiting": 7}
    assert overrides("waiting=default") == {}
    for bad in ("waiting", "colour=3", "waiting=-2", "waiting=lots"):
        code, _, err = cli(deployment, "tenant", "limits", "other", bad)
        assert code == 2 and "error" in err and "Traceback" not in err, (bad, err)
    code, _, err = cli(deployment, "tenant", "limits", "nobody")
    assert code == 2 and "no active tenant" in err


# --- each limit bites, for its tenant only -----------------------------------------


async def test_waiting_limit_gives_429_with_retry_after(admin: Api, capped: Api, free: Api) -> None:
    await set_limits(admin, "capped", waiting=5)
    assert_error(await capped.add_raw("nohandler", "\n".join("x" * 6)), 413, "too_large")
    await capped.add("nohandler", ["1", "2", "3"])
    await capped.add("nohandler", ["4", "5"])
    reply = await capped.add_raw("nohandler", "6")
    assert_error(reply, 429, "rate_limited")
    assert "waiting" in reply.json["message"]
    # at its limit a tenant's add is refused before its body is read: 429 whatever it holds
    assert_error(await capped.add_raw("nohandler", "\n".join("x" * 6)), 429, "rate_limited")
    await free.add("nohandler", [str(n) for n in range(10)])  # not capped's limit

    # cancelling frees room once the count is renewed (about once a second)
    await capped.wait_caught_up()
    for job in await capped.all_jobs(type="nohandler", state="waiting"):
        assert (await capped.cancel(job["id"])).status == 200

    async def admitted() -> Reply | None:
        reply = await capped.add_raw("nohandler", "again")
        return reply if reply.status == 200 else None

    await until(admitted, 15, "adds to be accepted again", interval=0.25)


async def test_rate_and_burst_overrides(admin: Api, capped: Api, free: Api) -> None:
    await set_limits(admin, "capped", rate=0.001, burst=3)
    assert_error(await capped.add_raw("t", "a\nb\nc\nd"), 413, "too_large")  # over the burst
    await capped.add("t", ["a", "b", "c"])
    reply = await capped.add_raw("t", "d")
    assert_error(reply, 429, "rate_limited")
    assert int(reply.headers["Retry-After"]) >= 1
    await free.add("t", ["e", "f", "g", "h"])


async def test_payload_override(admin: Api, capped: Api, free: Api) -> None:
    await set_limits(admin, "capped", payload=100)
    assert_error(await capped.add_raw("t", "p" * 101), 413, "too_large")
    await capped.add("t", ["p" * 100])
    await free.add("t", ["p" * 101])


async def test_handler_limit_gives_409(admin: Api, capped: Api) -> None:
    await set_limits(admin, "capped", handlers=2)
    handlers = Handlers(capped)
    for name in ("h1", "h2", "h3", "h4"):
        await handlers.delete(name)
    await handlers.add("h1", "shell", "true")
    await handlers.add("h2", "shell", "true")
    assert_error(await handlers.add_raw("h3", {"lang": "shell", "body": "true"}), 409, "conflict")
    await handlers.add("h2", "shell", "echo replaced")  # replacing is not one more
    assert (await handlers.delete("h1")).status == 200
    await handlers.add("h3", "shell", "true")
    assert_error(await handlers.add_raw("h4", {"lang": "shell", "body": "true"}), 409, "conflict")


async def test_result_override_cuts_results(admin: Api, capped: Api, free: Api) -> None:
    await set_limits(admin, "capped", result=10)
    body = "def handler(payload, ctx):\n    return 'r' * 100\n"
    await Handlers(capped).add("long", "python", body)
    await Handlers(free).add("long", "python", body)
    ids = await capped.add("long", ["x"])
    done = await wait_all_done(capped, ids)
    assert done[ids[0]]["result"] == "r" * 10
    ids = await free.add("long", ["x"])
    done = await wait_all_done(free, ids)
    assert done[ids[0]]["result"] == "r" * 100


async def test_running_override_caps_concurrency(
    admin: Api, capped: Api, deployment: Deployment, module_daemons: DaemonFactory
) -> None:
    """Each job marks itself running in a shared directory and reports how many
    marks it saw: under a cap of 1 that is always 1 (the daemon runs 8 at once)."""
    await set_limits(admin, "capped", running=1)
    marks = module_daemons.shared_dir("running-marks")
    body = (
        "import os, time\n"
        f"MARKS = {str(marks)!r}\n"
        "def handler(payload, ctx):\n"
        "    mine = os.path.join(MARKS, payload)\n"
        "    open(mine, 'w').close()\n"
        "    time.sleep(0.1)\n"
        "    seen = len(os.listdir(MARKS))\n"
        "    os.remove(mine)\n"
        "    return str(seen)\n"
    )
    await Handlers(capped).add("one", "python", body)
    ids = await capped.add("one", [f"j{n}" for n in range(8)])
    done = await wait_all_done(capped, ids, within=60)
    assert {job["result"] for job in done.values()} == {"1"}, done
