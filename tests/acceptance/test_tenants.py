"""Tenants are walled off (docs/architecture.md invariant 5) and managed with the real CLI.

One daemon for the module with tenants ``a``, ``ab`` (a prefix of ``a``'s
name plus one letter), ``b``, and ``gone`` and ``again`` for the revoke tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import aiohttp
import pytest

from harness.api import Api, Reply, assert_error, until
from harness.daemons import (
    DaemonFactory,
    Deployment,
    add_tenant,
    deploy,
    run_cli,
    store_args,
)

Route = Callable[[Api], Awaitable[Reply]]

# every tenant route of docs/api.md's Jobs section, on an id that exists for someone
ROUTES: dict[str, Route] = {
    "add": lambda api: api.add_raw("t", "x\n"),
    "get": lambda api: api.get_job("0000000000000-1"),
    "cancel": lambda api: api.cancel("0000000000000-1"),
    "jobs": lambda api: api.jobs(),
    "stats": lambda api: api.stats(),
}


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(
        module_daemons,
        module_dsn,
        tmp_path_factory.mktemp("tenants"),
        ["a", "ab", "b", "gone", "again"],
    )
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


def cli(deployment: Deployment, *args: str) -> tuple[int, str, str]:
    done = run_cli(
        *args[:2], *store_args(deployment.dsn, deployment.data_dir), *args[2:], cwd=deployment.cwd
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("route", ROUTES)
async def test_missing_or_wrong_token_is_401(
    deployment: Deployment, session: aiohttp.ClientSession, route: str
) -> None:
    call = ROUTES[route]
    a = deployment.api(session, "a")
    assert_error(await call(a.as_("a", None)), 401)
    assert_error(await call(a.as_("a", "qd_not-a-token")), 401)
    assert_error(await call(a.as_("a", deployment.tokens["a"] + "x")), 401)
    assert_error(await call(a.as_("a", deployment.tokens["a"][:-1])), 401)
    # the token in another scheme, or the scheme without a token
    for header in (f"Basic {deployment.tokens['a']}", "Bearer", "Bearer ", deployment.tokens["a"]):
        reply = await a.request("GET", "/a/stats", headers={"Authorization": header}, auth=False)
        assert_error(reply, 401)


@pytest.mark.parametrize("route", ROUTES)
async def test_token_of_another_client_is_403(
    deployment: Deployment, session: aiohttp.ClientSession, route: str
) -> None:
    call = ROUTES[route]
    a = deployment.api(session, "a")
    for path_client in ("b", "ab", "gone"):
        assert_error(await call(a.as_(path_client, deployment.tokens["a"])), 403)
    assert_error(await call(a.as_("a", deployment.tokens["ab"])), 403)


async def test_jobs_of_one_tenant_are_404_for_another(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    a = deployment.api(session, "a")
    ids = await a.add("secret", ["a1", "a2"])
    for job_id in ids:
        await a.wait_job(job_id)
    for other in ("b", "ab"):
        api = deployment.api(session, other)
        for job_id in ids:
            get, cancel = await api.get_job(job_id), await api.cancel(job_id)
            assert_error(get, 404)
            assert_error(cancel, 404)
            # exactly what an id that does not exist gets
            assert get.json["error"] == (await api.get_job(job_id + "0")).json["error"]
    for job_id in ids:
        job = (await a.get_job(job_id)).json
        assert job["state"] == "waiting", f"another tenant's cancel touched {job}"


async def test_lists_and_stats_never_show_another_tenants_jobs(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    a, ab, b = (deployment.api(session, c) for c in ("a", "ab", "b"))
    # "b-x" is a type of a's: stored as "a-b-x", it must stay a's and never be b's
    a_ids = await a.add("x", ["a-x"]) + await a.add("b-x", ["a-b-x"])
    ab_ids = await ab.add("x", ["ab-x"]) + await ab.add("b", ["ab-b"])
    for api, job_ids in ((a, a_ids), (ab, ab_ids)):
        for job_id in job_ids:
            await api.wait_job(job_id)

    assert {job["id"] for job in await a.all_jobs()} >= set(a_ids)
    assert not {job["id"] for job in await a.all_jobs()} & set(ab_ids)
    assert {job["id"] for job in await ab.all_jobs()} == set(ab_ids)
    assert await b.all_jobs() == []
    assert await b.all_jobs(type="x") == []
    assert [job["id"] for job in await ab.all_jobs(type="x")] == ab_ids[:1]
    assert [job["id"] for job in await a.all_jobs(type="b-x")] == a_ids[1:]

    b_stats = await b.stats()
    assert b_stats.status == 200 and b_stats.json["types"] == {}, b_stats
    ab_types = (await ab.stats()).json["types"]
    assert set(ab_types) == {"x", "b"}
    assert ab_types["x"]["waiting"] == 1
    a_types = (await a.stats()).json["types"]
    assert {"x", "b-x"} <= set(a_types)
    assert a_types["x"]["waiting"] >= 1


def test_tenant_list_shows_every_tenant(deployment: Deployment) -> None:
    code, out, err = cli(deployment, "tenant", "list")
    assert code == 0, err
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"a", "ab", "b"} <= listed, out
    assert not any(token in out for token in deployment.tokens.values()), "list shows tokens"


async def test_adding_a_tenant_twice_fails_and_keeps_the_first_token(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    code, out, err = cli(deployment, "tenant", "add", "a")
    assert code != 0, out
    assert "exists" in err, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not out.strip(), f"a failed add printed a token: {out}"
    assert (await deployment.api(session, "a").stats()).status == 200
    code, out, err = cli(deployment, "tenant", "add", "Not-Valid")
    assert code != 0, out
    assert "Traceback" not in err and err.strip(), err


async def test_revoked_token_is_401_within_seconds(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    gone = deployment.api(session, "gone")
    assert (await gone.stats()).status == 200
    code, _, err = cli(deployment, "tenant", "revoke", "gone")
    assert code == 0, err

    async def refused() -> Reply | None:
        reply = await gone.stats()
        return reply if reply.status == 401 else None

    assert_error(await until(refused, 10, "the revoked token to be refused"), 401)
    assert_error(await gone.add_raw("t", "x"), 401)
    _, listing, _ = cli(deployment, "tenant", "list")
    assert any(line.split()[:2] == ["gone", "revoked"] for line in listing.splitlines()), listing
    # the other tenants are untouched
    assert (await deployment.api(session, "a").stats()).status == 200
    code, _, err = cli(deployment, "tenant", "revoke", "gone")
    assert code != 0, "revoking twice should fail"


async def test_a_revoked_tenant_added_again_gets_a_new_token(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    old = deployment.api(session, "again")
    [job_id] = await old.add("t", ["kept"])
    await old.wait_job(job_id)
    code, _, err = cli(deployment, "tenant", "revoke", "again")
    assert code == 0, err
    token = add_tenant(
        "again", store=deployment.dsn, data_dir=deployment.data_dir, cwd=deployment.cwd
    )
    assert token != deployment.tokens["again"]
    new = old.as_("again", token)

    async def switched() -> bool | None:
        old_status, new_status = (await old.stats()).status, (await new.stats()).status
        return True if (old_status, new_status) == (401, 200) else None

    await until(switched, 10, "the old token refused and the new one accepted")
    assert (await new.get_job(job_id)).status == 200, "the tenant's jobs stay its own"
