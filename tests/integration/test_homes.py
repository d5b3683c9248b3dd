"""Nothing outlives its data directory: as root, the embedded server's data lives
below ``/var/lib/queue-daemon``, and once its data directory is deleted the sweep
stops the server and removes it, unless something still uses it."""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from queue_daemon.store import embedded
from queue_daemon.store.embedded import EmbeddedPostgres
from queue_daemon.store.homes import sweep_homes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the homes are root's")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in for ``/var/lib/queue-daemon``, which the server's user may pass."""
    path = Path(tempfile.mkdtemp(prefix="qd-home-"))
    path.chmod(0o711)
    monkeypatch.setattr(embedded, "SERVER_HOME", path)
    try:
        yield path
    finally:
        for pgdata in path.glob("*/pg"):
            embedded.stop_server(pgdata)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="qd-sweep-"))
    try:
        yield top / "data"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def postmaster(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_a_deleted_data_directorys_server_is_stopped_and_its_home_removed(
    root: Path, data_dir: Path
) -> None:
    daemon = EmbeddedPostgres(data_dir)
    dsn = await asyncio.to_thread(daemon.start)
    home = (data_dir / "pg").resolve().parent
    assert home.parent == root and (home / "data_dir").read_text().startswith(f"{data_dir}\n")
    pid = postmaster(home / "pg")
    shutil.rmtree(data_dir)  # under a daemon that still runs: it holds its pg.users lock
    [outcome] = sweep_homes(root)
    assert (outcome.removed, outcome.reason) == (False, f"in use by pid {os.getpid()}")

    assert daemon._user_fd is not None
    os.close(daemon._user_fd)  # the daemon is gone (as if killed); a client stays
    conn = await asyncpg.connect(dsn)
    try:
        [outcome] = sweep_homes(root)
        assert not outcome.removed and outcome.reason.endswith("has client connections")
    finally:
        await conn.close()

    [outcome] = await asyncio.to_thread(sweep_homes, root)
    assert outcome.removed and outcome.owner == data_dir
    assert not home.exists() and not alive(pid)
    assert await asyncio.to_thread(os.listdir, root) == [".homes.lock"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "queue_daemon", *args]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_DAEMON_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **extra}


def made_and_deleted(data_dir: Path) -> Path:
    """A data directory made by ``tenant add`` (its server started and stopped),
    then deleted; the home it leaves in the real ``/var/lib/queue-daemon``."""
    done = subprocess.run(
        cli("tenant", "add", "a", "--data-dir", str(data_dir)),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    home = (data_dir / "pg").resolve().parent
    assert home.parent == embedded.SERVER_HOME and (home / "pg" / "PG_VERSION").exists()
    shutil.rmtree(data_dir)
    return home


def test_admin_sweep_homes_removes_what_a_deleted_data_directory_left(data_dir: Path) -> None:
    home = made_and_deleted(data_dir)
    done = subprocess.run(
        cli("admin", "sweep-homes"),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not home.exists()  # (by this command, or a concurrent run's sweep)


def test_a_starting_daemon_sweeps(data_dir: Path, tmp_path: Path, pg_dsn: str) -> None:
    home = made_and_deleted(data_dir)
    env = clean_env(QUEUE_DAEMON_STORE=pg_dsn, QUEUE_DAEMON_LOG_LEVEL="DEBUG")
    daemon = subprocess.Popen(
        cli("serve", "--port", "0", "--data-dir", str(tmp_path / "other")),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert daemon.stderr is not None
        for line in daemon.stderr:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        seen = []
        while (line := lines.get(timeout=60)) is not None:
            seen.append(line)
            if f"swept {embedded.SERVER_HOME}:" in line:
                break
        assert line is not None, "".join(seen)
        assert not home.exists()
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        reader.join()
        assert daemon.stderr is not None
        daemon.stderr.close()
