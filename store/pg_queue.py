"""The claim path (``JobQueue``) and the daemons' sysid leases (``SysidLeases``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import asyncpg

from queue_daemon.domain.jobs import ClaimedJob, ExpiredLock, Progress, Release, UnhandledRound
from queue_daemon.store import queries
from queue_daemon.store.errors import StoreError, SysidTaken
from queue_daemon.store.listen import Delays, listen_forever
from queue_daemon.store.pg_base import Db, KeyTurns, status_count
from queue_daemon.store.pg_graph import GraphPart
from queue_daemon.store.pg_release import write_releases

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

PURGE_CHUNK = 10_000  # rows deleted per statement, so no purge holds locks for long
NEW_SYSID_TRIES = 1000


class QueuePart:
    """The claim path (``JobQueue``) and the daemons' sysid leases (``SysidLeases``)."""

    def __init__(self, db: Db, graph: GraphPart) -> None:
        self._db = db
        self._graph = graph  # resolves the dependents of the jobs it ends
        self._keys = KeyTurns()  # where each capped type's next claim starts

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
        async with self._db.conn() as conn:
            if sysid is None:
                for _ in range(NEW_SYSID_TRIES):
                    new: str | None = await conn.fetchval(
                        queries.sysids.RESERVE_NEW_SYSID, holder, host, data_dir, float(lease)
                    )
                    if new is not None:
                        return new
                raise SysidTaken("no free sysid after many tries")
            got = await conn.fetchval(
                queries.sysids.RESERVE_SYSID, sysid, holder, host, data_dir, float(lease), takeover
            )
        if got is None:
            raise SysidTaken(f"sysid {sysid!r} is leased by another daemon")
        return sysid

    async def renew_sysid(self, sysid: str, *, holder: str, lease: float) -> None:
        if await self._db.fetchrow(queries.sysids.RENEW_SYSID, sysid, holder, float(lease)) is None:
            raise SysidTaken(f"sysid {sysid!r} is no longer ours")

    async def release_sysid(self, sysid: str, *, holder: str) -> None:
        async with self._db.conn() as conn:
            await conn.execute(queries.sysids.RELEASE_SYSID, sysid, holder)

    # --- running jobs: the claim path ---------------------------------------

    async def waiting_jobtypes(self, limit_per_type: int = 1000) -> dict[str, int]:
        rows = await self._db.fetch(queries.queue.WAITING_JOBTYPES, max(1, limit_per_type))
        return {row["type"]: row["n"] for row in rows}

    async def claim(self, type: str, limit: int, *, sysid: str, lease: float) -> list[ClaimedJob]:
        if limit < 1:
            return []
        rows = await self._db.fetch(
            queries.queue.CLAIM, type, limit, sysid, float(lease), self._keys.get(type)
        )
        # the handler's row (id NULL), then by position (the columns of
        # queries.queue.CLAIM, in order): a Record's lookup by name costs a job
        # about as much as the object it fills
        if rows[-1][0] is None:  # where an append of the two parts puts it
            last = rows.pop()
        else:
            last = next(row for row in rows if row[0] is None)
            rows = [row for row in rows if row[0] is not None]
        handler = last[1]
        self._keys.turn(type, last[6])
        jobs = [
            ClaimedJob(
                id=id_,
                type=type,
                data=data,
                attempts=attempts,
                created_ms=created_ms,
                deadline=deadline,
                due_ms=due_ms,
                handler=handler,
                key=key,
                trace=trace,
            )
            for id_, data, attempts, created_ms, deadline, due_ms, key, trace in rows
        ]
        return jobs  # in the order taken (queries.queue.CLAIM)

    async def unhandled_types(
        self, older_than: float, *, after: str = "", steps: int = 5_000
    ) -> UnhandledRound | None:
        async with self._db.conn() as conn, conn.transaction():
            if not await conn.fetchval(queries.queue.UNHANDLED_LOCK):
                return None
            rows = await conn.fetch(
                queries.queue.UNHANDLED_TYPES, float(older_than), after, max(1, steps)
            )
        return UnhandledRound(
            expired=[(row["type"], row["pulled"]) for row in rows if row["expired"]],
            next_after=rows[-1]["type"] if len(rows) >= steps else None,
        )

    async def expire_waiting(self, type: str, older_than: float, result: str) -> list[str]:
        """Archive (error, 503, ``result``) waiting jobs of ``type`` created and due
        more than ``older_than`` seconds ago; return their ids."""
        expired: list[str] = []
        while True:
            rows = await self._db.fetch(
                queries.queue.EXPIRE_WAITING, type, float(older_than), result, PURGE_CHUNK
            )
            expired += [row["id"] for row in rows]
            await self._graph.resolve([row["id"] for row in rows if row["dependents"]])
            if len(rows) < PURGE_CHUNK:
                return expired

    async def note_progress(self, notes: Sequence[Progress]) -> set[str]:
        if not notes:
            return set()
        ordered = sorted(notes)  # concurrent updates of the same rows lock them in one order
        columns = [list(c) for c in zip(*ordered, strict=True)]
        rows = await self._db.fetch(queries.jobs.NOTE_PROGRESS, *columns)
        return {row["id"] for row in rows}

    async def renew(self, ids: Sequence[str], *, sysid: str, lease: float) -> int:
        if not ids:
            return 0
        # sorted: concurrent updates of the same rows lock them in one order
        async with self._db.conn() as conn:
            status = await conn.execute(queries.queue.RENEW, sorted(ids), sysid, float(lease))
        return status_count(status)  # "UPDATE <n>"

    async def release(self, releases: Sequence[Release], *, sysid: str) -> set[str]:
        if not releases:
            return set()
        async with self._db.conn() as conn:
            try:
                rows = await write_releases(conn, releases, sysid, keep_first=False)
            except asyncpg.UniqueViolationError:  # an id done already (queries.release)
                rows = await write_releases(conn, releases, sysid, keep_first=True)
        # a NULL id: the note's row
        await self._graph.resolve([row[0] for row in rows if row[0] is not None and row[1]])
        return {row[0] for row in rows if row[0] is not None}

    async def expire_locks(self) -> list[ExpiredLock]:
        rows = await self._db.fetch(queries.queue.EXPIRE_LOCKS)
        await self._graph.resolve([row["id"] for row in rows if row["last"] and row["dependents"]])
        return [ExpiredLock(row["id"], row["type"], row["attempts"], row["last"]) for row in rows]

    async def purge(self, older_than: float) -> dict[str, int]:
        """Delete archived jobs done more than ``older_than`` seconds ago, at
        most ``PURGE_CHUNK`` rows a statement (each its own short transaction)."""
        purged: dict[str, int] = {}
        while True:
            rows = await self._db.fetch(queries.queue.PURGE_CHUNK, float(older_than), PURGE_CHUNK)
            for row in rows:
                purged[row["type"]] = purged.get(row["type"], 0) + row["n"]
            if sum(row["n"] for row in rows) < PURGE_CHUNK:
                return purged

    async def fold_counts(self) -> bool:
        async with self._db.conn() as conn, conn.transaction():
            if not await conn.fetchval(queries.counts.FOLD_LOCK):
                return False
            await conn.execute(queries.counts.FOLD_STATES)
            await conn.execute(queries.counts.DROP_EMPTY_STATES)
        return True

    async def notify_jobs(self) -> None:
        async with self._db.conn() as conn:
            await conn.execute(queries.queue.NOTIFY_JOBS, "")

    async def listen(
        self,
        on_jobs: Callable[[dict[str, int] | None], None],
        on_handler: Callable[[str], None],
        *,
        retry: Delays,
        on_done: Callable[[set[str] | None], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> None:
        """Call ``on_jobs`` when jobs are added (and after each (re)connect) and
        ``on_handler(type)`` when a handler changes, until ``close`` or cancellation.
        ``on_jobs`` gets the due jobs added per jobtype, or None: anything may
        have changed.

        Connection failures are logged and retried after ``retry``'s delays, never raised.
        """
        if self._db.dsn is None:
            raise StoreError("this store was built without a DSN; it cannot listen")
        await listen_forever(
            self._db.dsn,
            self._db.closed,
            on_jobs,
            on_handler,
            connect_timeout=min(self._db.acquire_timeout, 10.0),
            retry=retry,
            on_done=on_done,
            on_cancel=on_cancel,
        )
