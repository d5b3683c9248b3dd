"""Jobs in (``JobIntake``, with dependencies and deadlines) and a tenant's view
of them (``JobQueries``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from queue_daemon.domain.jobs import Job, JobPage, JobState, NewJob, Resolution, epoch_ms
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.domain.views import Paused, TypeStats
from queue_daemon.store.cursor import decode_cursor, encode_cursor
from queue_daemon.store.errors import Conflict, LimitReached, NotFound
from queue_daemon.store.queries.jobs import MAX_RUNS
from tests.fakes.store.tables import (
    BLOCKED_DT,
    DONE,
    DONE_FIELDS,
    Row,
    Tables,
    by_of,
    client_of,
    job_of,
    state_of,
)

MAX_PAGE = 1000
PAGE_BYTES = 4 << 20


def _size(row: Row) -> int:
    return len(row.data.encode()) + len((row.result or "").encode())


class Jobs(Tables):
    incarnation = 1  # the server's epoch; ``restart`` starts another

    # --- JobIntake ------------------------------------------------------------------

    async def add_jobs(
        self, jobs: Sequence[NewJob], *, durable: bool = True, fresh: bool = False
    ) -> int:
        self._call("add_jobs")
        new = 0
        for job in jobs:
            found = self.rows.get(job.id)
            # PostgreSQL copies a fresh batch straight in, blind to the done jobs
            # moved out of jobs (0013): a caller must never call one fresh wrongly
            assert not (fresh and found is not None and found.lock == DONE), (
                f"a fresh batch holds {job.id!r}, a job already done"
            )
            if found is None:
                self.rows[job.id] = Row(job.id, job.type, job.dt, job.data, job.create_dt)
                new += 1
                if not durable:
                    self._unflushed.append(job.id)
        return new

    async def add_opted(self, groups: Sequence[OptedJobs]) -> int:
        self._call("add_opted")
        now, added = self.now(), 0
        for group in groups:
            deps = [self.rows[i] for i in dict.fromkeys(group.after) if i in self.rows]
            for dep in deps:
                dep.dependents = dep.dependents or dep.lock != DONE
            open_ = [d for d in deps if d.lock != DONE]
            bad = min((d.id for d in deps if d.lock == DONE and d.code != "ok"), default=None)
            if group.resolve_any:
                bad = None
            failed: list[tuple[str, str]] = []
            for job in group.jobs:
                if job.id in self.rows:
                    continue
                row = Row(job.id, job.type, job.dt, job.data, job.create_dt)
                row.deadline, row.resolve_any, row.deps_dt, row.priority = (
                    group.deadline,
                    group.resolve_any,
                    job.dt,
                    group.priority,
                )
                row.key, row.trace = group.key, group.trace
                self.rows[job.id] = row
                added += 1
                if bad is not None:
                    # inserted done: not an update, so not counted as archived
                    self._archive(
                        row,
                        now,
                        "failed",
                        424,
                        f"dependency {bad} did not complete",
                        counted=False,
                    )
                    failed.append((row.id, row.type))
                    continue
                row.deps = len(open_)
                if open_:
                    row.dt = BLOCKED_DT
                    self.edges.update((d.id, row.id) for d in open_)
            if failed:
                self._told(Resolution([], failed))
        return added

    async def expire_deadlines(self) -> list[tuple[str, str, bool]]:
        self._call("expire_deadlines")
        now = self.now()
        due = sorted(
            (
                r
                for r in self.rows.values()
                if r.deadline is not None and r.lock != DONE and r.deadline <= now
            ),
            key=lambda r: (r.deadline or now, r.id),
        )
        ended = []
        for row in due:
            running = row.lock != ""
            if running:
                row.ran(
                    {
                        "started": None if row.run_dt is None else epoch_ms(row.run_dt),
                        "ended": epoch_ms(now),
                        "by": by_of(row.lock),
                        "exitcode": None,
                        "code": None,
                        "reason": "deadline",
                    }
                )
            self._archive(row, now, "failed", 408, "the deadline passed before the job was done")
            row.deps = None
            ended.append((row.id, row.type, running))
        self.resolve([r.id for r in due if r.dependents])
        return ended

    async def resolve_pending(self) -> int:
        self._call("resolve_pending")
        pending = [r.id for r in self.rows.values() if r.dependents and r.lock == DONE]
        self.resolve(pending)
        return len(pending)

    async def remove_refused(self, ids: Sequence[str], sysid: str) -> int:
        self._call("remove_refused")
        gone = [i for i in ids if i in self.rows and self.rows[i].lock in ("", sysid)]
        for job_id in gone:
            del self.rows[job_id]
        return len(gone)

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

    # --- JobQueries -----------------------------------------------------------------

    def _owned(self, client: str, job_id: str) -> Row:
        row = self.rows.get(job_id)
        if row is None or client_of(row.type) != client:
            raise NotFound(f"no job {job_id!r}")
        return row

    async def get_job(self, client: str, job_id: str) -> Job:
        self._call("get_job")
        return job_of(self._owned(client, job_id), runs=True)

    async def list_jobs(
        self,
        client: str,
        *,
        type: str | None = None,
        state: JobState | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage:
        self._call("list_jobs")
        limit = max(1, min(MAX_PAGE, limit))
        cursor = None if after is None else decode_cursor(after)
        matches = sorted(
            (
                r
                for r in self.rows.values()
                if client_of(r.type) == client
                and (type is None or r.type == f"{client}-{type}")
                and (state is None or state_of(r) == JobState(state))
                and (cursor is None or (r.create_dt, r.id) < cursor)
            ),
            key=lambda r: (r.create_dt, r.id),
            reverse=True,
        )[: limit + 1]
        page: list[Row] = []
        upto = 0
        for row in matches:  # a page stops at the row that starts past its bytes
            if upto >= PAGE_BYTES:
                break
            page.append(row)
            upto += _size(row)
        jobs = [job_of(r) for r in page[:limit]]
        more = len(matches) > len(jobs)
        next_ = encode_cursor(jobs[-1].create_dt, jobs[-1].id) if jobs and more else None
        return JobPage(jobs=jobs, next=next_)

    async def stats(self, client: str) -> dict[str, TypeStats]:
        self._call("stats")
        now = self.now()
        counts: dict[str, dict[str, int]] = {}
        for row in self.rows.values():
            if client_of(row.type) != client:
                continue
            c = counts.setdefault(row.type.partition("-")[2], {})
            if row.lock == "":
                key = (
                    "blocked"
                    if row.dt == BLOCKED_DT
                    else "scheduled"
                    if row.dt > now
                    else "waiting"
                )
            elif row.lock == DONE:
                key = DONE_FIELDS.get(row.code or "", "done_other")
            else:
                key = "running"
            c[key] = c.get(key, 0) + 1
        return {
            t: TypeStats(**{k: n for k, n in c.items() if k != "done_other"})
            for t, c in sorted(counts.items())
        }

    async def cancel_job(self, client: str, job_id: str) -> Job:
        self._call("cancel_job")
        row = self._owned(client, job_id)
        if row.lock == DONE:
            raise Conflict(f"job {job_id!r} is {state_of(row).value}")
        now, holder = self.now(), row.lock
        code = "cancelled" if holder else "failed"
        started = None if not holder or row.run_dt is None else epoch_ms(row.run_dt)
        self._archive(row, now, code, 499, "cancelled")
        row.ran(
            {
                "started": started,
                "ended": epoch_ms(now),
                "by": by_of(holder) if holder else None,
                "exitcode": 499,
                "code": code,
                "reason": "cancelled",
            }
        )
        if holder and not holder.startswith("w:"):
            self.cancel_notes.append((holder, row.id))
            for told in self.cancel_listeners:
                told(holder, row.id)
        if row.dependents:
            self.resolve([row.id])
        return job_of(row)

    def _rerun(self, row: Row) -> None:
        """``queries.jobs.RERUN_JOB``: due now, fresh attempts, runs kept,
        waiting for nothing."""
        row.lock, row.dt, row.done_dt, row.attempts = "", self.now(), None, 0
        row.code = row.result = row.log = None
        row.progress = None
        row.exitcode = row.run_dt = row.deadline = None
        row.deps = row.deps_dt = row.resolve_any = None

    @staticmethod
    def _rerunnable(row: Row) -> bool:
        return row.lock == DONE and len(row.runs or ()) < MAX_RUNS and not row.dependents

    async def rerun_job(self, client: str, job_id: str) -> Job:
        self._call("rerun_job")
        row = self._owned(client, job_id)
        if not self._rerunnable(row):
            raise Conflict(f"job {job_id!r} is {state_of(row).value}, or may not run again")
        self._rerun(row)
        return job_of(row, runs=True)

    async def rerun_done(
        self, client: str, *, type: str | None, codes: Sequence[str], before: datetime, limit: int
    ) -> dict[str, int]:
        self._call("rerun_done")
        picked = [
            r
            for r in self.rows.values()
            if client_of(r.type) == client
            and (type is None or r.type == type)
            and self._rerunnable(r)
            and r.code in ("failed", "error")
            and r.code in codes
            and r.exitcode not in (499, 424)
            and r.done_dt is not None
            and r.done_dt < before
        ][: max(0, limit)]
        counts: dict[str, int] = {}
        for row in picked:
            self._rerun(row)
            counts[row.type] = counts.get(row.type, 0) + 1
        return counts

    async def pause_type(self, client: str, type: str, *, paused: bool, most: int) -> None:
        self._call("pause_type")
        if not paused:
            self.pauses.discard(type)
        elif type not in self.pauses:
            if (
                sum(1 for name in self.pauses if client_of(name) == client and name != client)
                >= most
            ):
                raise LimitReached(f"{most} types are paused already; resume one first")
            self.pauses.add(type)

    async def paused(self, client: str) -> Paused:
        self._call("paused")
        prefix = f"{client}-"
        return Paused(
            tenant=client in self.pauses,
            types=frozenset(n.removeprefix(prefix) for n in self.pauses if n.startswith(prefix)),
        )

    async def paused_counts(self) -> dict[str, tuple[bool, int]]:
        self._call("paused_counts")
        counts: dict[str, tuple[bool, int]] = {}
        for name in self.pauses:
            tenant, types = counts.get(client_of(name), (False, 0))
            whole = "-" not in name
            counts[client_of(name)] = (tenant or whole, types + (not whole))
        return counts

    async def delete_done(
        self, client: str, *, type: str | None, before: datetime, limit: int
    ) -> dict[str, int]:
        self._call("delete_done")
        gone = [
            r
            for r in self.rows.values()
            if client_of(r.type) == client
            and (type is None or r.type == type)
            and r.lock == DONE
            and r.done_dt is not None
            and r.done_dt < before
            and not r.dependents
        ][: max(0, limit)]
        deleted: dict[str, int] = {}
        for row in gone:
            del self.rows[row.id]
            deleted[row.type] = deleted.get(row.type, 0) + 1
        return deleted
