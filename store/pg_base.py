"""What every part of ``PgStore`` shares: ``Db`` (the pool, its life, and the
calls on a pooled connection) and the row helpers.

Each part (``pg_jobs``, ``pg_queue``, ``pg_pulled``, ``pg_graph``,
``pg_tenants``, ``pg_handlers``, ``pg_schedules``) takes the one ``Db`` in
its constructor, and the parts whose statements end jobs take the graph part
too, to resolve those jobs' dependents.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import asyncpg
import orjson

from queue_daemon.domain.jobs import Job, JobState
from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.store import queries
from queue_daemon.store.dsn import check_tls_files, connect
from queue_daemon.store.migrate import applied_migrations as _applied_versions
from queue_daemon.store.migrate import migrate as apply_migrations
from queue_daemon.store.translate import is_unavailable, translate

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = asyncpg.Connection | PoolConnectionProxy[asyncpg.Record]

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


class KeyTurns:
    """Where each capped type's next claim starts (queries.queue.KEY_CURSOR): the
    last key the claim before visited, so that the keys are served in turn."""

    def __init__(self) -> None:
        self._after: dict[str, str] = {}

    def get(self, type: str) -> str | None:
        return self._after.get(type) if self._after else None

    def turn(self, type: str, after: str | None) -> None:
        if after is not None:
            self._after[type] = after
        elif self._after:
            self._after.pop(type, None)  # no key visited: the next starts at the first


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
        priority=row["priority"],
        key=row["ckey"],
        progress=None if row["progress"] is None else orjson.loads(row["progress"]),
        runs=_runs(row),
        log=_log(row),
    )


def _log(row: asyncpg.Record) -> str | None:
    """The last run's log excerpt when the query read it (``GET_JOB``)."""
    try:
        log: str | None = row["log"]
    except KeyError:
        return None
    return log


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


async def open_pool(
    dsn: str,
    *,
    min_size: int,
    max_size: int,
    idle_close: float,
    connect_timeout: float,
    command_timeout: float,
) -> asyncpg.Pool:
    """A pool on ``dsn`` with the settings every store connection has."""
    check_tls_files(dsn)
    with translate():
        return await asyncpg.create_pool(
            dsn,
            connect=cast(Any, connect),  # asyncpg.connect's keywords, passed through
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


class Db:
    """The pool and its life: every call takes a connection from the pool and
    returns it, with asyncpg errors translated into ``queue_daemon.store.errors``
    at this edge (``StoreUnavailable`` when the server cannot be reached)."""

    def __init__(
        self, pool: asyncpg.Pool, *, acquire_timeout: float, dsn: str | None = None
    ) -> None:
        self.pool = pool
        self.acquire_timeout = acquire_timeout
        self.dsn = dsn  # for the dedicated LISTEN connection
        self.closed = asyncio.Event()  # set by close(): ends every listen()
        self._kept: PoolConnectionProxy[asyncpg.Record] | None = None  # kept_conn's, from the pool
        self._kept_busy = False

    async def close(self) -> None:
        self.closed.set()
        if not self._kept_busy:  # (a busy one is given back by kept_conn)
            await self._give_back_kept()
        try:
            await asyncio.wait_for(self.pool.close(), _CLOSE_TIMEOUT)
        except (TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            self.pool.terminate()

    @asynccontextmanager
    async def conn(self) -> AsyncIterator[Connection]:
        """A pooled connection, with every error translated at this edge."""
        with translate():
            if self._kept is not None and not self._kept_busy and self.pool.get_idle_size() == 0:
                await self._give_back_kept()  # the others are busy: it may be wanted
            async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
                try:
                    yield conn
                except BaseException as exc:
                    if is_unavailable(exc):
                        # so the pool replaces it rather than hand it out again
                        with suppress(asyncpg.InterfaceError):  # already detached
                            conn.terminate()
                    raise

    @asynccontextmanager
    async def kept_conn(self) -> AsyncIterator[Connection]:
        """A connection for one statement on an idle daemon's add → start path: a
        pooled connection kept aside while nothing else uses it (an acquire and a
        release of the pool cost about 0.25 ms of that path), else a pooled one as
        ``conn``. One that fails in any way goes back to the pool, closed when it
        was lost, and the next call takes another."""
        if self._kept_busy or self.closed.is_set():
            async with self.conn() as conn:
                yield conn
            return
        self._kept_busy = True
        try:
            with translate():
                if self._kept is None:
                    self._kept = await self.pool.acquire(timeout=self.acquire_timeout)
                conn = self._kept
                try:
                    yield conn
                except BaseException as exc:
                    if is_unavailable(exc):
                        with suppress(asyncpg.InterfaceError):  # already detached
                            conn.terminate()
                    await asyncio.shield(self._give_back_kept())
                    raise
                if self.closed.is_set():  # closed meanwhile: it goes back now
                    await self._give_back_kept()
        finally:
            self._kept_busy = False

    async def _give_back_kept(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            with suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await self.pool.release(kept)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        async with self.conn() as conn:
            return await conn.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        async with self.conn() as conn:
            return await conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        async with self.conn() as conn:
            return await conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        """The statement's status ("UPDATE 3", ...)."""
        async with self.conn() as conn:
            return await conn.execute(query, *args)

    async def ping(self) -> None:
        await self.fetchval(queries.migrations.PING)

    async def migrate(self) -> None:
        async with self.conn() as conn:
            await apply_migrations(conn)

    async def applied_migrations(self) -> list[int]:
        async with self.conn() as conn:
            return await _applied_versions(conn)


def status_count(status: str) -> int:
    """The row count of a statement's status ("UPDATE 3", "INSERT 0 3")."""
    return int(status.rsplit(" ", 1)[1])
