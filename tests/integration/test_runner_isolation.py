"""Handler isolation from the daemon and from other tenants, with real processes: no
network (a namespace of their own when the daemon is root), the daemon's files kept by
permissions (``queue_daemon.placement.protect_daemon_files``), one uid per tenant."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from queue_daemon.placement import protect_daemon_files
from queue_daemon.runners.models import HandlerSpec, JobInput
from queue_daemon.runners.pool import RunnerPool, RunnerSettings
from queue_daemon.runners.sandbox import tenant_ids
from queue_daemon.store.embedded import host_home
from tests.integration.test_runner_python import jobs

ROOT = os.geteuid() == 0
ISOLATED = ROOT and shutil.which("unshare") is not None
needs_root = pytest.mark.skipif(not ROOT, reason="handlers run as the daemon's uid when not root")
needs_netns = pytest.mark.skipif(not ISOLATED, reason="needs root and util-linux unshare")
PROCESSES = 4096

# the handler runs the probe named by its payload and returns what happened
PROBES = """\
import json, os, socket

def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except OSError as exc:
        return {"ok": False, "error": type(exc).__name__ + ": " + str(exc)}

def tcp(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return "connected"

def unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    with s:
        s.connect(path)
        return "connected"

def read(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")

def handler(payload, ctx):
    what, arg = json.loads(payload)
    if what == "tcp":
        return json.dumps(attempt(lambda: tcp(arg)))
    if what == "unix":
        return json.dumps(attempt(lambda: unix(arg)))
    if what == "read":
        return json.dumps(attempt(lambda: read(arg)))
    if what == "list":
        return json.dumps(attempt(lambda: os.listdir(arg)))
    if what == "self":  # a server on the namespace's own loopback, and a client of it
        def serve():
            with socket.create_server(("127.0.0.1", 0)) as server:
                with socket.create_connection(server.getsockname(), timeout=2):
                    return "connected"
        return json.dumps(attempt(serve))
    if what == "write":
        with open("secret", "w") as f:
            f.write("tenant secret")
        return json.dumps({"ok": True, "value": os.getcwd()})
    raise ValueError(what)
"""


def probes(client: str = "acme") -> HandlerSpec:
    return HandlerSpec(version="v1", client=client, type="probe", lang="python", body=PROBES)


async def probe(
    pool: RunnerPool, what: str, arg: object, client: str = "acme"
) -> dict[str, object]:
    (result,) = await pool.run_batch(probes(client), jobs(json.dumps([what, arg])))
    assert result.result is not None, result
    outcome: dict[str, object] = json.loads(result.result)
    return outcome


def unreachable(outcome: dict[str, object], pool: RunnerPool) -> bool:
    """Whether a probe was refused: not there at all behind the walls (the
    minimal view), not permitted where handlers see the whole file system."""
    error = str(outcome.get("error"))
    expected = "FileNotFoundError" if pool.sandbox.walled else "PermissionError"
    return outcome["ok"] is False and error.startswith(expected)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A daemon data directory laid out as the daemon leaves it, protected as at start."""
    path = Path(tempfile.mkdtemp(prefix="qd-data-"))
    journal = path / "journal-s1"
    journal.mkdir()
    (journal / "000001.jsonl").write_text('{"payload": "journal secret"}\n')
    (journal / "000001.jsonl").chmod(0o644)
    journal.chmod(0o755)
    (path / "queue-s1.log").write_text("log secret\n")
    (path / "queue-s1.log").chmod(0o644)
    protect_daemon_files(path, journal, path / "queue-s1.log", made=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["walls", "unshare"])
async def pool(data_dir: Path, request: pytest.FixtureRequest) -> AsyncIterator[RunnerPool]:
    """Behind bubblewrap's walls, and where there is no bubblewrap (util-linux
    unshare's namespaces, the tenant's uid), the work root below the protected
    data dir, as the daemon has it (DATA_DIR/run)."""
    bwrap = "auto" if request.param == "walls" else None
    settings = RunnerSettings(work_root=data_dir / "run", processes=PROCESSES, bwrap=bwrap)
    pool = RunnerPool(settings)
    await pool.sandbox.prepare()
    if request.param == "walls" and not pool.sandbox.walled:
        await pool.close()
        pytest.skip("bubblewrap is missing or fails here")
    yield pool
    await pool.close()


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="qd-open-"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def unix_server(path: Path, mode: int) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    os.chmod(path, mode)
    return server


def test_protect_daemon_files_modes(data_dir: Path) -> None:
    assert data_dir.stat().st_mode & 0o777 == 0o711
    assert (data_dir / "journal-s1").stat().st_mode & 0o777 == 0o700
    assert (data_dir / "journal-s1" / "000001.jsonl").stat().st_mode & 0o777 == 0o600
    assert (data_dir / "queue-s1.log").stat().st_mode & 0o777 == 0o600


@needs_netns
async def test_no_tcp_to_the_host_loopback(pool: RunnerPool, listener: int) -> None:
    outcome = await probe(pool, "tcp", listener)
    assert outcome["ok"] is False, outcome
    assert pool.sandbox.isolates_network


@needs_netns
async def test_no_abstract_unix_socket(pool: RunnerPool) -> None:
    # abstract unix sockets belong to the network namespace
    name = f"\0qd-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(name)
    server.listen()
    try:
        outcome = await probe(pool, "unix", name)
    finally:
        server.close()
    assert outcome["ok"] is False, outcome


@needs_netns
async def test_network_setting_true_keeps_the_old_behaviour(data_dir: Path, listener: int) -> None:
    pool = RunnerPool(RunnerSettings(work_root=data_dir / "run", processes=PROCESSES, network=True))
    try:
        outcome = await probe(pool, "tcp", listener)
    finally:
        await pool.close()
    assert outcome == {"ok": True, "value": "connected"}
    assert not pool.sandbox.isolates_network


@needs_root
async def test_unix_socket_is_kept_by_its_permissions(pool: RunnerPool, open_dir: Path) -> None:
    # a namespace does not cover filesystem sockets: a 0700/0600 socket keeps handlers out
    private = unix_server(open_dir / "private.sock", 0o600)
    try:
        outcome = await probe(pool, "unix", str(open_dir / "private.sock"))
    finally:
        private.close()
    assert unreachable(outcome, pool), outcome


@needs_root
async def test_world_writable_unix_socket_is_reachable_only_without_the_view(
    pool: RunnerPool, open_dir: Path
) -> None:
    """A socket file any user may write to is outside the minimal view; where
    handlers see the whole file system (no bubblewrap), it is reachable: the limit."""
    public = unix_server(open_dir / "public.sock", 0o777)
    try:
        outcome = await probe(pool, "unix", str(open_dir / "public.sock"))
    finally:
        public.close()
    if pool.sandbox.walled:
        assert outcome["ok"] is False and "FileNotFoundError" in str(outcome["error"]), outcome
    else:
        assert outcome == {"ok": True, "value": "connected"}


@needs_root
async def test_daemon_files_are_unreadable(pool: RunnerPool, data_dir: Path) -> None:
    journal_file = data_dir / "journal-s1" / "000001.jsonl"
    outcome = await probe(pool, "read", str(journal_file))
    assert unreachable(outcome, pool), outcome
    outcome = await probe(pool, "list", str(data_dir / "journal-s1"))
    assert outcome["ok"] is False, outcome
    outcome = await probe(pool, "read", str(data_dir / "queue-s1.log"))
    assert outcome["ok"] is False, outcome
    outcome = await probe(pool, "list", str(data_dir))
    if pool.sandbox.walled:  # only the way down to its own directory is there
        assert outcome == {"ok": True, "value": ["run"]}, outcome
    else:
        assert unreachable(outcome, pool), outcome


@needs_root
async def test_daemon_environment_is_unreadable(
    pool: RunnerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUEUE_DAEMON_SECRET", "s3cret")
    outcome = await probe(pool, "read", f"/proc/{os.getpid()}/environ")
    assert unreachable(outcome, pool), outcome


@needs_root
async def test_tenant_cannot_read_another_tenants_directory(pool: RunnerPool) -> None:
    written = await probe(pool, "write", None, client="globex")
    assert written["ok"] is True
    home = Path(str(written["value"]))
    assert (home / "secret").exists()  # the globex context stays warm, its dir with it
    outcome = await probe(pool, "read", str(home / "secret"), client="acme")
    assert unreachable(outcome, pool), outcome
    outcome = await probe(pool, "list", str(home), client="acme")
    assert unreachable(outcome, pool), outcome


@needs_netns
async def test_own_loopback_is_up(pool: RunnerPool, listener: int) -> None:
    await pool.sandbox.prepare()
    if not pool.sandbox.has_loopback:
        pytest.skip("iproute2 ip cannot bring a namespace's loopback up here")
    outcome = await probe(pool, "self", None)
    assert outcome == {"ok": True, "value": "connected"}
    outcome = await probe(pool, "tcp", listener)  # still not the host's loopback
    assert outcome["ok"] is False, outcome


SHM_HOG = (
    "name=qd-shm-$$; head -c 10485760 /dev/zero >/dev/shm/$name && echo wrote;"
    " ipcmk -M 1048576 >/dev/null && echo segment;"
    " head -c 104857600 /dev/zero >/dev/shm/big 2>/dev/null || echo full;"
    " echo $name"
)


def _left_on_host(name: str, uid: int) -> tuple[bool, list[str]]:
    """Whether /dev/shm/``name`` is on the host, and the System V shared memory
    segments of ``uid`` in the host's IPC namespace."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    segments = [line for line in lines if int(line.split()[7]) == uid]
    return Path("/dev/shm", name).exists(), segments


@needs_netns
async def test_shared_memory_a_handler_takes_is_private_and_gone_when_it_ends(
    pool: RunnerPool,
) -> None:
    """/dev/shm and System V shared memory are RAM no limit counts: a handler gets
    a private /dev/shm of its own size, and an IPC namespace of its own, both
    gone with its process tree; nothing of it reaches or stays in the host's."""
    await pool.sandbox.prepare()
    spec = HandlerSpec(version="v", client="acme", type="shm", lang="shell", body=SHM_HOG)
    (result,) = await pool.run_batch(spec, [JobInput(id="j1", payload="", attempt=1)])
    said = result.log
    assert said[:3] == ["wrote", "segment", "full"], result  # 100 MB do not fit in 64 MiB
    name = said[3]
    assert _left_on_host(name, tenant_ids("acme").uid) == (False, [])


def _real_paths(*paths: str | Path) -> list[Path]:
    return [Path(os.path.realpath(p)) for p in paths]


def _on_host_tmp(name: str) -> bool:
    return Path("/tmp", name).exists()


@needs_netns
async def test_a_handlers_tmp_is_its_own(tmp_path: Path) -> None:
    work_root = host_home(tmp_path) / "run"
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    try:
        await pool.sandbox.prepare()
        if not pool.sandbox.private_tmp:
            pytest.skip("the daemon's interpreter lies below /tmp: /tmp stays shared")
        name = f"qd-tmp-{os.getpid()}"
        write = HandlerSpec(
            version="v", client="acme", type="w", lang="shell", body=f"echo x >/tmp/{name}; ls /tmp"
        )
        (wrote,) = await pool.run_batch(write, [JobInput(id="j1", payload="", attempt=1)])
        # its /tmp holds only what it wrote, and the way down to what is bound for
        # it there (the interpreter's virtualenv, the work root, when below /tmp)
        bound = await asyncio.to_thread(_real_paths, sys.prefix, work_root)
        others = [n for n in wrote.log if n != name]
        assert name in wrote.log, wrote
        assert all(any(b.is_relative_to(Path("/tmp", n)) for b in bound) for n in others), wrote
        look = HandlerSpec(
            version="v", client="globex", type="r", lang="shell", body=f"ls /tmp/{name} || true"
        )
        (looked,) = await pool.run_batch(look, [JobInput(id="j2", payload="", attempt=1)])
        assert not any(name in line and "No such" not in line for line in looked.log), looked
        assert not _on_host_tmp(name)
    finally:
        await pool.close()
        shutil.rmtree(work_root.parent, ignore_errors=True)
