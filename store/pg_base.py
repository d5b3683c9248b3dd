"""The base of ``PgStore``: the pool and its life, and the row helpers the
per-concern parts (``pg_jobs``, ``pg_queue``, ``pg_tenants``, ``pg_handlers``)
share.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import asyncpg
import orjson

from queue_daemon.domain.jobs import Job, JobState, Resolution
from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.store import queries
from queue_daemon.store.dsn import check_tls_files
from queue_daemon.store.migrate import applied_migrations as _applied_versions
from queue_daemon.store.migrate import migrate as apply_migrations
from queue_daemon.store.translate import is_unavailable, translate

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = asyncpg.Connection | PoolConnectionProxy[asyncpg.Record]

from typing import Self

R = TypeVar("R", bound="DataclassInstance")

logger = logging.getLogger(__name__)


_CLOSE_TIMEOUT = 10.0


def state_of(lock: str, dt: datetime | None = None) -> JobState:
    if lock == "":
        # a blocked job's dt is 'infinity' (asyncpg reads it as datetime.max)
        return JobState.BLOCKED if dt is not None and dt.year == 9999 else JobState.WAITING
    if lock == "__done":
        return JobState.DONE
    return JobState.RUNNING


def row_as(cls: type[R], row: asyncpg.Record) -> R:
    """A dataclass whose every field is a column of ``row`` by the same name."""
    return cls(**{f.name: row[f.name] for f in fields(cls)})


def job_of(row: asyncpg.Record) -> Job:
    return Job(
        id=row["id"],
        type=row["type"],
        state=state_of(row["lock"], row["dt"]),
        dt=row["dt"],
        create_dt=row["create_dt"],
        done_dt=row["done_dt"],
        attempts=row["attempts"],
        code=row["code"],
        exitcode=row["exitcode"],
        result=row["result"],
        data=row["data"],
        runs=_runs(row),
    )


def _runs(row: asyncpg.Record) -> list[dict[str, object]] | None:
    """The job's runs when the query read them (``GET_JOB``), else None."""
    try:
        raw = row["runs"]
    except KeyError:
        return None
    runs: list[dict[str, object]] = [] if raw is None else orjson.loads(raw)
    return runs


def handler_of(row: asyncpg.Record) -> HandlerRecord:
    data = orjson.loads(row["data"])
    return HandlerRecord(id=row["id"], type=row["type"], dt=row["dt"], data=data)


async def _init_connection(conn: Connection) -> None:
    await conn.execute(queries.migrations.CREATE_JOBS_IN)


async def _no_reset(conn: Connection) -> None:
    """A connection goes back to the pool as it is (asyncpg has already rolled back
    a transaction left open): no reset query (advisory unlock, CLOSE ALL, UNLISTEN,
    RESET ALL), which cost every store call one more round trip, made before its
    result reached the caller. Nothing here keeps session state on a pooled
    connection: settings are set for the transaction only (``set_config(..., true)``),
    advisory locks are transaction locks (the migration lock is released in a
    ``finally``), no cursor outlives its transaction, and LISTEN runs on a
    connection of its own."""


class PgBase:
    """The job store on PostgreSQL: the pool, its life, and the helpers every part uses.

    Every call takes a connection from the pool and returns it; asyncpg errors
    leave as ``queue_daemon.store.errors`` (``StoreUnavailable`` when the server cannot be
    reached). The pool replaces dead connections on its own, so the first call
    after PostgreSQL comes back works without any reconnect by the caller.
    """

    COPY_PARTS = 2  # connections one add_jobs call copies over at once
    # Batches up to this size go in as one INSERT statement (one round trip)
    # rather than a COPY (five: begin, the table's columns, copy, notify,
    # commit): an add that arrives alone reaches the store sooner.
    FEW_ROWS = 64
    MIN_PART_ROWS = 1000  # smaller batches go in one part

    def __init__(
        self, pool: asyncpg.Pool, *, acquire_timeout: float, dsn: str | None = None
    ) -> None:
        self._pool = pool
        self._acquire_timeout = acquire_timeout
        self._dsn = dsn  # for the dedicated LISTEN connection
        self._closed = asyncio.Event()
        self._last_handler_ns = 0
        self._epoch: str | None = None  # the server's incarnation last seen (JobsPart)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 10,
        idle_close: float = 300.0,
        migrate: bool = True,
        connect_timeout: float = 5.0,
        command_timeout: float = 30.0,
    ) -> Self:
        """Open a pool on ``dsn`` and, unless ``migrate`` is False, apply migrations.

        Connections beyond ``min_size`` open when needed; one unused for
        ``idle_close`` seconds closes (0: never)."""
        check_tls_files(dsn)
        with translate():
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                max_inactive_connection_lifetime=idle_close,
                timeout=connect_timeout,
                command_timeout=command_timeout,
                init=_init_connection,
                reset=_no_reset,
                # Every statement is planned for its own parameters. A generic plan is
                # chosen once per connection from the statistics of that moment: made
                # while the jobs table was nearly empty, it turned the claim into a
                # scan of the whole queue (160 ms instead of 2 ms a claim; end to end
                # 1,200-2,500 instead of ~10,000 jobs/s in about one bench run of
                # three). Planning each time costs ~0.3 ms and gave 6 fast runs of 6.
                server_settings={
                    "application_name": "queue_daemon",
                    "plan_cache_mode": "force_custom_plan",
                    # Every statement here is short: a server built with JIT (Debian's,
                    # most managed ones) compiled the dashboard's depth query for
                    # 34 ms of its 56 ms, for an estimate of rows it never reads.
                    "jit": "off",
                },
            )
        store = cls(pool, acquire_timeout=connect_timeout + command_timeout, dsn=dsn)
        if migrate:
            try:
                async with store._conn() as conn:
                    await apply_migrations(conn)
            except BaseException:
                await store.close()
                raise
        return store

    async def close(self) -> None:
        self._closed.set()  # ends every listen()
        try:
            await asyncio.wait_for(self._pool.close(), _CLOSE_TIMEOUT)
        except (TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            self._pool.terminate()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Connection]:
        """A pooled connection, with every error translated at this edge."""
        with translate():
            async with self._pool.acquire(timeout=self._acquire_timeout) as conn:
                try:
                    yield conn
                except BaseException as exc:
                    if is_unavailable(exc):
                        # so the pool replaces it rather than hand it out again
                        with suppress(asyncpg.InterfaceError):  # already detached
                            conn.terminate()
                    raise

    async def resolve(self, ids: Sequence[str], conn: Connection | None = None) -> Resolution:
        """Resolve the dependents of done jobs ``ids`` (``queue_daemon.store.pg_graph``)."""
        raise NotImplementedError

    async def _fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        async with self._conn() as conn:
            return await conn.fetch(query, *args)

    async def _fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        async with self._conn() as conn:
            return await conn.fetchrow(query, *args)

    async def ping(self) -> None:
        async with self._conn() as conn:
            await conn.fetchval(queries.migrations.PING)

    async def applied_migrations(self) -> list[int]:
        async with self._conn() as conn:
            return await _applied_versions(conn)
