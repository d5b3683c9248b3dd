"""The walls in a container without ``privileged`` (compose.yaml): a daemon as
root with Docker's default capabilities only, read-only cgroups and the
project's seccomp profile (deploy/seccomp.json, harness/container.py) still
runs every tenant's handlers under their own uid, the syscall filter, the
minimal view and a PID namespace of their own.

Runs as root with ``unshare``, ``setpriv`` and bubblewrap; elsewhere it is
skipped with the reason, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import aiohttp
import pytest

from harness import container
from harness.api import Handlers, wait_done
from harness.daemons import DaemonFactory, Deployment, add_tenant
from tests.needs import missing

pytestmark = pytest.mark.timeout(120)

PROBE = """import os, socket
def handler(payload, ctx):
    status = open("/proc/self/status").read().splitlines()
    filters = next(l.split()[1] for l in status if l.startswith("Seccomp_filters"))
    caps = next(l.split()[1] for l in status if l.startswith("CapEff"))
    try:
        socket.create_connection(("127.0.0.1", int(payload)), timeout=2).close()
        daemon = "reached"
    except OSError:
        daemon = "refused"
    seen = [p for p in ("/var/lib", "/root", "/home") if os.path.exists(p)]
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return 200, f"{os.getuid()} {filters} {caps} {daemon} {seen} {pids}"
"""


def _missing(why: str) -> NoReturn:
    missing("the container test", why)


@pytest.fixture
def deployment(daemons: DaemonFactory, pg_dsn: str, open_tmp: Path) -> Iterator[Deployment]:
    if os.geteuid() != 0:
        _missing("a container's root needs this test's root")
    tools = [t for t in ("unshare", "setpriv", "bwrap", "awk") if shutil.which(t) is None]
    if tools:
        _missing(f"missing tools: {', '.join(tools)}")
    data_dir = open_tmp / "data"
    tokens = {c: add_tenant(c, store=pg_dsn, data_dir=data_dir, cwd=open_tmp) for c in ("a", "b")}
    daemon = daemons.spawn(data_dir, pg_dsn, wrapper=container.wrapper())
    daemon.wait_ready()
    try:
        yield Deployment(daemon=daemon, dsn=pg_dsn, data_dir=data_dir, cwd=open_tmp, tokens=tokens)
    finally:
        daemon.close()


async def test_walls_stand_in_a_container_without_privileges(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    port = deployment.daemon.url.rsplit(":", 1)[1]
    results = {}
    for client in ("a", "b"):
        api = deployment.api(session, client)
        await Handlers(api).add("probe", "python", PROBE, timeout=20)
        [job_id] = await api.add("probe", [port])
        job = await wait_done(api, job_id, within=60)
        assert job["code"] == "ok", (job, deployment.daemon.stderr_text()[-3000:])
        results[client] = job["result"].split(" ", 5)
    uids = {client: int(r[0]) for client, r in results.items()}
    assert len(set(uids.values())) == 2 and 0 not in uids.values(), results
    for _uid, filters, caps, daemon, seen, pids in results.values():
        assert filters == "2", results  # the container's and the handlers' own
        assert int(caps, 16) == 0, results
        assert daemon == "refused", results
        assert seen == "[]", results
        assert pids == "[1, 2]", results
    stderr = deployment.daemon.stderr_text()
    assert "no cgroup v2 for handlers: their PID namespaces" in stderr
