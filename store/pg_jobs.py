"""Jobs in and out: ingestion (``JobIntake``) and a tenant's view (``JobQueries``)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import cast

import asyncpg

from queue_daemon.domain.jobs import ClaimedJob, Dispatch, Job, JobPage, JobState, NewJob, epoch_ms
from queue_daemon.domain.views import Paused, TypeStats
from queue_daemon.store import queries
from queue_daemon.store.cursor import decode_cursor, encode_cursor
from queue_daemon.store.errors import Conflict, LimitReached, NotFound
from queue_daemon.store.notes import added_payload
from queue_daemon.store.pg_base import Db, job_of, state_of, status_count
from queue_daemon.store.pg_graph import GraphPart
from queue_daemon.store.pg_history import HistoryPart

logger = logging.getLogger(__name__)

MAX_PAGE = 1000
RERUN_TRIES = 3
# bytes of payloads and results a page holds (at least one job, however big)
PAGE_BYTES = 4 << 20


class JobsPart:
    """Jobs in and out: ingestion (``JobIntake``) and a tenant's view (``JobQueries``)."""

    COPY_PARTS = 2  # connections one add_jobs call copies over at once
    # Batches up to this size go in as one INSERT statement (one round trip)
    # rather than a COPY (five: begin, the table's columns, copy, notify,
    # commit): an add that arrives alone reaches the store sooner.
    FEW_ROWS = 64
    MIN_PART_ROWS = 1000  # smaller batches go in one part

    def __init__(self, db: Db, graph: GraphPart, history: HistoryPart) -> None:
        self._db = db
        self._graph = graph  # resolves the dependents of the jobs it ends
        self._history = history  # flushes an insert asked to be durable

    # --- jobs -------------------------------------------------------------

    async def add_jobs(
        self, jobs: Sequence[NewJob], *, durable: bool = True, fresh: bool = False
    ) -> int:
        """Insert ``jobs``; rows whose id exists are skipped. Return how many were new.

        The rows are seen (and notified) as soon as they are in; with ``durable``
        the call also waits for them to be flushed, else ``flush`` does that.

        A large batch is split over ``COPY_PARTS`` connections copying at once
        (about 1.4x the rows/s of one on two cores), and the jobs of types with
        only a few rows in it go in beside it on their own connection, so a
        tenant's job added just after another's big batch is not held up by
        that batch's COPY. Each part commits on its own: if one fails, the
        caller retries the whole batch and the parts already in are skipped by id.

        Only a ``fresh`` batch is copied straight into jobs; any other goes
        through the staging table, so that ids already done (moved to
        jobs_done, where jobs' primary key cannot see them) are skipped.
        """
        if not jobs:
            return 0
        records = list(jobs)  # NewJob is a tuple in COPY column order
        if len(records) <= self.FEW_ROWS:
            added = await self._add_few(records, fresh)
        else:
            per_type = Counter(job.type for job in records)
            few = [job for job in records if per_type[job.type] <= self.FEW_ROWS]
            if 0 < len(few) <= self.FEW_ROWS:
                many = [job for job in records if per_type[job.type] > self.FEW_ROWS]
                added = await self._gather_added(
                    self._add_few(few, fresh), self._add_many(many, fresh)
                )
            else:
                added = await self._add_many(records, fresh)
        if durable:
            await self._history.flush()
        return added

    async def add_dispatched(
        self,
        jobs: Sequence[NewJob],
        dispatch: Dispatch,
        *,
        fresh: bool = True,
        early: bool = False,
    ) -> tuple[int, list[ClaimedJob]]:
        """Insert a batch of a few jobs (not yet flushed, as ``add_jobs``
        without ``durable``), those of ``dispatch.ids`` claimed by its sysid:
        how many rows were new, and the jobs claimed (none when the sysid may
        not claim). A batch that is not ``fresh`` skips the ids done already;
        an ``early`` one stores nothing when the sysid may not claim."""
        claim = [job.id in dispatch.ids for job in jobs]
        columns = list(zip(*jobs, strict=True))
        waiting = added_payload(
            job for job, claimed in zip(jobs, claim, strict=True) if not claimed
        )
        args = (
            *columns,
            claim,
            dispatch.sysid,
            float(dispatch.lease),
            waiting,
            early,
            dispatch.running,
        )
        # an early add's insert is on the add → start path of an idle daemon
        async with self._db.kept_conn() if early else self._db.conn() as conn:
            if fresh:  # one statement, one round trip
                rows = await conn.fetch(queries.intake.INSERT_DISPATCHED, *args)
            else:
                async with conn.transaction():
                    rows = await conn.fetch(queries.intake.INSERT_DISPATCHED, *args)
                    done = {r[0] for r in await conn.fetch(queries.intake.REMOVE_DONE, columns[0])}
                rows = [row for row in rows if row[0] not in done]
        by_id = {job.id: job for job in jobs}
        added = 0
        claimed: list[ClaimedJob] = []
        for row in rows:
            if row[0] is None:  # the note's row
                continue
            added += 1
            if row[1]:
                job = by_id[row[0]]
                claimed.append(
                    ClaimedJob(
                        id=job.id,
                        type=job.type,
                        data=job.data,
                        attempts=1,
                        created_ms=epoch_ms(job.create_dt),
                        due_ms=epoch_ms(max(job.dt, job.create_dt)),
                        handler=row[2],
                    )
                )
        return added, claimed

    async def remove_refused(self, ids: Sequence[str], sysid: str) -> int:
        status = await self._db.execute(queries.intake.REMOVE_REFUSED, list(ids), sysid)
        return status_count(status)

    async def _add_many(self, records: list[NewJob], fresh: bool) -> int:
        parts = max(1, min(self.COPY_PARTS, len(records) // self.MIN_PART_ROWS))
        if parts == 1:
            return await self._add_records(records, fresh)
        size = -(-len(records) // parts)
        return await self._gather_added(
            *(self._add_records(records[i : i + size], fresh) for i in range(0, len(records), size))
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

    async def _add_few(self, records: Sequence[NewJob], fresh: bool) -> int:
        columns = list(zip(*records, strict=True))
        payload = added_payload(records)
        removed = 0
        async with self._db.conn() as conn:
            if fresh:  # one statement, one round trip
                row = await conn.fetchrow(queries.intake.INSERT_FEW, *columns, payload)
            else:
                async with conn.transaction():
                    row = await conn.fetchrow(queries.intake.INSERT_FEW, *columns, payload)
                    removed = len(await conn.fetch(queries.intake.REMOVE_DONE, columns[0]))
        return (int(row["n"]) if row is not None else 0) - removed

    async def _add_records(self, records: Sequence[NewJob], fresh: bool) -> int:
        async with self._db.conn() as conn:
            # Fast path: COPY a fresh batch straight into jobs. A duplicate id
            # aborts it; then, as for a batch that is not fresh, go through the
            # temp table, skipping the ids in jobs and removing again those done
            # (in jobs_done: queries.intake, REMOVE_DONE), which also counts the
            # new rows.
            if fresh:
                try:
                    async with conn.transaction():
                        await conn.execute(queries.queue.ASYNC_COMMIT)
                        await conn.copy_records_to_table(
                            queries.intake.JOBS_TABLE,
                            records=records,
                            columns=queries.migrations.JOB_COPY_COLUMNS,
                        )
                        # sent at commit, so a woken daemon finds the rows
                        await conn.execute(queries.queue.NOTIFY_JOBS, added_payload(records))
                    return len(records)
                except asyncpg.UniqueViolationError:
                    pass
            async with conn.transaction():
                await conn.execute(queries.queue.ASYNC_COMMIT)
                await conn.copy_records_to_table(
                    queries.migrations.JOBS_IN_TABLE,
                    records=records,
                    columns=queries.migrations.JOB_COPY_COLUMNS,
                )
                status = await conn.execute(queries.intake.INSERT_FROM_JOBS_IN)
                removed = await conn.execute(queries.intake.REMOVE_DONE_FROM_JOBS_IN)
                added = status_count(status) - status_count(removed)  # "INSERT 0 <n>", "DELETE <n>"
                if added:  # which of them were new is not known here: "re-read"
                    await conn.execute(queries.queue.NOTIFY_JOBS, "")
        return added

    async def get_job(self, client: str, job_id: str) -> Job:
        row = await self._db.fetchrow(queries.jobs.GET_JOB, job_id, client)
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return job_of(row)

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
            rows = await self._db.fetch(
                queries.jobs.LIST_JOBS_FIRST, client, type, state_arg, limit + 1, PAGE_BYTES
            )
        else:
            create_dt, last_id = decode_cursor(after)
            rows = await self._db.fetch(
                queries.jobs.LIST_JOBS_AFTER,
                client,
                type,
                state_arg,
                limit + 1,
                create_dt,
                last_id,
                PAGE_BYTES,
            )
        if not rows:
            return JobPage(jobs=[], next=None)
        jobs = [job_of(row) for row in rows[:limit]]
        # more rows than asked, or some cut off by the page's bytes
        more = rows[0]["rows"] > len(jobs)
        cursor = encode_cursor(jobs[-1].create_dt, jobs[-1].id) if more else None
        return JobPage(jobs=jobs, next=cursor)

    async def stats(self, client: str) -> dict[str, TypeStats]:
        """Done counts from type_counts (kept by triggers on jobs, migration
        0003), the others from the waiting and running partial indexes: the
        cost does not grow with the number of archived jobs."""
        rows = await self._db.fetch(queries.jobs.STATS, client)
        return {
            row["type"]: TypeStats(
                waiting=row["waiting"],
                scheduled=row["scheduled"],
                blocked=row["blocked"],
                running=row["running"],
                done_ok=row["done_ok"],
                done_failed=row["done_failed"],
                done_error=row["done_error"],
            )
            for row in rows
        }

    async def cancel_job(self, client: str, job_id: str) -> Job:
        async with self._db.conn() as conn:
            for _ in range(3):
                # a cancel and the resolution of the job's dependents commit together
                async with conn.transaction():
                    row = await conn.fetchrow(queries.jobs.CANCEL_JOB, job_id, client)
                    if row is not None and row["dependents"]:
                        await self._graph.resolve([job_id], conn)
                    holder = None if row is None else row["was"]
                    if holder and not holder.startswith("w:"):
                        # the daemon running it stops it (a pull worker hears at
                        # its next renew or complete)
                        await conn.execute(queries.jobs.NOTIFY_CANCELLED, holder, job_id)
                if row is not None:
                    return job_of(row)
                row = await conn.fetchrow(queries.jobs.GET_JOB, job_id, client)
                if row is None:
                    raise NotFound(f"no job {job_id!r}")
                lock = row["lock"]
                if lock == "__done":
                    break
                # not done: ingested between the two statements
            raise Conflict(f"job {job_id!r} is {state_of(lock).value}")

    async def _rerun(self, query: str, *args: object) -> list[asyncpg.Record]:
        """A rerun statement, again after a deadlock: it moves rows between jobs
        and jobs_done in the other order than a purge does (their count
        triggers lock the same counters)."""
        async with self._db.conn() as conn:
            for attempt in range(RERUN_TRIES):
                try:
                    rows = await conn.fetch(query, *args)
                except asyncpg.DeadlockDetectedError:
                    if attempt == RERUN_TRIES - 1:
                        raise
                else:
                    return [row for row in rows if row["id"] is not None]
        raise AssertionError("unreachable")

    async def rerun_job(self, client: str, job_id: str) -> Job:
        if not await self._rerun(queries.jobs.RERUN_JOB, job_id, client):
            job = await self.get_job(client, job_id)  # NotFound
            if job.state is not JobState.DONE:
                raise Conflict(f"job {job_id!r} is {job.state.value}")
            if len(job.runs or ()) >= queries.jobs.MAX_RUNS:
                raise Conflict(f"job {job_id!r} has run {queries.jobs.MAX_RUNS} times")
            raise Conflict(f"job {job_id!r} is done, and its dependents are not resolved yet")
        return await self.get_job(client, job_id)

    async def rerun_done(
        self, client: str, *, type: str | None, codes: Sequence[str], before: datetime, limit: int
    ) -> dict[str, int]:
        rows = await self._rerun(queries.jobs.RERUN_DONE, client, type, list(codes), before, limit)
        return dict(Counter(row["type"] for row in rows))

    async def pause_type(self, client: str, type: str, *, paused: bool, most: int) -> None:
        """Pause or resume the stored ``type`` of ``client``; LimitReached when
        ``client`` has ``most`` paused types already."""
        if not paused:
            await self._db.execute(queries.jobs.RESUME_TYPE, type)
            return
        async with self._db.conn() as conn, conn.transaction():
            await conn.execute(queries.jobs.PAUSE_LOCK, client)
            if not await conn.fetchval(
                queries.jobs.PAUSE_TYPE, type, f"{client}-", f"{client}.", most
            ):
                raise LimitReached(f"{most} types are paused already; resume one first")

    async def pause_tenant(self, client: str, *, paused: bool, known: bool = True) -> None:
        """Pause or resume every type of ``client``; NotFound when it is not an
        active tenant and ``known`` (a resume: whatever it is)."""
        if not paused:
            await self._db.execute(queries.jobs.RESUME_TENANT, client)
        elif not await self._db.fetchval(queries.jobs.PAUSE_TENANT, client, known):
            raise NotFound(f"no active tenant {client!r}")

    async def paused(self, client: str) -> Paused:
        rows = await self._db.fetch(queries.jobs.PAUSED, client)
        names = {row["name"] for row in rows}
        prefix = len(client) + 1
        return Paused(
            tenant=client in names,
            types=frozenset(name[prefix:] for name in names if name != client),
        )

    async def paused_counts(self) -> dict[str, tuple[bool, int]]:
        rows = await self._db.fetch(queries.jobs.PAUSED_COUNTS)
        return {row["client"]: (row["tenant"], row["types"]) for row in rows}

    async def delete_done(
        self, client: str, *, type: str | None, before: datetime, limit: int
    ) -> dict[str, int]:
        """Delete up to ``limit`` of ``client``'s jobs done before ``before`` (of
        stored ``type``, or any); how many per stored type."""
        rows = await self._db.fetch(queries.jobs.DELETE_DONE, client, type, before, limit)
        return {row["type"]: row["n"] for row in rows}
