"""Jobs that wait for other jobs: adding them, and resolving their dependencies
when those are done (``store/queries/graph.py`` says how the two are ordered)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from queue_daemon.domain.jobs import NewJob, Resolution
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.store import queries
from queue_daemon.store.notes import MAX_PAYLOAD

if TYPE_CHECKING:
    from queue_daemon.store.pg_base import Connection, Db

logger = logging.getLogger(__name__)

PENDING_CHUNK = 1000


def _counts(jobs: Sequence[tuple[str, str]]) -> str:
    counts: dict[str, int] = {}
    for _, jobtype in jobs:
        counts[jobtype] = counts.get(jobtype, 0) + 1
    payload = " ".join(f"{jobtype}={n}" for jobtype, n in counts.items())
    return payload if len(payload) <= MAX_PAYLOAD else ""


class GraphPart:
    """Jobs with dependencies or deadlines in, and the resolution of done jobs'
    dependents, which the other parts call after their statements end jobs."""

    def __init__(self, db: Db) -> None:
        self._db = db
        # told of every resolution (the queue log and metrics); set by the daemon's wiring
        self.on_resolved: Callable[[Resolution], None] | None = None

    async def add_opted(self, groups: Sequence[OptedJobs]) -> int:
        """Insert jobs with dependencies or deadlines, idempotent by id; the rows new."""
        added = 0
        async with self._db.conn() as conn:
            for group in groups:
                columns = list(zip(*group.jobs, strict=True))
                async with conn.transaction():
                    if group.after:
                        await conn.execute(queries.graph.MARK_DEPENDENCIES, group.after)
                    rows = await conn.fetch(
                        queries.graph.INSERT,
                        *columns,
                        group.after,
                        group.resolve_any,
                        group.deadline,
                        group.priority,
                        group.key,
                        group.trace,
                    )
                    # its own ids may be inserted again (queries.intake, REMOVE_DONE)
                    gone = {r[0] for r in await conn.fetch(queries.intake.REMOVE_DONE, columns[0])}
                if gone:
                    rows = [r for r in rows if r["id"] not in gone]
                added += len(rows)
                due = [(r["id"], r["type"]) for r in rows if r["state"] == "due"]
                if due:
                    await conn.execute(queries.queue.NOTIFY_JOBS, _counts(due))
                failed = [(r["id"], r["type"]) for r in rows if r["state"] == "failed"]
                if failed:
                    self._told(Resolution([], failed))
        return added

    async def resolve(self, ids: Sequence[str], conn: Connection | None = None) -> Resolution:
        """Resolve the dependents of ``ids`` (done jobs that had some)."""
        if not ids:
            return Resolution([], [])
        if conn is None:
            async with self._db.conn() as own:
                return await self.resolve(ids, own)
        rows = await conn.fetch(queries.graph.RESOLVE, list(ids))
        freed = [(r["id"], r["type"]) for r in rows if r["what"] == "freed"]
        failed = [(r["id"], r["type"]) for r in rows if r["what"] == "failed"]
        if freed:
            await conn.execute(queries.queue.NOTIFY_JOBS, _counts(freed))
        if failed:
            types = " ".join(sorted({jobtype for _, jobtype in failed}))
            await conn.execute(queries.pulled.NOTIFY_DONE, types if len(types) < 7000 else "")
        resolution = Resolution(freed, failed)
        self._told(resolution)
        again = [r["id"] for r in rows if r["what"] == "failed" and r["dependents"]]
        if again:  # edges that this statement could not see (added while it ran)
            more = await self.resolve(again, conn)
            resolution = Resolution(freed + more.freed, failed + more.failed)
        return resolution

    async def expire_deadlines(self) -> list[tuple[str, str, bool]]:
        """End (failed, 408) jobs whose deadline passed; (id, type, was running)."""
        ended: list[tuple[str, str, bool]] = []
        while True:
            rows = await self._db.fetch(queries.graph.EXPIRE_DEADLINES, PENDING_CHUNK)
            rows = [row for row in rows if row["id"] is not None]  # NULL: the note's row
            await self.resolve([row["id"] for row in rows if row["dependents"]])
            ended += [(row["id"], row["type"], row["running"]) for row in rows]
            if len(rows) < PENDING_CHUNK:
                return ended

    async def resolve_pending(self) -> int:
        """Resolve what a crash left unresolved; how many done jobs were."""
        total = 0
        while True:
            rows = await self._db.fetch(queries.graph.PENDING, PENDING_CHUNK)
            ids = [row["id"] for row in rows]
            await self.resolve(ids)
            total += len(ids)
            if len(ids) < PENDING_CHUNK:
                return total

    def _told(self, resolution: Resolution) -> None:
        if self.on_resolved is not None and (resolution.freed or resolution.failed):
            try:
                self.on_resolved(resolution)
            except Exception:
                logger.exception("on_resolved failed", extra={"action": "resolved_callback"})


__all__ = ["GraphPart", "NewJob"]
