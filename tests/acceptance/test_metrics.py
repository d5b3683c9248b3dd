"""``/metrics``, ``/healthz`` and ``/readyz`` of a real daemon, as an operator's
Prometheus and load balancer see them.

The metrics text is read with prometheus-client's own parser; the counters of
a tenant's jobtype must move by exactly the jobs that were added, run and
finished.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.api import Api, Handlers, assert_error, until, wait_all_done
from harness.daemons import (
    DaemonFactory,
    Deployment,
    add_tenant,
    deploy,
    give_admin_token,
    reachable_dir,
    run_cli,
    store_args,
)
from harness.pgserver import PgServer
from tests.acceptance.scrape import Samples, label_values, names, scrape, value

CLIENT = "acme"
OTHER = "rival"
ECHO = "def handler(payload, ctx):\n    return 200, payload\n"


@pytest.fixture
def deployment(daemons: DaemonFactory, pg_dsn: str) -> Iterator[Deployment]:
    root = reachable_dir("qd-metrics-")  # handlers must reach the data dir
    deployed = deploy(daemons, pg_dsn, root, [CLIENT, OTHER])
    give_admin_token(deployed)
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped
        shutil.rmtree(root, ignore_errors=True)


async def test_metrics_need_the_operator_token(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    tenant = deployment.api(session, CLIENT)
    assert_error(await tenant.as_(CLIENT, None).metrics(), 401, "unauthorized")
    assert_error(await tenant.as_(CLIENT, "qd_not-a-token").metrics(), 401, "unauthorized")
    assert_error(await tenant.metrics(), 403, "forbidden")
    samples = await scrape(deployment.api(session, "*admin"))
    expected = {
        "queue_journal_unread_bytes",
        "queue_ingest_lag_seconds",
        "queue_sysid_info",
        "queue_sysid_lease_age_seconds",
        "queue_add_seconds_count",
        "queue_claim_seconds_count",
    }
    assert expected <= names(samples), sorted(names(samples))
    [sysid] = label_values(samples, "queue_sysid_info", "sysid")
    assert sysid == (await tenant.healthz()).json["sysid"]


async def test_counters_move_by_the_jobs_that_ran(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    api = deployment.api(session, CLIENT)
    admin = deployment.api(session, "*admin")
    before = await scrape(admin)
    labels = {"tenant": CLIENT, "type": "echo"}
    await Handlers(api).add("echo", "python", ECHO)
    ids = await api.add("echo", [f"p{i}" for i in range(5)])
    ids += await api.add("echo", ["q1", "q2"])
    idle = await api.add("idle", ["w1", "w2", "w3"])  # no handler: these wait
    jobs = await wait_all_done(api, ids, within=60)
    assert all(job["code"] == "ok" for job in jobs.values()), jobs

    async def settled() -> Samples | None:
        samples = await scrape(admin)
        finished = value(samples, "queue_jobs_finished_total", code="ok", **labels)
        depth = value(samples, "queue_depth", tenant=CLIENT, type="idle", state="waiting")
        return samples if finished >= len(ids) and depth == len(idle) else None

    after = await until(settled, 30, "the finished counter and the depth gauge", interval=0.5)

    def moved(name: str, **extra: str) -> float:
        return value(after, name, **extra) - value(before, name, **extra)

    assert moved("queue_jobs_added_total", **labels) == 7
    assert moved("queue_jobs_started_total", **labels) == 7
    assert moved("queue_jobs_finished_total", code="ok", **labels) == 7
    for code in ("failed", "retry", "error", "requeued"):
        assert moved("queue_jobs_finished_total", code=code, **labels) == 0, code
    assert moved("queue_jobs_added_total", tenant=CLIENT, type="idle") == 3
    assert moved("queue_jobs_started_total", tenant=CLIENT, type="idle") == 0
    assert moved("queue_add_seconds_count") == 3  # one observation per request
    assert moved("queue_claim_seconds_count") >= 1
    assert moved("queue_batch_run_seconds_count", lang="python") >= 1
    assert value(after, "queue_runner_cold_starts_total", lang="python") >= 1
    assert moved("queue_jobs_ingested_total") >= 10
    assert value(after, "queue_store_up") == 1
    assert value(after, "queue_journal_writable") == 1
    # the other tenant's name never appears: it did nothing
    assert OTHER not in label_values(after, "queue_jobs_added_total", "tenant")


async def test_label_caps_put_later_tenants_and_types_in_other(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    # --no-auth: /metrics is open, like every route
    daemon = daemons.start(
        tmp_path / "data", pg_dsn, "--no-auth", "--metrics-tenants", "2", "--metrics-types", "1"
    )
    api = Api(session, daemon.url, "a", None)
    adds = [("a", "x", 3), ("a", "y", 2), ("b", "x", 1), ("c", "x", 4), ("d", "z", 5)]
    for client, jobtype, count in adds:
        await api.as_(client, None).add(jobtype, [f"{client}{jobtype}{i}" for i in range(count)])
    samples = await scrape(api)
    added = "queue_jobs_added_total"
    assert value(samples, added, tenant="a", type="x") == 3
    assert value(samples, added, tenant="a", type="_other") == 2
    assert value(samples, added, tenant="b", type="_other") == 1
    assert value(samples, added, tenant="_other", type="_other") == 9
    assert label_values(samples, added, "tenant") == {"a", "b", "_other"}
    assert label_values(samples, added, "type") == {"x", "_other"}

    # every add ingested (pipelines may store them in any order): the gauge
    # shows each tenant's waiting jobs under the same labels as the counter
    expected = {("a", "x"): 3, ("a", "_other"): 2, ("b", "_other"): 1, ("_other", "_other"): 9}

    async def depth() -> Samples | None:
        got = await scrape(api)
        for (tenant, jobtype), count in expected.items():
            if value(got, "queue_depth", tenant=tenant, type=jobtype, state="waiting") != count:
                return None
        return got

    got = await until(depth, 30, "the capped depth gauge", interval=0.5)
    assert label_values(got, "queue_depth", "tenant") == {"a", "b", "_other"}


async def test_healthz_and_readyz_when_all_is_well(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    api = deployment.api(session, CLIENT)
    health = await api.healthz()
    assert health.status == 200, health
    assert health.json["status"] == "ok" and health.json["store"] == "ok", health
    ready = await api.readyz()
    assert ready.status == 200, ready
    body = ready.json
    assert body["status"] == "ok", body
    assert set(body["checks"]) == {"store", "journal", "ingest_lag", "sysid"}, body
    assert all(check["ok"] for check in body["checks"].values()), body
    assert body["checks"]["ingest_lag"]["threshold"] == 30, body


@pytest.fixture
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL server of the test's own, to stop and start again. Its directory is
    one the server's user can reach when the tests run as root."""
    root = reachable_dir("qd-own-pg-")
    server = PgServer(root)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_readyz_is_503_with_reasons_while_the_store_is_down(
    own_pg: PgServer,
    daemons: DaemonFactory,
    data_dir: Path,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    dsn = own_pg.start()
    token = add_tenant("t", store=dsn, data_dir=data_dir, cwd=tmp_path)
    done = run_cli("admin", "token", *store_args(dsn, data_dir), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    admin = done.stdout.strip().splitlines()[-1]
    daemon = daemons.start(data_dir, dsn, "--ready-lag", "1")
    api = Api(session, daemon.url, "t", token)
    assert (await api.readyz()).status == 200
    assert value(await scrape(api.as_("t", admin)), "queue_store_up") == 1

    own_pg.stop()
    [job_id] = await api.add("later", ["kept in the journal"])

    async def not_ready() -> dict[str, Any] | None:
        reply = await api.readyz()
        if reply.status == 200:
            return None
        body = assert_error(reply, 503, "unavailable")
        checks = body["checks"]
        return body if not checks["store"]["ok"] and not checks["ingest_lag"]["ok"] else None

    body = await until(not_ready, 30, "readyz 503 for the store and the ingest lag")
    checks = body["checks"]
    assert "store" in checks["store"]["reason"], body
    assert "over 1 s" in checks["ingest_lag"]["reason"], body
    assert checks["ingest_lag"]["seconds"] > 1, body
    assert checks["journal"] == {"ok": True}, body
    assert checks["store"]["reason"] in body["message"], body
    # liveness: still 200, saying what is wrong; /healthz (docs/api.md) is 503
    live = await api.request("GET", "/livez")
    assert live.status == 200, live
    assert live.json["store"] == "unreachable", live
    assert live.json["ingest_lag"]["lines"] >= 1, live
    assert_error(await api.healthz(), 503, "unavailable")
    # the metrics still answer (tokens are cached), and say the store is down

    async def store_down() -> Samples | None:
        got = await scrape(api.as_("t", admin))
        return got if value(got, "queue_store_up") == 0 else None

    down = await until(store_down, 30, "queue_store_up 0", interval=0.5)
    assert value(down, "queue_journal_unread_lines") >= 1
    assert value(down, "queue_ingest_lag_seconds") > 1

    assert own_pg.start() == dsn

    async def ready() -> bool | None:
        return True if (await api.readyz()).status == 200 else None

    await until(ready, 60, "readyz 200 once the store is back")
    await api.wait_job(job_id)
