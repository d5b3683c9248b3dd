"""A journal whose file system fills up, on a real daemon: a small tmpfs the test
mounts (root only) holds the journal, and a ballast file fills it.

While it is full, every add is refused with 503 (once what fits in its last
pages is written) and the daemon says so on
``/readyz`` and ``/healthz`` (a load balancer sends adds elsewhere), nothing
acknowledged is lost, and service resumes once space returns. A daemon started
on a full journal disk exits with a one-line error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import Api, assert_error, until
from harness.daemons import DaemonFactory, add_tenant, run_cli, store_args

CLIENT = "acme"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted at the end."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write a ballast file until the file system has no byte left."""
    ballast = disk / "ballast"
    chunk = b"\0" * 65536
    with open(ballast, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        with contextlib.suppress(OSError):
            while True:  # the last partial block
                out.write(b"\0")
    return ballast


async def test_a_full_journal_disk_refuses_adds_says_so_and_recovers(
    small_disk: Path,
    pg_dsn: str,
    daemons: DaemonFactory,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    token = add_tenant(CLIENT, store=pg_dsn, data_dir=tmp_path / "data", cwd=tmp_path)
    daemon = daemons.start(tmp_path / "data", pg_dsn, "--journal", str(small_disk / "journal"))
    api = Api(session, daemon.url, CLIENT, token)
    before = await api.add("t", ["a", "b"])
    assert (await api.readyz()).status == 200

    ballast = fill(small_disk)
    ready = assert_error(await api.readyz(), 503)
    assert not ready["checks"]["journal"]["ok"], ready
    assert "full" in ready["checks"]["journal"]["reason"], ready
    health = assert_error(await api.healthz(), 503)
    assert health["journal"] == "failed", health
    assert (await api.livez()).status == 200  # restarting would not free the disk
    # what still fits in the file system's last pages is written and acknowledged;
    # then every add is refused
    acked: list[str] = []
    for n in range(200):
        reply = await api.add_raw("t", f"c{n}-" + "x" * 4000 + "\n")
        if reply.status != 200:
            assert_error(reply, 503)
            break
        acked += reply.json["ids"]
    else:
        raise AssertionError(f"{len(acked)} adds of 4 KB acknowledged on a full disk")
    assert_error(await api.add_raw("t", "d" * 8192 + "\n"), 503)

    ballast.unlink()

    async def ready_again() -> bool | None:
        return True if (await api.readyz()).status == 200 else None

    await until(ready_again, 10, "the daemon to be ready once space returned")
    after = await api.add("t", ["d"])
    await api.wait_caught_up()
    stored = {job["id"] for job in await api.all_jobs(type="t")}
    assert stored == set(before + acked + after), stored


def test_a_daemon_started_on_a_full_journal_disk_exits_with_one_line(
    small_disk: Path, pg_dsn: str, tmp_path: Path
) -> None:
    fill(small_disk)
    data = tmp_path / "data"
    done = run_cli(
        "serve",
        *store_args(pg_dsn, data),
        "--port",
        "0",
        "--journal",
        str(small_disk / "journal"),
        cwd=tmp_path,
    )
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("queue-daemon: error")]
    assert len(errors) == 1 and "No space left on device" in errors[0], done.stderr
