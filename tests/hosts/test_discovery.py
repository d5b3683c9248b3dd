"""``serve --mdns`` and ``queue_daemon.client.discover`` between two "hosts"
(network namespaces on one bridge, tests/hosts/network.py): a daemon on one is
found from the other, by multicast DNS alone, and is gone once it stops.

Runs as root with ``ip``, ``nsenter`` and ``unshare``; elsewhere it is skipped
with the reason, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from harness.daemons import REPO, DaemonFactory
from tests.hosts.network import Host, Network, NetworkError, missing_tools

pytestmark = pytest.mark.timeout(120)

FIND = """
import asyncio, json, sys, urllib.request
from queue_daemon.client import discover

urls = asyncio.run(discover(float(sys.argv[1])))
health = {}
for url in urls:
    with urllib.request.urlopen(url + "/healthz", timeout=5) as reply:
        health[url] = json.load(reply)["sysid"]
print(json.dumps(health))
"""


def _missing(why: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the discovery test cannot run in CI: {why}")
    pytest.skip(why)


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    if os.geteuid() != 0:
        _missing("network namespaces need root")
    tools = missing_tools()
    if tools:
        _missing(f"missing tools: {', '.join(tools)}")
    net = Network(tmp_path / "hosts", store_name="store.qd.test")
    try:
        try:
            net.start()
            for name in ("alpha", "beta"):
                net.add_host(name)
        except NetworkError as exc:
            _missing(f"network namespaces cannot be made here: {exc}")
        yield net
    finally:
        net.close()
    assert net.leftovers() == [], "namespaces or links left behind"


def find_from(host: Host, seconds: float) -> dict[str, str]:
    """URL -> sysid of every daemon ``host`` discovers (and reaches)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_DAEMON_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [*host.wrap(), sys.executable, "-c", FIND, str(seconds)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, str] = json.loads(done.stdout)
    return found


def test_a_daemon_is_discovered_from_another_host_until_it_stops(
    network: Network, pg_dsn: str, tmp_path: Path
) -> None:
    alpha, beta = network.hosts
    logs = tmp_path / "logs"
    logs.mkdir()
    factory = DaemonFactory(logs)
    try:
        assert find_from(beta, 1.0) == {}
        daemon = factory.spawn(
            alpha.root / "data",
            pg_dsn,
            "--host",
            alpha.store_ip,
            "--mdns",
            name="alpha",
            wrapper=alpha.wrap(),
        )
        url = daemon.wait_ready()
        assert url.startswith(f"http://{alpha.store_ip}:"), url
        found = find_from(beta, 2.0)
        assert list(found) == [url], (found, daemon.stderr_text()[-3000:])
        assert found[url]  # its health answered with its sysid
        daemon.close()
        assert find_from(beta, 1.0) == {}
    finally:
        factory.close()
