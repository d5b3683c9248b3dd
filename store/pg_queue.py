"""The claim path (``JobQueue``) and the daemons' sysid leases (``SysidLeases``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

import asyncpg

from queue_daemon.domain.jobs import ClaimedJob, ExpiredLock, Release, ReleaseHow, UnhandledRound
from queue_daemon.store import queries
from queue_daemon.store.errors import StoreError, SysidTaken
from queue_daemon.store.listen import Delays, listen_forever
from queue_daemon.store.pg_base import Db, status_count
from queue_daemon.store.pg_graph import GraphPart

if TYPE_CHECKING:
    from queue_daemon.store.pg_base import Connection

logger = logging.getLogger(__name__)

PURGE_CHUNK = 10_000  # rows deleted per statement, so no purge holds locks for long
RELEASE_TEXT = 64 << 20  # characters of results sent in one release statement
NEW_SYSID_TRIES = 1000


class QueuePart:
    """The claim path (``JobQueue``) and the daemons' sysid leases (``SysidLeases``)."""

    def __init__(self, db: Db, graph: GraphPart) -> None:
        self._db = db
        self._graph = graph  # resolves the dependents of the jobs it ends

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
        rows = await self._db.fetch(queries.queue.CLAIM, type, limit, sysid, float(lease))
        # the handler's row (id NULL), then by position (the columns of
        # queries.queue.CLAIM, in order): a Record's lookup by name costs a job
        # about as much as the object it fills
        if rows[-1][0] is None:  # where an append of the two parts puts it
            handler = rows.pop()[1]
        else:
            handler = next(row[1] for row in rows if row[0] is None)
            rows = [row for row in rows if row[0] is not None]
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
            )
            for id_, data, attempts, created_ms, deadline, due_ms in rows
        ]
        # in the order they were added (ids of one daemon are time-ordered)
        jobs.sort(key=attrgetter("created_ms", "id"))
        return jobs

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
        ordered = sorted(releases, key=lambda r: r.id)
        # a statement per RELEASE_TEXT characters of results (a batch of 1,000
        # results of 1 MiB would pass PostgreSQL's 1 GB message), in one
        # transaction (begun only when there is more than one: two round trips)
        chunks = _by_result_size(ordered)
        async with self._db.conn() as conn:
            try:
                rows = await _release(conn, chunks, sysid, keep_first=False)
            except asyncpg.UniqueViolationError:  # an id done already (queries.release)
                rows = await _release(conn, chunks, sysid, keep_first=True)
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
        )


def _by_result_size(releases: list[Release]) -> list[list[Release]]:
    """``releases`` in chunks of at most RELEASE_TEXT characters of results (a
    release whose result alone is bigger is a chunk of its own)."""
    chunks: list[list[Release]] = [[]]
    size = 0
    for r in releases:
        n = len(r.result) if r.result else 0
        if size + n > RELEASE_TEXT and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(r)
        size += n
    return chunks


async def _release(
    conn: Connection, chunks: list[list[Release]], sysid: str, *, keep_first: bool
) -> list[asyncpg.Record]:
    """The rows of the release statements of ``chunks``: in one transaction when
    there are several (begun only then: two more round trips)."""
    q = queries.release
    archive, release = (
        (q.ARCHIVE_KEEP_FIRST, q.RELEASE_KEEP_FIRST) if keep_first else (q.ARCHIVE, q.RELEASE)
    )
    rows: list[asyncpg.Record] = []
    together = conn.transaction() if len(chunks) > 1 else contextlib.nullcontext()
    async with together:
        for chunk in chunks:
            statement = archive if all(r.how == ReleaseHow.ARCHIVE for r in chunk) else release
            rows += await conn.fetch(statement, *release_params(chunk, sysid))
    return rows


def release_params(releases: Sequence[Release], sysid: str) -> tuple[object, ...]:
    """The parameters of ``queries.release.RELEASE`` for ``releases`` (in this order).
    StoreError if an id holds a space (the texts are split on spaces; no id the
    daemon makes holds one)."""
    ids = " ".join([r.id for r in releases])
    if ids.count(" ") != len(releases) - 1:
        raise StoreError("a job id holds a space: it cannot be released")
    return (
        ids,
        " ".join([r.how for r in releases]),  # StrEnum: joined as their text
        " ".join([r.code or "" for r in releases]),
        " ".join(["" if r.exitcode is None else str(r.exitcode) for r in releases]),
        [r.result for r in releases],
        " ".join([repr(float(r.delay)) if r.delay else "0" for r in releases]),
        " ".join(["t" if r.refund_attempt else "f" for r in releases]),
        " ".join([sysid] * len(releases)),
    )
