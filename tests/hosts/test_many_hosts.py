"""Three daemons on three "hosts" (network namespaces, each with its own data
directory) share one external PostgreSQL over TLS (``sslmode=verify-full``, the
server named by its certificate's host name, scram-sha-256 passwords).

Jobs added on one host run on the others. One host's link to the store is cut
while it runs jobs: they run again on the others once their lease passes, and
its own outcomes of them are refused when it is back; the jobs that host
acknowledges while cut off wait in its journal and reach the store when the
link returns. Nothing is lost or stored twice, as the store shows.

Runs as root with ``ip``, ``nsenter``, ``unshare``, ``openssl`` and Debian's
``postgresql`` (``scripts/test.sh`` installs it); elsewhere it is skipped with
the reason, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from harness.api import Api, Handlers, until
from harness.daemons import REPO, DaemonFactory, DaemonProcess
from queue_daemon.wiring.store import POOL_SIZE
from tests.acceptance.scrape import scrape
from tests.hosts import tlspg
from tests.hosts.network import Host, Network, hosts_on_a_bridge
from tests.needs import missing

pytestmark = pytest.mark.timeout(180)

STORE_NAME = "store.qd.test"
ROLE = DATABASE = "qd"
LEASE = 6  # seconds: the daemons' --lease, so a cut host's jobs move on quickly
HOLD = "4"  # seconds the jobs a host holds when it is cut off run
NAP = "import time\n\n\ndef handler(payload, ctx):\n    time.sleep(float(payload))\n"
CONCURRENCY = 2  # jobs a host runs at once, so the others must take the rest
DAEMON_ARGS = (
    "--lease",
    str(LEASE),
    "--concurrency",
    str(CONCURRENCY),
    "--max-batch",
    "1",
    "--drain-timeout",
    "5",
)


TEST = "the many-hosts test"


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    why = tlspg.missing()
    if why:
        missing(TEST, why)
    names = ("alpha", "beta", "gamma")
    with hosts_on_a_bridge(tmp_path / "hosts", names, store_name=STORE_NAME, test=TEST) as net:
        yield net


@pytest.fixture
def store(network: Network) -> Iterator[tlspg.TlsPostgres]:
    server = tlspg.TlsPostgres(
        address=network.store_ip, server_name=STORE_NAME, networks=[network.store_cidr]
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def factory(tmp_path: Path, store: tlspg.TlsPostgres) -> Iterator[DaemonFactory]:
    """Daemons, stopped before the store and the namespaces go."""
    logs = tmp_path / "logs"
    logs.mkdir()
    made = DaemonFactory(logs)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def _host_dsn(store: tlspg.TlsPostgres, host: Host) -> str:
    """The host's DSN, verified against its own copy of the CA certificate."""
    ca = host.root / "ca.crt"
    if not ca.exists():
        shutil.copy(store.ca_crt, ca)
    return store.dsn(ROLE, DATABASE, ca=ca)


def _env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_DAEMON_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["QUEUE_DAEMON_STORE"] = dsn  # not on the command line, where /proc shows it
    return env


def _run_cli(host: Host, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*host.wrap(), sys.executable, "-m", "queue_daemon", *args]
    return subprocess.run(
        [*argv, "--data-dir", str(host.root / "data")],
        env=_env(dsn),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _cli(store: tlspg.TlsPostgres, host: Host, *args: str) -> str:
    done = _run_cli(host, _host_dsn(store, host), *args)
    assert done.returncode == 0, f"{args} on {host.name}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _bad_dsns_fail_at_once(store: tlspg.TlsPostgres, host: Host) -> None:
    """A DSN the certificate does not match, or whose CA file is missing, is an error
    said at once, not an outage waited out."""
    by_address = store.dsn(ROLE, DATABASE, ca=host.root / "ca.crt", host=store.address)
    missing = host.root / "no-such-ca.crt"
    for dsn, said in (
        (by_address, "certificate verify failed"),
        (store.dsn(ROLE, DATABASE, ca=missing), f"sslrootcert={missing}, which cannot be read"),
    ):
        done = _run_cli(host, dsn, "tenant", "list")
        assert done.returncode == 1, done
        assert said in done.stderr, done.stderr
        assert "waiting for the store" not in done.stderr, done.stderr
        assert store.password not in done.stderr


async def _jobs(store: tlspg.TlsPostgres, ids: list[str]) -> dict[str, dict[str, Any]]:
    conn = await store.connect_admin(DATABASE)
    try:
        rows = await conn.fetch(
            "SELECT id, lock, code, runs FROM all_jobs WHERE id = ANY($1::text[])", ids
        )
    finally:
        await conn.close()
    return {
        r["id"]: {"lock": r["lock"], "code": r["code"], "runs": json.loads(r["runs"] or "[]")}
        for r in rows
    }


async def _all_done(
    store: tlspg.TlsPostgres, ids: list[str], within: float, what: str
) -> dict[str, dict[str, Any]]:
    async def probe() -> dict[str, dict[str, Any]] | None:
        jobs = await _jobs(store, ids)
        done = len(jobs) == len(ids) and all(j["lock"] == "__done" for j in jobs.values())
        return jobs if done else None

    return await until(probe, within, what, interval=0.2)


def _by(job: dict[str, Any]) -> str:
    """The sysid of the job's last run."""
    return str(job["runs"][-1]["by"]).removeprefix("sysid:")


async def _tls_is_required_and_verified(store: tlspg.TlsPostgres) -> None:
    plain = f"postgresql://{ROLE}:{store.password}@{store.address}:{store.port}/{DATABASE}"
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encryption"):
        await asyncpg.connect(plain + "?sslmode=disable", timeout=10)
    by_address = store.dsn(ROLE, DATABASE, ca=store.ca_crt, host=store.address)
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncpg.connect(by_address, timeout=10)


async def _daemon_connections(store: tlspg.TlsPostgres) -> list[tuple[str, bool]]:
    conn = await store.connect_admin()
    try:
        rows = await conn.fetch(
            "SELECT host(a.client_addr) AS addr, s.ssl FROM pg_stat_activity a"
            " JOIN pg_stat_ssl s USING (pid)"
            " WHERE a.datname = $1 AND a.application_name LIKE 'queue_daemon%'",
            DATABASE,
        )
    finally:
        await conn.close()
    return [(r["addr"], r["ssl"]) for r in rows]


async def test_daemons_on_three_hosts_share_one_store_over_tls(
    network: Network,
    store: tlspg.TlsPostgres,
    factory: DaemonFactory,
    session: aiohttp.ClientSession,
) -> None:
    started = time.monotonic()
    alpha, beta, gamma = network.hosts
    await store.create(ROLE, DATABASE)
    await _tls_is_required_and_verified(store)

    token = _cli(store, alpha, "tenant", "add", "acme").strip().splitlines()[-1]
    _bad_dsns_fail_at_once(store, alpha)
    operator = _cli(store, beta, "admin", "token").strip().splitlines()[-1]
    daemons: dict[str, DaemonProcess] = {
        host.name: factory.spawn(
            host.root / "data",
            None,
            "--host",
            host.ctl_ip,
            *DAEMON_ARGS,
            name=host.name,
            env=_env(_host_dsn(store, host)),
            wrapper=host.wrap(),
        )
        for host in network.hosts
    }
    apis = {}
    sysids = {}
    for name, daemon in daemons.items():
        apis[name] = Api(session, daemon.wait_ready(), "acme", token)
        health = await apis[name].healthz()
        assert health.status == 200, health
        sysids[name] = health.json["sysid"]
    assert len(set(sysids.values())) == 3, sysids

    # every daemon's connections come from its own host, over TLS: its pool and
    # its listener (docs/deploy.md sizes max_connections with this)
    expected = {h.store_ip: POOL_SIZE + 1 for h in network.hosts}
    connections: list[tuple[str, bool]] = []

    async def all_connected() -> bool | None:
        nonlocal connections
        connections = await _daemon_connections(store)
        return True if Counter(addr for addr, _ in connections) == expected else None

    try:
        # the listener connects just after the daemon says it listens
        await until(all_connected, 10, "each daemon's connections", interval=0.1)
    except AssertionError:
        raise AssertionError(f"expected {expected}, connected: {connections}") from None
    assert all(encrypted for _, encrypted in connections), connections

    # jobs added on one host run on the others too
    await Handlers(apis["alpha"]).add("nap", "python", NAP)
    spread = await apis["alpha"].add("nap", ["1"] * 12)
    jobs = await _all_done(store, spread, 60, "the jobs added on alpha to be done")
    assert all(j["code"] == "ok" for j in jobs.values()), jobs
    ran_on = {_by(j) for j in jobs.values()}
    assert {sysids["beta"], sysids["gamma"]} <= ran_on, (ran_on, sysids)

    # gamma is cut off from the store while it runs jobs: as many as it may run,
    # so it claims none after they are counted
    held_by_all = await apis["gamma"].add("nap", [HOLD] * 3 * CONCURRENCY)

    async def gamma_holds() -> list[str] | None:
        jobs = await _jobs(store, held_by_all)
        held = [i for i, j in jobs.items() if j["lock"] == sysids["gamma"]]
        return held if len(held) == CONCURRENCY else None

    held = await until(gamma_holds, 30, "gamma to run its share of the jobs", interval=0.1)
    network.cut(gamma)

    async def gamma_sees_the_cut() -> bool | None:
        reply = await apis["gamma"].healthz()
        return True if reply.status == 503 and reply.json["store"] != "ok" else None

    await until(gamma_sees_the_cut, 30, "gamma's /healthz to report the store unreachable")
    # acknowledged while cut off: in gamma's journal only
    while_cut = await apis["gamma"].add("nap", ["0.05"] * 20)
    livez = await apis["gamma"].livez()
    assert livez.status == 200 and livez.json["ingest_lag"]["lines"] > 0, livez

    # gamma's jobs run again elsewhere once their lease passes
    jobs = await _all_done(store, held, 4 * LEASE + 30, "gamma's jobs to run elsewhere")
    for job_id, job in jobs.items():
        assert job["code"] == "ok", job
        assert _by(job) != sysids["gamma"], job
        expired = [r for r in job["runs"] if r.get("reason") == "lease-expired"]
        assert [r["by"] for r in expired] == [f"sysid:{sysids['gamma']}"], (job_id, job["runs"])
    assert await _jobs(store, while_cut) == {}, "jobs reached the store over a cut link"

    network.mend(gamma)

    async def outcomes_refused() -> float | None:
        # gamma's own runs of those jobs ended while it was cut off: the store
        # refuses their outcomes once it hears from gamma again
        samples = await scrape(apis["gamma"].as_("acme", operator))
        lost = sum(v for (n, _), v in samples.items() if n == "queue_jobs_lost_lease_total")
        return lost if lost >= len(held) else None

    lost = await until(outcomes_refused, 30, "gamma's outcomes of the moved jobs refused")
    assert lost == len(held)
    jobs = await _all_done(store, while_cut, 90, "the jobs gamma took while cut off to be done")
    assert all(j["code"] == "ok" for j in jobs.values()), jobs
    caught_up = await apis["gamma"].wait_caught_up(within=30)
    assert caught_up["sysid"] == sysids["gamma"], caught_up
    await _all_done(store, held_by_all, 60, "every job gamma was given before the cut")

    # nothing lost, nothing twice
    acked = spread + held_by_all + while_cut
    conn = await store.connect_admin(DATABASE)
    try:
        stored = await conn.fetch("SELECT id, code FROM all_jobs")
    finally:
        await conn.close()
    assert sorted(r["id"] for r in stored) == sorted(acked)
    assert {r["code"] for r in stored} == {"ok"}
    for name, daemon in daemons.items():
        assert daemon.terminate() == 0, (name, daemon.stderr_text()[-3000:])
    print(f"many hosts: {time.monotonic() - started:.1f} s")
