"""Plain data the store hands out and takes in."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple


class JobState(enum.StrEnum):
    BLOCKED = "blocked"  # waits for other jobs (dt 'infinity')
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


class NewJob(NamedTuple):
    """One job to insert: what the ingester read from the journal.

    A NamedTuple rather than a dataclass: the ingester builds 100k of these a
    second and the store hands them to COPY as rows without conversion (the
    field order is the COPY column order).
    """

    id: str
    type: str  # stored jobtype, "client-type"
    dt: datetime  # first eligible time (aware, UTC)
    data: str  # the payload line
    create_dt: datetime  # when the daemon acknowledged it (aware, UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A job as stored, seen by its tenant (``type`` without the client prefix)."""

    id: str
    type: str
    state: JobState
    dt: datetime
    create_dt: datetime
    done_dt: datetime | None
    attempts: int
    code: str | None
    exitcode: int | None
    result: str | None
    data: str
    # its finished runs, oldest first (only ``get_job`` reads them; None elsewhere):
    # {"started", "ended" (epoch ms), "by", "exitcode", "code", "reason"}
    runs: list[dict[str, object]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPage:
    jobs: list[Job]
    next: str | None  # opaque cursor for the following page, None at the end


@dataclass(frozen=True, slots=True, kw_only=True)
class TypeStats:
    waiting: int = 0
    scheduled: int = 0
    blocked: int = 0  # waiting for other jobs
    running: int = 0
    done_ok: int = 0
    done_failed: int = 0
    done_error: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenant:
    client: str
    token_hash: bytes  # of its newest token
    created_at: datetime
    revoked_at: datetime | None
    live_tokens: int = 0  # tokens that work now (0 once revoked; 2 during a rotation's grace)
    grace_until: datetime | None = None  # the soonest end of a live token's grace period
    limits: dict[str, float] = field(default_factory=dict)  # overrides of the daemon defaults


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedJob:
    """A job this daemon now owns (``lock = sysid``)."""

    id: str
    type: str  # stored jobtype, "client-type"
    data: str
    attempts: int  # including this run
    create_dt: datetime
    # epoch ms since when it was due, max(create_dt, dt before the claim); for the queue log
    due_ms: int | None = None
    # the type's live handler version when it was claimed (None: it had none)
    handler: str | None = None
    deadline: datetime | None = None  # it ends (408) if not done by then


@dataclass(frozen=True, slots=True, kw_only=True)
class UnhandledRound:
    """A round of the sweep of types no daemon runs."""

    expired: list[tuple[str, bool]]  # (stored type, pulled) with jobs past their time
    next_after: str | None  # the type the next round goes on after; None: from the start


class ExpiredLock(NamedTuple):
    """A running job whose lock ran out: eligible again, or done (error) when
    that was its last attempt."""

    id: str
    type: str  # stored jobtype, "client-type"
    attempts: int
    ended: bool = False  # done: every attempt's lease ran out


class ReleaseHow(enum.StrEnum):
    RETRY = "retry"  # eligible again after ``delay`` seconds
    UNGET = "unget"  # eligible again at once
    ARCHIVE = "archive"  # done: lock '__done', dt = done_dt + 1000 years


@dataclass(frozen=True, slots=True, kw_only=True)
class Release:
    """The end of one run of one job, written by ``Store.release``."""

    id: str
    how: ReleaseHow
    code: str | None = None  # ok | failed | retry | error (None keeps the previous)
    exitcode: int | None = None
    result: str | None = None
    delay: float = 0.0  # seconds, for RETRY
    refund_attempt: bool = False  # the run did not count (e.g. no handler, daemon shutdown)


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerRecord:
    """A stored handler version. ``data`` holds the JSON fields of docs/api.md."""

    id: str  # version id, unique
    type: str  # stored jobtype, "client-type"
    dt: datetime
    data: dict[str, object]  # lang, body, before, beforeEach, afterEach, eid, timeout, then, ...


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDepth:
    """One stored jobtype's counts, for the dashboard."""

    type: str  # stored jobtype, "client-type"
    waiting: int = 0
    scheduled: int = 0
    blocked: int = 0
    capped: bool = False  # waiting or scheduled reached the cap: there are more
    running: int = 0
    done_ok: int = 0
    done_failed: int = 0
    done_error: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningJob:
    id: str
    type: str  # stored jobtype, "client-type"
    sysid: str  # the daemon running it, or "worker:<name>" for a pull worker's claim
    attempts: int
    create_dt: datetime
    lease_until: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningJobs:
    total: int  # running now, all of them
    oldest: list[RunningJob]  # the oldest few, by creation


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedJob:
    """An archived job whose code is failed or error; ``result`` may be cut."""

    id: str
    type: str  # stored jobtype, "client-type"
    code: str
    exitcode: int | None
    attempts: int
    create_dt: datetime
    done_dt: datetime
    result: str | None
    result_cut: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonLease:
    """A sysid's lease: a live daemon renews it every third of its --lease."""

    sysid: str
    host: str | None
    data_dir: str | None
    state: str  # live | expired | released
    expires: datetime | None
    released_at: datetime | None
    now: datetime  # the database clock, to compare ``expires`` with


@dataclass(frozen=True, slots=True, kw_only=True)
class PulledJob:
    """A job a tenant's worker now holds (``lock = 'w:<claim>:<worker>'``)."""

    id: str
    type: str  # stored jobtype, "client-type"
    data: str
    attempts: int  # including this run
    create_dt: datetime
    lease_until: datetime
    due_ms: int | None = None  # as ClaimedJob's, for the queue log


class HeldJob(NamedTuple):
    """A job the complete's claim still holds, locked until the complete commits."""

    id: str
    type: str  # stored jobtype, "client-type"
    attempts: int
    create_dt: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSeen:
    """A pull worker as the registry knows it."""

    client: str
    name: str
    first_seen: datetime
    last_seen: datetime
    live: bool  # seen within the lease it holds jobs under
    holding: int  # jobs it holds now
    done_ok: int
    done_failed: int
    done_error: int
    done_retry: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonSeen:
    sysid: str
    host: str | None
    state: str  # live | expired | released
    expires: datetime | None
    released_at: datetime | None
    running: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OptedJobs:
    """Jobs of one add that asked for dependencies or a deadline."""

    jobs: list[NewJob]
    after: list[str]  # ids of the jobs they wait for
    resolve_any: bool = False  # all-resolved: any outcome of a dependency counts
    deadline: datetime | None = None


@dataclass(frozen=True, slots=True)
class Resolution:
    """What resolving done jobs' dependents changed: (id, stored type) of the
    dependents now due, and of those failed (424) because a dependency failed."""

    freed: list[tuple[str, str]]
    failed: list[tuple[str, str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A tenant's periodic job: a job of ``type`` with ``payload`` at each tick of
    ``cron`` in time zone ``tz``."""

    client: str
    name: str
    type: str  # the tenant's type name, without the client
    cron: str
    tz: str
    payload: str
    version: str  # new whenever the schedule is replaced
    created_at: datetime
    next_fire: datetime  # the next tick not yet added
    last_tick: datetime | None = None
    last_job: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DueSchedule:
    """A schedule a daemon took to add its due tick: the latest tick at or before
    ``firing_at`` (and not before ``next_fire``)."""

    client: str
    name: str
    type: str
    cron: str
    tz: str
    payload: str
    version: str
    next_fire: datetime
    firing_at: datetime  # the database clock when a daemon first took it for this tick
    now: datetime  # the database clock when this daemon took it
    revoked: bool = False  # its tenant is revoked


class TickAdded(NamedTuple):
    """A tick a daemon added: the schedule's next tick after it."""

    client: str
    name: str
    version: str
    tick: datetime
    next_fire: datetime
    job: str
