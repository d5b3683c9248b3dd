"""The daemon and the CLI run as a user runs them: real processes, real pipes.

``DaemonProcess`` starts ``python -m queue_daemon serve --port 0 …``, waits for
its ``listening on http://HOST:PORT`` line (with a deadline, the process's
stderr in any failure), and can be stopped by SIGTERM or SIGKILL. Its stderr
goes to a file, so the pipe never blocks and tests can read the log.
``DaemonFactory`` remembers every process it started and stops them all.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp

from harness.api import Api

READY_RE = re.compile(r"^listening on (http://\S+)$")
START_TIMEOUT = 60.0  # the first start of an embedded server runs initdb
STOP_TIMEOUT = 30.0
CLI_TIMEOUT = 60.0


REPO = Path(__file__).resolve().parents[1]


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # tests never hand the operator's settings to the processes they start, and
    # always run the code of this checkout (not whatever an install points at)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_DAEMON_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


class DaemonProcess:
    """One ``queue-daemon serve`` process."""

    def __init__(
        self,
        *,
        data_dir: Path,
        store: str | None,
        args: Sequence[str],
        log_dir: Path,
        name: str,
        env: Mapping[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        """``wrapper``: an argv prefix the daemon is run under (e.g. ``nsenter …``), which
        must exec the daemon so that ``pid`` stays the daemon's."""
        self.data_dir = data_dir
        self.store = store
        self.name = name
        self.stderr_path = log_dir / f"{name}.stderr"
        self.stdout_lines: list[str] = []
        self.url = ""
        self._sigterm_sent = False
        cmd = [*wrapper, sys.executable, "-m", "queue_daemon", "serve", "--port", "0"]
        cmd += ["--data-dir", str(data_dir)]
        if store is not None:
            cmd += ["--store", store]
        cmd += list(args)
        self.cmd = cmd
        self._stderr: IO[bytes] = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=log_dir,
            env=_env(env),
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def stderr_text(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def _fail(self, why: str) -> AssertionError:
        return AssertionError(
            f"daemon {self.name} {why}\ncommand: {' '.join(self.cmd)}\n"
            f"stdout: {self.stdout_lines}\n--- stderr ---\n{self.stderr_text()[-6000:]}"
        )

    def wait_ready(self, timeout: float = START_TIMEOUT) -> str:
        """Block until the ``listening on`` line; return the URL."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(f"printed no 'listening on' line within {timeout:.0f} s")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                code = self.proc.wait(timeout=STOP_TIMEOUT)
                raise self._fail(f"exited with status {code} before it was ready")
            self.stdout_lines.append(line)
            match = READY_RE.match(line.strip())
            if match:
                self.url = match[1]
                return self.url

    def running(self) -> bool:
        return self.proc.poll() is None

    def sigterm(self) -> None:
        """Send SIGTERM once: a second one is not what a supervisor sends to stop a daemon."""
        if not self._sigterm_sent and self.running():
            self._sigterm_sent = True
            self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (once) and wait; return the exit status (fails the test on timeout)."""
        self.sigterm()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self._fail(f"did not exit within {timeout:.0f} s of SIGTERM") from None

    def kill(self) -> None:
        """SIGKILL by pid, then reap."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT)

    def close(self) -> None:
        """Stop the process whatever its state (SIGTERM, then SIGKILL) and free the pipes."""
        if self.running():
            self.sigterm()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=STOP_TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


class DaemonFactory:
    """Starts daemons for a test (or a module) and stops every one of them at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[DaemonProcess] = []
        # bound read-write into every handler's view (--handler-share): the
        # directories of ``shared_dir``, where handlers leave facts for the tests
        self.share = reachable_dir("qd-share-")

    def shared_dir(self, name: str = "shared") -> Path:
        """A new world-writable directory every handler of these daemons sees, for
        files that handlers write and tests read."""
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.share))
        path.chmod(0o777)
        return path

    def spawn(
        self,
        data_dir: Path,
        store: str | None,
        *args: str,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ) -> DaemonProcess:
        """Popen a daemon without waiting for it (to start several at the same moment)."""
        name = name or f"daemon{len(self.started) + 1}"
        daemon = DaemonProcess(
            data_dir=data_dir,
            store=store,
            args=(*args, "--handler-share", str(self.share)),
            log_dir=self.log_dir,
            name=name,
            env=env,
            wrapper=wrapper,
        )
        self.started.append(daemon)
        return daemon

    def start(
        self,
        data_dir: Path,
        store: str | None,
        *args: str,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> DaemonProcess:
        """Start a daemon and wait until it listens."""
        daemon = self.spawn(data_dir, store, *args, name=name, env=env)
        daemon.wait_ready()
        return daemon

    def close(self) -> None:
        for daemon in self.started:  # all stop at once: each drains its running jobs
            daemon.sigterm()
        for daemon in self.started:
            daemon.close()
        shutil.rmtree(self.share, ignore_errors=True)


def journal_dirs(data_dir: Path) -> list[Path]:
    """The daemons' journals in ``data_dir`` (``journal-<sysid>``)."""
    return sorted(data_dir.glob("journal-*"))


def only_journal(data_dir: Path) -> Path:
    found = journal_dirs(data_dir)
    assert len(found) == 1, f"expected one journal in {data_dir}, found {found}"
    return found[0]


def run_cli(
    *args: str, cwd: Path, timeout: float = CLI_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``python -m queue_daemon ARGS``; never raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "queue_daemon", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(),
        timeout=timeout,
        check=False,
    )


def store_args(store: str | None, data_dir: Path) -> list[str]:
    args = ["--data-dir", str(data_dir)]
    if store is not None:
        args += ["--store", store]
    return args


def add_tenant(client: str, *, store: str | None, data_dir: Path, cwd: Path) -> str:
    """Create a tenant with the real CLI; return its token (the last line of stdout)."""
    done = run_cli("tenant", "add", client, *store_args(store, data_dir), cwd=cwd)
    assert done.returncode == 0, f"tenant add {client} failed:\n{done.stdout}\n{done.stderr}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"tenant add {client} printed nothing"
    return lines[-1].strip()


@dataclass
class Deployment:
    """A running daemon, its store and data directory, and its tenants' tokens."""

    daemon: DaemonProcess
    dsn: str
    data_dir: Path
    cwd: Path
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.daemon.url

    def api(self, session: aiohttp.ClientSession, client: str) -> Api:
        return Api(session, self.url, client, self.tokens.get(client))


def deploy(
    factory: DaemonFactory,
    dsn: str,
    root: Path,
    clients: list[str],
    *args: str,
    env: Mapping[str, str] | None = None,
) -> Deployment:
    """Create ``clients`` with the CLI, then start one daemon on ``dsn``."""
    data_dir = root / "data"
    tokens = {c: add_tenant(c, store=dsn, data_dir=data_dir, cwd=root) for c in clients}
    daemon = factory.start(data_dir, dsn, *args, env=env)
    return Deployment(daemon=daemon, dsn=dsn, data_dir=data_dir, cwd=root, tokens=tokens)


def give_admin_token(deployed: Deployment) -> None:
    """Issue an operator token with the CLI, as ``deployed.tokens["*admin"]``."""
    done = run_cli("admin", "token", *store_args(deployed.dsn, deployed.data_dir), cwd=deployed.cwd)
    assert done.returncode == 0, done.stderr
    deployed.tokens["*admin"] = done.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def deployed_where_handlers_reach(
    factory: DaemonFactory, dsn: str, prefix: str, clients: list[str], *args: str
) -> Iterator[Deployment]:
    """``deploy`` in a new ``reachable_dir``; the daemon stopped and the directory
    removed at the end."""
    root = reachable_dir(prefix)
    try:
        deployed = deploy(factory, dsn, root, clients, *args)
        try:
            yield deployed
        finally:
            deployed.daemon.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def living_in(home: str | Path) -> list[int]:
    """The host pids of live processes whose working directory is ``home`` (a
    handler's own directory: its pid inside its PID namespace is not the host's)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                # a directory removed under a live process reads "… (deleted)"
                if os.readlink(f"/proc/{entry}/cwd").removesuffix(" (deleted)") == str(home):
                    found.append(int(entry))
    return found


def reachable_dir(prefix: str) -> Path:
    """A new directory that handler processes can reach (remove it with ``shutil.rmtree``).

    Handlers run as an unprivileged user when the tests run as root, and pytest's
    ``tmp_path`` lies below a 0700 directory that such a user cannot enter: a
    daemon whose data directory (and so its handlers' work root) is there cannot
    run a single handler. This one is made directly in the system's temp
    directory, mode 0755.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path
