"""``PgStore``: the ``store.ports.Store`` on PostgreSQL through an asyncpg pool."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import asyncpg
import orjson

from store import queries
from store.cursor import decode_cursor, encode_cursor
from store.errors import Conflict, LimitReached, NotFound, StoreError, SysidTaken
from store.listen import Delays, listen_forever
from store.migrate import applied_migrations as _applied_versions
from store.migrate import migrate as apply_migrations
from store.models import (
    ClaimedJob,
    DaemonLease,
    ExpiredLock,
    FailedJob,
    HandlerRecord,
    Job,
    JobPage,
    JobState,
    NewJob,
    QueueDepth,
    Release,
    ReleaseHow,
    RunningJob,
    RunningJobs,
    Tenant,
    TypeStats,
)
from store.notes import added_payload
from store.translate import is_unavailable, translate

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = asyncpg.Connection | PoolConnectionProxy[asyncpg.Record]

logger = logging.getLogger(__name__)

MAX_PAGE = 1000
PURGE_CHUNK = 10_000  # rows deleted per statement, so no purge holds locks for long
_NEW_SYSID_TRIES = 1000
_CLOSE_TIMEOUT = 10.0


def _state(lock: str) -> JobState:
    if lock == "":
        return JobState.WAITING
    if lock == "__done":
        return JobState.DONE
    return JobState.RUNNING


def _job(row: asyncpg.Record) -> Job:
    return Job(
        id=row["id"],
        type=row["type"],
        state=_state(row["lock"]),
        dt=row["dt"],
        create_dt=row["create_dt"],
        done_dt=row["done_dt"],
        attempts=row["attempts"],
        code=row["code"],
        exitcode=row["exitcode"],
        result=row["result"],
        data=row["data"],
    )


def _handler(row: asyncpg.Record) -> HandlerRecord:
    data = orjson.loads(row["data"])
    return HandlerRecord(id=row["id"], type=row["type"], dt=row["dt"], data=data)


async def _init_connection(conn: Connection) -> None:
    await conn.execute(queries.CREATE_JOBS_IN)


async def _no_reset(conn: Connection) -> None:
    """A connection goes back to the pool as it is (asyncpg has already rolled back
    a transaction left open): no reset query (advisory unlock, CLOSE ALL, UNLISTEN,
    RESET ALL), which cost every store call one more round trip, made before its
    result reached the caller. Nothing here keeps session state on a pooled
    connection: settings are set for the transaction only (``set_config(..., true)``),
    advisory locks are transaction locks (the migration lock is released in a
    ``finally``), no cursor outlives its transaction, and LISTEN runs on a
    connection of its own."""


class PgStore:
    """The job store on PostgreSQL.

    Every call takes a connection from the pool and returns it; asyncpg errors
    leave as ``store.errors`` (``StoreUnavailable`` when the server cannot be
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
    ) -> PgStore:
        """Open a pool on ``dsn`` and, unless ``migrate`` is False, apply migrations.

        Connections beyond ``min_size`` open when needed; one unused for
        ``idle_close`` seconds closes (0: never)."""
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

    async def _fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        async with self._conn() as conn:
            return await conn.fetch(query, *args)

    async def _fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        async with self._conn() as conn:
            return await conn.fetchrow(query, *args)

    async def ping(self) -> None:
        async with self._conn() as conn:
            await conn.fetchval(queries.PING)

    async def applied_migrations(self) -> list[int]:
        async with self._conn() as conn:
            return await _applied_versions(conn)

    # --- jobs -------------------------------------------------------------

    async def add_jobs(self, jobs: Sequence[NewJob], *, durable: bool = True) -> int:
        """Insert ``jobs``; rows whose id exists are skipped. Return how many were new.

        The rows are seen (and notified) as soon as they are in; with ``durable``
        the call also waits for them to be flushed, else ``flush`` does that.

        A large batch is split over ``COPY_PARTS`` connections copying at once
        (about 1.4x the rows/s of one on two cores), and the jobs of types with
        only a few rows in it go in beside it on their own connection, so a
        tenant's job added just after another's big batch is not held up by
        that batch's COPY. Each part commits on its own: if one fails, the
        caller retries the whole batch and the parts already in are skipped by id.
        """
        if not jobs:
            return 0
        records = list(jobs)  # NewJob is a tuple in COPY column order
        if len(records) <= self.FEW_ROWS:
            added = await self._add_few(records)
        else:
            per_type = Counter(job.type for job in records)
            few = [job for job in records if per_type[job.type] <= self.FEW_ROWS]
            if 0 < len(few) <= self.FEW_ROWS:
                many = [job for job in records if per_type[job.type] > self.FEW_ROWS]
                added = await self._gather_added(self._add_few(few), self._add_many(many))
            else:
                added = await self._add_many(records)
        if durable:
            await self.flush()
        return added

    async def flush(self) -> None:
        """Return once every row added before the call is durable (WAL flushed)."""
        await self._fetch(queries.FLUSHED)

    async def _add_many(self, records: list[NewJob]) -> int:
        parts = max(1, min(self.COPY_PARTS, len(records) // self.MIN_PART_ROWS))
        if parts == 1:
            return await self._add_records(records)
        size = -(-len(records) // parts)
        return await self._gather_added(
            *(self._add_records(records[i : i + size]) for i in range(0, len(records), size))
        )

    @staticmethod
    async def _gather_added(*parts: Awaitable[int]) -> int:
        """The sum of the parts' new rows, once every part has ended; the first
        error of any part is raised (the caller retries the whole batch)."""
        results = await asyncio.gather(*parts, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(cast(list[int], results))

    async def _add_few(self, records: Sequence[NewJob]) -> int:
        columns = list(zip(*records, strict=True))
        async with self._conn() as conn:
            row = await conn.fetchrow(queries.INSERT_FEW, *columns, added_payload(records))
        return int(row["n"]) if row is not None else 0

    async def _add_records(self, records: Sequence[NewJob]) -> int:
        async with self._conn() as conn:
            # Fast path: COPY straight into jobs. A duplicate id (a batch that is
            # ingested again after a crash) aborts it; then go through the temp
            # table with ON CONFLICT DO NOTHING, which also counts the new rows.
            try:
                async with conn.transaction():
                    await conn.execute(queries.ASYNC_COMMIT)
                    await conn.copy_records_to_table(
                        queries.JOBS_TABLE, records=records, columns=queries.JOB_COPY_COLUMNS
                    )
                    # sent at commit, so a woken daemon finds the rows
                    await conn.execute(queries.NOTIFY_JOBS, added_payload(records))
                return len(records)
            except asyncpg.UniqueViolationError:
                pass
            async with conn.transaction():
                await conn.execute(queries.ASYNC_COMMIT)
                await conn.copy_records_to_table(
                    queries.JOBS_IN_TABLE, records=records, columns=queries.JOB_COPY_COLUMNS
                )
                status = await conn.execute(queries.INSERT_FROM_JOBS_IN)
                added = int(status.rsplit(" ", 1)[1])  # "INSERT 0 <n>"
                if added:  # which of them were new is not known here: "re-read"
                    await conn.execute(queries.NOTIFY_JOBS, "")
        return added

    async def get_job(self, client: str, job_id: str) -> Job:
        row = await self._fetchrow(queries.GET_JOB, job_id, client)
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return _job(row)

    async def list_jobs(
        self,
        client: str,
        *,
        type: str | None = None,
        state: JobState | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage:
        limit = max(1, min(MAX_PAGE, limit))
        state_arg = None if state is None else JobState(state).value
        # one row more than asked tells whether a next page exists
        if after is None:
            rows = await self._fetch(queries.LIST_JOBS_FIRST, client, type, state_arg, limit + 1)
        else:
            create_dt, last_id = decode_cursor(after)
            rows = await self._fetch(
                queries.LIST_JOBS_AFTER, client, type, state_arg, limit + 1, create_dt, last_id
            )
        jobs = [_job(row) for row in rows[:limit]]
        more = len(rows) > limit
        cursor = encode_cursor(jobs[-1].create_dt, jobs[-1].id) if more else None
        return JobPage(jobs=jobs, next=cursor)

    async def stats(self, client: str) -> dict[str, TypeStats]:
        """Done counts from type_counts (kept by triggers on jobs, migration
        0003), the others from the waiting and running partial indexes: the
        cost does not grow with the number of archived jobs."""
        rows = await self._fetch(queries.STATS, client)
        return {
            row["type"]: TypeStats(
                waiting=row["waiting"],
                scheduled=row["scheduled"],
                running=row["running"],
                done_ok=row["done_ok"],
                done_failed=row["done_failed"],
                done_error=row["done_error"],
            )
            for row in rows
        }

    async def cancel_job(self, client: str, job_id: str) -> Job:
        async with self._conn() as conn:
            for _ in range(3):
                row = await conn.fetchrow(queries.CANCEL_JOB, job_id, client)
                if row is not None:
                    return _job(row)
                row = await conn.fetchrow(queries.GET_JOB, job_id, client)
                if row is None:
                    raise NotFound(f"no job {job_id!r}")
                lock = row["lock"]
                if lock != "":
                    break
                # waiting now: ingested (or put back) between the two statements
            raise Conflict(f"job {job_id!r} is {_state(lock).value}")

    # --- the dashboard ------------------------------------------------------

    async def queue_depths(self, client: str | None, limit: int, cap: int) -> list[QueueDepth]:
        if client is None:
            rows = await self._fetch(queries.QUEUE_DEPTHS_ALL, limit, cap)
        else:
            rows = await self._fetch(queries.QUEUE_DEPTHS_CLIENT, client, limit, cap)
        return [QueueDepth(**dict(row.items())) for row in rows]

    async def running_jobs(self, client: str | None, limit: int) -> RunningJobs:
        if client is None:
            rows = await self._fetch(queries.RUNNING_JOBS_ALL, limit)
        else:
            rows = await self._fetch(queries.RUNNING_JOBS_CLIENT, client, limit)
        return RunningJobs(
            total=rows[0]["total"] if rows else 0,
            oldest=[RunningJob(**{k: v for k, v in row.items() if k != "total"}) for row in rows],
        )

    async def recent_failures(
        self, client: str | None, limit: int, result_chars: int
    ) -> list[FailedJob]:
        if client is None:
            rows = await self._fetch(queries.RECENT_FAILURES_ALL, limit, result_chars)
        else:
            rows = await self._fetch(queries.RECENT_FAILURES_CLIENT, client, limit, result_chars)
        return [FailedJob(**dict(row.items())) for row in rows]

    async def daemon_leases(self, limit: int) -> list[DaemonLease]:
        rows = await self._fetch(queries.DAEMON_LEASES, limit)
        return [DaemonLease(**dict(row.items())) for row in rows]

    async def archived_counts(self) -> dict[str, int]:
        rows = await self._fetch(queries.ARCHIVED_COUNTS)
        return {row["type"]: row["archived"] for row in rows}

    # --- tenants ----------------------------------------------------------

    async def add_tenant(self, client: str, token_hash: bytes) -> None:
        try:
            async with self._conn() as conn, conn.transaction():
                if await conn.fetchrow(queries.ADD_TENANT, client) is None:
                    raise Conflict(f"tenant {client!r} exists")
                await conn.execute(queries.DELETE_TENANT_TOKENS, client)
                await conn.execute(queries.INSERT_TENANT_TOKEN, client, token_hash)
        except StoreError as exc:
            if isinstance(exc.__cause__, asyncpg.UniqueViolationError):
                raise Conflict("token hash already in use") from exc
            raise

    async def rotate_tenant(self, client: str, new_hash: bytes, grace: float) -> None:
        """Give ``client`` the token ``new_hash``; its current token stays live
        for ``grace`` seconds more, and any older one ends now (at most two live
        tokens). NotFound if no such active tenant."""
        try:
            async with self._conn() as conn, conn.transaction():
                row = await conn.fetchrow(queries.LOCK_TENANT, client)
                if row is None or row["revoked_at"] is not None:
                    raise NotFound(f"no active tenant {client!r}")
                await conn.execute(queries.ROTATE_DROP_OLD, client)
                await conn.execute(queries.ROTATE_EXPIRE_CURRENT, client, float(grace))
                await conn.execute(queries.INSERT_TENANT_TOKEN, client, new_hash)
        except StoreError as exc:
            if isinstance(exc.__cause__, asyncpg.UniqueViolationError):
                raise Conflict("token hash already in use") from exc
            raise

    async def list_tenants(self) -> list[Tenant]:
        rows = await self._fetch(queries.LIST_TENANTS)
        return [
            Tenant(
                client=row["client"],
                token_hash=bytes(row["token_hash"]),
                created_at=row["created_at"],
                revoked_at=row["revoked_at"],
                live_tokens=row["live_tokens"],
                grace_until=row["grace_until"],
                limits=orjson.loads(row["limits"]),
            )
            for row in rows
        ]

    async def revoke_tenant(self, client: str) -> None:
        if await self._fetchrow(queries.REVOKE_TENANT, client) is None:
            raise NotFound(f"no active tenant {client!r}")

    async def tenant_tokens(self) -> dict[bytes, str]:
        """token_hash -> client for every live token (database clock)."""
        rows = await self._fetch(queries.TENANT_TOKENS)
        return {bytes(row["token_hash"]): row["client"] for row in rows}

    async def tenant_limits(self) -> dict[str, dict[str, float]]:
        """client -> its limit overrides, for active tenants that have any."""
        rows = await self._fetch(queries.TENANT_LIMITS)
        return {row["client"]: orjson.loads(row["limits"]) for row in rows}

    async def get_tenant_limits(self, client: str) -> dict[str, float]:
        """NotFound if no such active tenant."""
        row = await self._fetchrow(queries.GET_TENANT_LIMITS, client)
        if row is None:
            raise NotFound(f"no active tenant {client!r}")
        limits: dict[str, float] = orjson.loads(row["limits"])
        return limits

    async def set_tenant_limits(self, client: str, limits: dict[str, float]) -> dict[str, float]:
        """Replace ``client``'s overrides; NotFound if no such active tenant."""
        row = await self._fetchrow(queries.SET_TENANT_LIMITS, client, orjson.dumps(limits).decode())
        if row is None:
            raise NotFound(f"no active tenant {client!r}")
        stored: dict[str, float] = orjson.loads(row["limits"])
        return stored

    async def count_waiting(self, client: str, cap: int) -> int:
        """``client``'s waiting and scheduled jobs, counting at most ``cap``."""
        async with self._conn() as conn:
            count: int = await conn.fetchval(
                queries.COUNT_WAITING_CAPPED, f"{client}-", f"{client}.", cap
            )
        return count

    async def new_admin_token(self, token_hash: bytes, grace: float) -> None:
        """Make ``token_hash`` the current operator token; the previous one stays
        live for ``grace`` seconds, older ones end now."""
        async with self._conn() as conn, conn.transaction():
            await conn.execute(queries.LOCK_ADMIN_TOKENS)
            await conn.execute(queries.ADMIN_DROP_OLD)
            await conn.execute(queries.ADMIN_EXPIRE_CURRENT, float(grace))
            await conn.execute(queries.INSERT_ADMIN_TOKEN, token_hash)

    async def revoke_admin_tokens(self) -> int:
        """End every operator token; how many there were."""
        async with self._conn() as conn:
            status: str = await conn.execute(queries.REVOKE_ADMIN_TOKENS)
        return int(status.split()[-1])

    async def admin_tokens(self) -> set[bytes]:
        """Digests of the live operator tokens (database clock)."""
        rows = await self._fetch(queries.ADMIN_TOKENS)
        return {bytes(row["token_hash"]) for row in rows}

    async def token_key(self) -> bytes:
        """The per-store HMAC key for token hashes (created by migration 0004)."""
        async with self._conn() as conn:
            value = await conn.fetchval(queries.TOKEN_KEY)
        if value is None:
            raise StoreError("the store has no token key; is migration 0004 applied?")
        return bytes(value)

    # --- sysids -----------------------------------------------------------

    async def reserve_sysid(
        self,
        sysid: str | None,
        *,
        holder: str,
        host: str,
        data_dir: str,
        lease: float,
        takeover: bool = False,
    ) -> str:
        async with self._conn() as conn:
            if sysid is None:
                for _ in range(_NEW_SYSID_TRIES):
                    new: str | None = await conn.fetchval(
                        queries.RESERVE_NEW_SYSID, holder, host, data_dir, float(lease)
                    )
                    if new is not None:
                        return new
                raise SysidTaken("no free sysid after many tries")
            got = await conn.fetchval(
                queries.RESERVE_SYSID, sysid, holder, host, data_dir, float(lease), takeover
            )
        if got is None:
            raise SysidTaken(f"sysid {sysid!r} is leased by another daemon")
        return sysid

    async def renew_sysid(self, sysid: str, *, holder: str, lease: float) -> None:
        if await self._fetchrow(queries.RENEW_SYSID, sysid, holder, float(lease)) is None:
            raise SysidTaken(f"sysid {sysid!r} is no longer ours")

    async def release_sysid(self, sysid: str, *, holder: str) -> None:
        async with self._conn() as conn:
            await conn.execute(queries.RELEASE_SYSID, sysid, holder)

    # --- running jobs: the claim path ---------------------------------------

    async def waiting_jobtypes(self, limit_per_type: int = 1000) -> dict[str, int]:
        rows = await self._fetch(queries.WAITING_JOBTYPES, max(1, limit_per_type))
        return {row["type"]: row["n"] for row in rows}

    async def claim(self, type: str, limit: int, *, sysid: str, lease: float) -> list[ClaimedJob]:
        if limit < 1:
            return []
        rows = await self._fetch(queries.CLAIM, type, limit, sysid, float(lease))
        jobs = [
            ClaimedJob(
                id=row["id"],
                type=row["type"],
                data=row["data"],
                attempts=row["attempts"],
                create_dt=row["create_dt"],
                due_ms=row["due_ms"],
                handler=row["handler"],
            )
            for row in rows
        ]
        # RETURNING follows the primary key, not the claim's dt order; ids of
        # one daemon are time-ordered, so this is the order they were added in
        jobs.sort(key=lambda job: (job.create_dt, job.id))
        return jobs

    async def expire_waiting(self, type: str, older_than: float, result: str) -> list[str]:
        """Archive (error, 503, ``result``) waiting jobs of ``type`` created more than
        ``older_than`` seconds ago; return their ids."""
        expired: list[str] = []
        while True:
            rows = await self._fetch(
                queries.EXPIRE_WAITING, type, float(older_than), result, PURGE_CHUNK
            )
            expired += [row["id"] for row in rows]
            if len(rows) < PURGE_CHUNK:
                return expired

    async def renew(self, ids: Sequence[str], *, sysid: str, lease: float) -> int:
        if not ids:
            return 0
        # sorted: concurrent updates of the same rows lock them in one order
        async with self._conn() as conn:
            status = await conn.execute(queries.RENEW, sorted(ids), sysid, float(lease))
        return int(status.rsplit(" ", 1)[1])  # "UPDATE <n>"

    async def release(self, releases: Sequence[Release], *, sysid: str) -> int:
        if not releases:
            return 0
        ordered = sorted(releases, key=lambda r: r.id)
        async with self._conn() as conn:
            status = await conn.execute(
                queries.RELEASE,
                [r.id for r in ordered],
                [ReleaseHow(r.how).value for r in ordered],
                [r.code for r in ordered],
                [r.exitcode for r in ordered],
                [r.result for r in ordered],
                [float(r.delay) for r in ordered],
                [r.refund_attempt for r in ordered],
                sysid,
            )
        return int(status.rsplit(" ", 1)[1])

    async def expire_locks(self) -> list[ExpiredLock]:
        rows = await self._fetch(queries.EXPIRE_LOCKS)
        return [ExpiredLock(row["id"], row["type"], row["attempts"]) for row in rows]

    async def purge(self, older_than: float) -> dict[str, int]:
        """Delete archived jobs done more than ``older_than`` seconds ago, at
        most ``PURGE_CHUNK`` rows a statement (each its own short transaction)."""
        purged: dict[str, int] = {}
        while True:
            rows = await self._fetch(queries.PURGE_CHUNK, float(older_than), PURGE_CHUNK)
            for row in rows:
                purged[row["type"]] = purged.get(row["type"], 0) + row["n"]
            if sum(row["n"] for row in rows) < PURGE_CHUNK:
                return purged

    async def notify_jobs(self) -> None:
        async with self._conn() as conn:
            await conn.execute(queries.NOTIFY_JOBS, "")

    async def listen(
        self,
        on_jobs: Callable[[dict[str, int] | None], None],
        on_handler: Callable[[str], None],
        *,
        retry: Delays,
    ) -> None:
        """Call ``on_jobs`` when jobs are added (and after each (re)connect) and
        ``on_handler(type)`` when a handler changes, until ``close`` or cancellation.
        ``on_jobs`` gets the due jobs added per jobtype, or None: anything may
        have changed.

        Connection failures are logged and retried after ``retry``'s delays, never raised.
        """
        if self._dsn is None:
            raise StoreError("this store was built without a DSN; it cannot listen")
        await listen_forever(
            self._dsn,
            self._closed,
            on_jobs,
            on_handler,
            connect_timeout=min(self._acquire_timeout, 10.0),
            retry=retry,
        )

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
        tenant already has that many."""
        body = orjson.dumps(data).decode()
        if max_handlers is None:
            row = await self._fetchrow(queries.PUT_HANDLER, self._handler_id(), type, body)
        else:
            client = type.partition("-")[0]
            async with self._conn() as conn, conn.transaction():
                await conn.execute(queries.LOCK_CLIENT_HANDLERS, client)
                if not await conn.fetchval(queries.HANDLER_LIVE, type):
                    live = await conn.fetchval(queries.COUNT_HANDLERS, client)
                    if live >= max_handlers:
                        raise LimitReached(f"{client} has {live} handlers, its limit")
                row = await conn.fetchrow(queries.PUT_HANDLER, self._handler_id(), type, body)
        assert row is not None  # INSERT ... RETURNING
        return _handler(row)

    async def get_handler(self, type: str) -> HandlerRecord:
        row = await self._fetchrow(queries.GET_HANDLER, type)
        if row is None:
            raise NotFound(f"no handler for {type!r}")
        return _handler(row)

    async def delete_handler(self, type: str) -> None:
        if not await self._fetch(queries.DELETE_HANDLER, type):
            raise NotFound(f"no handler for {type!r}")

    async def count_handlers(self, client: str) -> int:
        async with self._conn() as conn:
            count: int = await conn.fetchval(queries.COUNT_HANDLERS, client)
        return count
