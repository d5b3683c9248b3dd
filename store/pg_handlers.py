"""Handlers (``HandlerStore``) and the dashboard's reads (``Dashboard``)."""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

import orjson

from queue_daemon.domain.names import JobType
from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.domain.views import DaemonLease, FailedJob, QueueDepth, RunningJob, RunningJobs
from queue_daemon.store import queries
from queue_daemon.store.errors import LimitReached, NotFound
from queue_daemon.store.pg_base import Db, handler_of

logger = logging.getLogger(__name__)


class HandlersPart:
    """Handlers (``HandlerStore``) and the dashboard's reads (``Dashboard``)."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._last_handler_ns = 0

    # --- handlers -----------------------------------------------------------

    def _handler_id(self) -> str:
        # "h" + 16 hex digits of ns since the epoch + 8 random: sortable by
        # time across daemons, strictly increasing within this one
        now = max(time.time_ns(), self._last_handler_ns + 1)
        self._last_handler_ns = now
        return f"h{now:016x}{secrets.token_hex(4)}"

    async def put_handler(
        self, type: str, data: dict[str, object], max_handlers: int | None = None
    ) -> HandlerRecord:
        """Store a new version of ``type``'s handler. With ``max_handlers``, a
        type that has no live handler yet is refused (``LimitReached``) when its
        tenant already has that many. A handler that names a blob as its
        ``module`` is stored only while the blob is there (NotFound otherwise),
        under the lock of the tenant's blob deletes."""
        body = orjson.dumps(data).decode()
        module = data.get("module")
        if max_handlers is None and not module:
            row = await self._db.fetchrow(
                queries.handlers.PUT_HANDLER, self._handler_id(), type, body
            )
        else:
            client = JobType.client_of(type)
            async with self._db.conn() as conn, conn.transaction():
                if module:
                    await conn.execute(queries.blobs.LOCK_CLIENT_BLOBS, client)
                    if await conn.fetchval(queries.blobs.BLOB_SIZE, client, module) is None:
                        raise NotFound(f"no blob {module}")
                await conn.execute(queries.handlers.LOCK_CLIENT_HANDLERS, client)
                if max_handlers is not None and not await conn.fetchval(
                    queries.handlers.HANDLER_LIVE, type
                ):
                    live = await conn.fetchval(queries.handlers.COUNT_HANDLERS, client)
                    if live >= max_handlers:
                        raise LimitReached(f"{client} has {live} handlers, its limit")
                row = await conn.fetchrow(
                    queries.handlers.PUT_HANDLER, self._handler_id(), type, body
                )
        assert row is not None  # INSERT ... RETURNING
        return handler_of(row)

    async def get_handler(self, type: str) -> HandlerRecord:
        row = await self._db.fetchrow(queries.handlers.GET_HANDLER, type)
        if row is None:
            raise NotFound(f"no handler for {type!r}")
        return handler_of(row)

    async def delete_handler(self, type: str) -> None:
        if not await self._db.fetch(queries.handlers.DELETE_HANDLER, type):
            raise NotFound(f"no handler for {type!r}")

    async def count_handlers(self, client: str) -> int:
        async with self._db.conn() as conn:
            count: int = await conn.fetchval(queries.handlers.COUNT_HANDLERS, client)
        return count

    # --- the dashboard ------------------------------------------------------

    async def queue_depths(self, client: str | None, limit: int, cap: int) -> list[QueueDepth]:
        if client is None:
            rows = await self._db.fetch(queries.dashboard.QUEUE_DEPTHS_ALL, limit, cap)
        else:
            rows = await self._db.fetch(queries.dashboard.QUEUE_DEPTHS_CLIENT, client, limit, cap)
        return [QueueDepth(**dict(row.items())) for row in rows]

    async def running_jobs(self, client: str | None, limit: int) -> RunningJobs:
        if client is None:
            rows = await self._db.fetch(queries.dashboard.RUNNING_JOBS_ALL, limit)
        else:
            rows = await self._db.fetch(queries.dashboard.RUNNING_JOBS_CLIENT, client, limit)
        return RunningJobs(
            total=rows[0]["total"] if rows else 0,
            oldest=[_running(row) for row in rows],
        )

    async def recent_failures(
        self, client: str | None, limit: int, result_chars: int, *, type: str | None = None
    ) -> list[FailedJob]:
        if type is not None:
            rows = await self._db.fetch(
                queries.dashboard.RECENT_FAILURES_TYPE, type, limit, result_chars
            )
        elif client is None:
            rows = await self._db.fetch(queries.dashboard.RECENT_FAILURES_ALL, limit, result_chars)
        else:
            rows = await self._db.fetch(
                queries.dashboard.RECENT_FAILURES_CLIENT, client, limit, result_chars
            )
        return [FailedJob(**dict(row.items())) for row in rows]

    async def daemon_leases(self, limit: int) -> list[DaemonLease]:
        rows = await self._db.fetch(queries.dashboard.DAEMON_LEASES, limit)
        return [DaemonLease(**dict(row.items())) for row in rows]

    async def archived_counts(self) -> dict[str, int]:
        rows = await self._db.fetch(queries.dashboard.ARCHIVED_COUNTS)
        return {row["type"]: row["archived"] for row in rows}


def _running(row: Any) -> RunningJob:
    fields = {k: v for k, v in row.items() if k != "total"}
    lock = fields["sysid"]
    if lock.startswith("w:"):  # a pull worker's claim: its token stays out of sight
        fields["sysid"] = f"worker:{lock[queries.pulled.LOCK_PREFIX_LEN :]}"
    return RunningJob(**fields)
