"""The fake store's tables and what every part of it shares: the clock, the
injected failures, archiving a job and resolving the dependents of done ones."""

from __future__ import annotations

import itertools
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from queue_daemon.domain.jobs import Job, JobState, Resolution
from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.store.errors import StoreUnavailable

DONE = "__done"
BLOCKED_DT = datetime.max.replace(tzinfo=UTC)  # PostgreSQL's 'infinity', as asyncpg reads it
LEASE_EXPIRED_EXIT = 500
# a done job's code -> the stats field that counts it (a cancelled run is a failure)
DONE_FIELDS = {
    "ok": "done_ok",
    "failed": "done_failed",
    "cancelled": "done_failed",
    "error": "done_error",
}

DEFAULT_MAX_ATTEMPTS = 5


def later(now: datetime) -> datetime:
    """now + 1000 years: a done job's dt."""
    try:
        return now.replace(year=now.year + 1000)
    except ValueError:  # 29 February
        return now.replace(year=now.year + 1000, day=28)


def client_of(type: str) -> str:
    return type.split("-", 1)[0]


def by_of(lock: str) -> str:
    """Who ran a job, from its lock (``queries.queue.BY_OF``)."""
    return f"worker:{lock[35:]}" if lock.startswith("w:") else f"sysid:{lock}"


def reason_of(code: str | None) -> str:
    return {"ok": "completed", "failed": "failed"}.get(code or "", "exception")


@dataclass(slots=True)
class Row:
    """A row of ``jobs`` (migrations 0001, 0010, 0011)."""

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
    done_dt: datetime | None = None
    run_dt: datetime | None = None
    runs: list[dict[str, object]] | None = None
    deps: int | None = None
    deps_dt: datetime | None = None
    resolve_any: bool | None = None
    dependents: bool = False
    deadline: datetime | None = None
    priority: int = 0
    progress: dict[str, object] | None = None
    key: str | None = None  # ckey (0020)
    trace: str | None = None  # (0021)
    log: str | None = None  # the last run's log excerpt (0022)

    @property
    def running(self) -> bool:
        return self.lock not in ("", DONE)

    def ran(self, run: dict[str, object]) -> None:
        self.runs = [*(self.runs or []), run]


MAX_KEY_STEPS = 1000  # keys a keyed claim visits at most


def _pick_order(row: Row) -> tuple[int, datetime, str]:
    return (-row.priority, row.dt, row.id)


def _in_time(row: Row, now: datetime) -> bool:
    return row.deadline is None or row.deadline > now


def _utf8(key: str) -> bytes:
    return key.encode("utf-8")  # COLLATE "C": keys in the order of their bytes


def state_of(row: Row) -> JobState:
    if row.lock == "":
        return JobState.BLOCKED if row.dt == BLOCKED_DT else JobState.WAITING
    return JobState.DONE if row.lock == DONE else JobState.RUNNING


def job_of(row: Row, *, runs: bool = False) -> Job:
    return Job(
        id=row.id,
        type=row.type.partition("-")[2],
        state=state_of(row),
        dt=row.dt,
        create_dt=row.create_dt,
        done_dt=row.done_dt,
        attempts=row.attempts,
        code=row.code,
        exitcode=row.exitcode,
        result=row.result,
        data=row.data,
        priority=row.priority,
        key=row.key,
        progress=row.progress,
        runs=(row.runs or []) if runs else None,
        log=row.log if runs else None,
    )


class Tables:
    """The store's state, and the behaviour its parts share."""

    def __init__(self, now: Callable[[], datetime] | None = None) -> None:
        self.now: Callable[[], datetime] = now or (lambda: datetime.now(UTC))
        self.rows: dict[str, Row] = {}
        self._unflushed: list[str] = []  # ids added, not yet flushed
        self.edges: set[tuple[str, str]] = set()  # job_deps: (dep, job)
        self.handlers: dict[str, HandlerRecord] = {}  # type -> its live version
        self.pauses: set[str] = set()  # stored types and tenants (0015)
        self.key_turns: dict[str, str] = {}  # type -> the last key a keyed claim visited
        self.cancel_notes: list[tuple[str, str]] = []  # qd_cancel: (sysid, job id)
        self.cancel_listeners: list[Callable[[str, str], None]] = []
        self.archived: dict[str, int] = {}  # type -> jobs ever archived (0006)
        self.fail: dict[str, int] = {}  # method -> failures still to raise
        self.calls: dict[str, int] = {}
        self.on_resolved: Callable[[Resolution], None] | None = None
        self.secret = secrets.token_bytes(32)
        self._versions = itertools.count(1)

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.fail.get(name, 0) > 0:
            self.fail[name] -= 1
            raise StoreUnavailable(f"{name}: injected")

    def _due(self, row: Row, now: datetime) -> bool:
        return row.lock == "" and row.dt <= now

    def _claimable(self, type: str, now: datetime, limit: int) -> list[Row]:
        """``queries.queue.CLAIMABLE``: up to ``limit`` eligible jobs, deadline not
        passed, the higher priority first, then the oldest dt; none while the type
        is paused; in a type whose handler sets keyConcurrency, ``qd_claim_keyed``."""
        if self._paused(type) or limit < 1:
            return []
        handler = self._live_handler(type)
        cap = None if handler is None else handler.data.get("keyConcurrency")
        due = [r for r in self.rows.values() if r.type == type and self._due(r, now)]
        if cap is None:
            return sorted((r for r in due if _in_time(r, now)), key=_pick_order)[:limit]
        return sorted(self._keyed(type, due, int(str(cap)), limit, now), key=_pick_order)

    def _keyed(self, type: str, due: list[Row], cap: int, limit: int, now: datetime) -> list[Row]:
        """``qd_claim_keyed`` (migration 0020), its cursor kept in ``key_turns``."""
        running = Counter(r.key for r in self.rows.values() if r.type == type and r.running)
        keys = sorted({r.key for r in due if r.key is not None}, key=_utf8)
        start = self.key_turns.pop(type, "")
        turn = [k for k in keys if _utf8(k) > _utf8(start)] + [
            k for k in keys if _utf8(k) <= _utf8(start)
        ]
        taken: list[Row] = []
        for key in turn[:MAX_KEY_STEPS]:
            if len(taken) >= limit:
                break
            self.key_turns[type] = key
            room = min(cap - running[key], limit - len(taken))
            if room > 0:
                mine = [r for r in due if r.key == key and _in_time(r, now)]
                taken += sorted(mine, key=_pick_order)[:room]
        if len(taken) < limit:
            oldest = sorted(due, key=lambda r: (r.dt, r.id))[:1000]
            free = [r for r in oldest if r.key is None and _in_time(r, now)]
            taken += sorted(free, key=_pick_order)[: limit - len(taken)]
        return taken

    def _live_handler(self, type: str) -> HandlerRecord | None:
        return self.handlers.get(type)

    def _paused(self, type: str) -> bool:
        """``queries.queue.NOT_PAUSED`` does not hold."""
        return type in self.pauses or client_of(type) in self.pauses

    def _run_here(self, type: str) -> bool:
        handler = self.handlers.get(type)
        return handler is not None and handler.data.get("lang") != "worker"

    def _handler_id(self) -> str:
        return f"h{next(self._versions):016x}"

    def _archive(
        self,
        row: Row,
        now: datetime,
        code: str | None,
        exitcode: int | None,
        result: str | None,
        *,
        counted: bool = True,
    ) -> None:
        """Done: lock '__done', dt now + 1000 years; counted as archived (0006)
        when an update moved it there (an insert of a done row is not)."""
        row.lock, row.done_dt, row.dt = DONE, now, later(now)
        row.code, row.exitcode, row.result = code, exitcode, result
        if counted:
            self.archived[row.type] = self.archived.get(row.type, 0) + 1

    def resolve(self, ids: list[str]) -> Resolution:
        """``queries.graph.RESOLVE``, and again for the failed ones with dependents."""
        now = self.now()
        done = [
            self.rows[i]
            for i in dict.fromkeys(ids)
            if i in self.rows and self.rows[i].lock == DONE and self.rows[i].dependents
        ]
        for row in done:
            row.dependents = False
        if not done:
            return Resolution([], [])

        def open_all_completed(job: str) -> bool:
            j = self.rows.get(job)
            return j is not None and not j.resolve_any and j.lock == "" and (j.deps or 0) > 0

        doomed: dict[str, str] = {}  # job -> the failed dependency it fails for (least id)
        frontier = [
            (e_job, d.id)
            for d in done
            if d.code != "ok"
            for (dep, e_job) in self.edges
            if dep == d.id
        ]
        while frontier:
            step: list[tuple[str, str]] = []
            for job, root in frontier:
                if not open_all_completed(job):
                    continue
                if job not in doomed or root < doomed[job]:
                    doomed[job] = root
                    step += [(nxt, root) for (dep, nxt) in self.edges if dep == job]
            frontier = step
        failed: list[Row] = []
        for job, root in sorted(doomed.items()):
            row = self.rows[job]
            self._archive(row, now, "failed", 424, f"dependency {root} did not complete")
            row.deps = 0
            failed.append(row)
        ended = {r.id for r in done} | {r.id for r in failed}
        gone = [(dep, job) for (dep, job) in self.edges if dep in ended]
        self.edges.difference_update(gone)
        counted: dict[str, int] = {}
        for _, job in gone:
            if job not in doomed:
                counted[job] = counted.get(job, 0) + 1
        freed: list[tuple[str, str]] = []
        for job, n in counted.items():
            waiting = self.rows.get(job)
            if waiting is None or waiting.lock != "" or (waiting.deps or 0) <= 0:
                continue
            waiting.deps = (waiting.deps or 0) - n
            if waiting.deps <= 0:
                waiting.dt = max(waiting.deps_dt or now, now)
                freed.append((waiting.id, waiting.type))
        resolution = Resolution(freed, [(r.id, r.type) for r in failed])
        self._told(resolution)
        again = [r.id for r in failed if r.dependents]
        if again:
            more = self.resolve(again)
            resolution = Resolution(freed + more.freed, resolution.failed + more.failed)
        return resolution

    def _told(self, resolution: Resolution) -> None:
        if self.on_resolved is not None and (resolution.freed or resolution.failed):
            self.on_resolved(resolution)

    # --- helpers for tests -------------------------------------------------------------

    def add(self, type: str, *payloads: str, prefix: str = "j", ago: float = 0.0) -> list[str]:
        """Jobs due now (created ``ago`` seconds ago), straight into the store."""
        at = self.now() - timedelta(seconds=ago)
        ids = []
        for payload in payloads:
            job_id = f"{prefix}{len(self.rows)}"
            self.rows[job_id] = Row(job_id, type, at, payload, at)
            ids.append(job_id)
        return ids

    def set_handler(self, type: str, body: str, **fields: object) -> HandlerRecord:
        record = HandlerRecord(
            id=self._handler_id(),
            type=type,
            dt=self.now(),
            data={"lang": "python", "body": body, **fields},
        )
        self.handlers[type] = record
        return record

    def done(self) -> list[Row]:
        return [r for r in self.rows.values() if r.lock == DONE]
