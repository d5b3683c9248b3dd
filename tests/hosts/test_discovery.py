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

import pytest

from harness.daemons import REPO, DaemonFactory
from tests.hosts.network import Host, Network, hosts_on_a_bridge

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


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    root = tmp_path / "hosts"
    names = ("alpha", "beta")
    with hosts_on_a_bridge(root, names, store_name="store.qd.test", test="discovery") as net:
        yield net


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
