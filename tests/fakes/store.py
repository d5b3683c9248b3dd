"""An in-memory store implementing the ports the engine's decisions use:
``JobIntake`` (the ingester), ``JobQueue`` (the worker) and ``HandlerLookup``
(the handler cache), with the semantics of ``queue_daemon.store.pg.PgStore`` that the engine
relies on: eligible means ``lock == ''`` and ``dt <= now``; a claim takes the
oldest due first up to its limit, leases, and counts an attempt; releases retry,
unget or archive; expired leases unlock; adds are idempotent by id.

Failures can be injected per method (``fail``), to test the retry loops.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from queue_daemon.domain.jobs import (
    ClaimedJob,
    ExpiredLock,
    NewJob,
    Release,
    ReleaseHow,
    UnhandledRound,
)
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.store.errors import NotFound, StoreUnavailable
from queue_daemon.store.listen import Delays

DONE = "__done"


@dataclass(slots=True)
class Row:
    id: str
    type: str
    dt: datetime
    data: str
    create_dt: datetime
    lock: str = ""
    attempts: int = 0
    code: str | None = None
    exitcode: int | None = None
    result: str | None = None


@dataclass
class FakeStore:
    rows: dict[str, Row] = field(default_factory=dict)
    handlers: dict[str, HandlerRecord] = field(default_factory=dict)
    fail: dict[str, int] = field(default_factory=dict)  # method -> failures still to raise
    calls: dict[str, int] = field(default_factory=dict)
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    incarnation: int = 1  # the server's epoch; ``restart`` starts another
    _unflushed: list[str] = field(default_factory=list)  # ids added, not yet flushed
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.fail.get(name, 0) > 0:
            self.fail[name] -= 1
            raise StoreUnavailable(f"{name}: injected")

    # JobIntake
    async def add_opted(self, groups: Sequence[OptedJobs]) -> int:
        return await self.add_jobs([job for group in groups for job in group.jobs])

    async def add_jobs(self, jobs: Sequence[NewJob], *, durable: bool = True) -> int:
        self._call("add_jobs")
        new = 0
        for job in jobs:
            if job.id not in self.rows:
                self.rows[job.id] = Row(job.id, job.type, job.dt, job.data, job.create_dt)
                new += 1
                if not durable:
                    self._unflushed.append(job.id)
        return new

    async def flush(self) -> str:
        self._call("flush")
        self._unflushed.clear()
        return str(self.incarnation)

    async def epoch(self) -> str:
        self._call("epoch")
        return str(self.incarnation)

    def restart(self) -> None:
        """A crash and restart: rows added but not yet flushed are gone."""
        for job_id in self._unflushed:
            self.rows.pop(job_id, None)
        self._unflushed.clear()
        self.incarnation += 1

    # JobQueue
    def _due(self, row: Row) -> bool:
        return row.lock == "" and row.dt <= self.now()

    def _run_here(self, type: str) -> bool:
        handler = self.handlers.get(type)
        return handler is not None and handler.data.get("lang") != "worker"

    async def waiting_jobtypes(self, limit_per_type: int = 1000) -> dict[str, int]:
        self._call("waiting_jobtypes")
        counts: dict[str, int] = {}
        for row in self.rows.values():
            if self._due(row) and self._run_here(row.type):
                counts[row.type] = min(counts.get(row.type, 0) + 1, limit_per_type)
        return counts

    async def claim(self, type: str, limit: int, *, sysid: str, lease: float) -> list[ClaimedJob]:
        self._call("claim")
        due = sorted(
            (r for r in self.rows.values() if r.type == type and self._due(r)),
            key=lambda r: (r.dt, r.id),
        )[:limit]
        handler = self.handlers.get(type)
        claimed = []
        for row in due:
            row.lock, row.attempts = sysid, row.attempts + 1
            row.dt = self.now() + timedelta(seconds=lease)
            claimed.append(
                ClaimedJob(
                    id=row.id,
                    type=row.type,
                    data=row.data,
                    attempts=row.attempts,
                    create_dt=row.create_dt,
                    handler=None if handler is None else handler.id,
                )
            )
        return claimed

    async def unhandled_types(
        self, older_than: float, *, after: str = "", steps: int = 5_000
    ) -> UnhandledRound | None:
        self._call("unhandled_types")
        cutoff = self.now() - timedelta(seconds=older_than)
        waiting = sorted({r.type for r in self.rows.values() if r.lock == "" and r.type > after})
        round_ = waiting[:steps]
        oldest = {
            t: min(r.dt for r in self.rows.values() if r.type == t and r.lock == "") for t in round_
        }
        return UnhandledRound(
            expired=[
                (t, t in self.handlers)
                for t in round_
                if oldest[t] < cutoff and not self._run_here(t)
            ],
            next_after=round_[-1] if len(round_) >= steps else None,
        )

    async def expire_waiting(self, type: str, older_than: float, result: str) -> list[str]:
        self._call("expire_waiting")
        cutoff = self.now() - timedelta(seconds=older_than)
        ids = [
            r.id
            for r in self.rows.values()
            if r.type == type and r.lock == "" and r.create_dt < cutoff and r.dt < cutoff
        ]
        for job_id in ids:
            self._archive(self.rows[job_id], "error", 503, result)
        return ids

    def _archive(
        self, row: Row, code: str | None, exitcode: int | None, result: str | None
    ) -> None:
        row.lock, row.code, row.exitcode, row.result = DONE, code, exitcode, result

    async def renew(self, ids: Sequence[str], *, sysid: str, lease: float) -> int:
        self._call("renew")
        mine = [self.rows[i] for i in ids if i in self.rows and self.rows[i].lock == sysid]
        for row in mine:
            row.dt = self.now() + timedelta(seconds=lease)
        return len(mine)

    async def release(self, releases: Sequence[Release], *, sysid: str) -> set[str]:
        self._call("release")
        applied: set[str] = set()
        for release in releases:
            row = self.rows.get(release.id)
            if row is None or row.lock != sysid:
                continue
            applied.add(release.id)
            if release.refund_attempt:
                row.attempts -= 1
            if release.code is not None:
                row.code, row.exitcode, row.result = release.code, release.exitcode, release.result
            if release.how is ReleaseHow.ARCHIVE:
                self._archive(row, row.code, row.exitcode, row.result)
            else:
                row.lock = ""
                delay = release.delay if release.how is ReleaseHow.RETRY else 0.0
                row.dt = self.now() + timedelta(seconds=delay)
        return applied

    async def expire_locks(self) -> list[ExpiredLock]:
        self._call("expire_locks")
        now = self.now()
        expired = [r for r in self.rows.values() if r.lock not in ("", DONE) and r.dt < now]
        for row in expired:
            row.lock, row.dt = "", now
        return [ExpiredLock(r.id, r.type, r.attempts) for r in expired]

    async def purge(self, older_than: float) -> dict[str, int]:
        self._call("purge")
        return {}

    async def notify_jobs(self) -> None:
        self._call("notify_jobs")

    async def forget_workers(self) -> int:
        return 0

    async def expire_deadlines(self) -> list[tuple[str, str, bool]]:
        return []

    async def resolve_pending(self) -> int:
        return 0

    async def fold_counts(self) -> bool:
        return True

    async def listen(
        self,
        on_jobs: Callable[[dict[str, int] | None], None],
        on_handler: Callable[[str], None],
        *,
        retry: Delays,
        on_done: Callable[[set[str] | None], None] | None = None,
    ) -> None:
        on_jobs(None)
        await asyncio.Event().wait()  # until cancelled

    # HandlerStore (what the handler cache reads)
    async def get_handler(self, type: str) -> HandlerRecord:
        self._call("get_handler")
        try:
            return self.handlers[type]
        except KeyError:
            raise NotFound(type) from None

    def set_handler(self, type: str, body: str, **fields: object) -> HandlerRecord:
        record = HandlerRecord(
            id=f"h{next(self._versions)}",
            type=type,
            dt=self.now(),
            data={"lang": "python", "body": body, **fields},
        )
        self.handlers[type] = record
        return record

    # helpers for tests
    def add(self, type: str, *payloads: str, prefix: str = "j", ago: float = 0.0) -> list[str]:
        """Jobs due now (created ``ago`` seconds ago), straight into the store."""
        at = self.now() - timedelta(seconds=ago)
        ids = []
        for payload in payloads:
            job_id = f"{prefix}{len(self.rows)}"
            self.rows[job_id] = Row(job_id, type, at, payload, at)
            ids.append(job_id)
        return ids

    def done(self) -> list[Row]:
        return [r for r in self.rows.values() if r.lock == DONE]
