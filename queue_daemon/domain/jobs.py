"""A job through its life: as added, stored, claimed, released and resolved."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple, Protocol


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


_GENERATED = frozenset("0123456789abcdef")


def added_once(job_id: str) -> bool:
    """Whether one add alone can journal ``job_id``: an id a daemon made for it
    (hex digits first: ``engine.admit.ids.IdGenerator``), not one derived from
    an Idempotency-Key (``i…``) or a schedule's tick (``s…``), which every add
    of that key or tick journals again, on any daemon."""
    return job_id[:1] in _GENERATED


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
    priority: int = 0  # among due jobs of its type, a higher one runs first
    key: str | None = None  # its concurrency key
    # the last progress reported: {"fraction", "message", "at"} (None: none)
    progress: dict[str, object] | None = None
    # its last run's log lines (only ``get_job`` reads them; None elsewhere, and
    # for a run that printed none)
    log: str | None = None
    # its finished runs, oldest first (only ``get_job`` reads them; None elsewhere):
    # {"started", "ended" (epoch ms), "by", "exitcode", "code", "reason"}
    runs: list[dict[str, object]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPage:
    jobs: list[Job]
    next: str | None  # opaque cursor for the following page, None at the end


class Attempt(Protocol):
    """What an outcome needs of a job that ran: a claimed job (``ClaimedJob``) or
    one a pull worker completes (``HeldJob``)."""

    @property
    def id(self) -> str: ...

    @property
    def attempts(self) -> int: ...  # including this run

    @property
    def create_dt(self) -> datetime: ...


class Started(Attempt, Protocol):
    """What the queue log needs of a job that starts a run: one the daemon
    claimed (``ClaimedJob``) or one a pull worker claimed (``PulledJob``)."""

    @property
    def due_ms(self) -> int | None: ...  # epoch ms since when it was due, if known


@dataclass(slots=True, kw_only=True)  # made per job: not frozen (runners.models)
class ClaimedJob:
    """A job this daemon now owns (``lock = sysid``)."""

    id: str
    type: str  # stored jobtype, "client-type"
    data: str
    attempts: int  # including this run
    # when it was added, in epoch ms (``create_dt`` as a datetime): a claim of
    # 1,000 jobs decoded as many timestamps, 8% of the daemon's time
    created_ms: int
    # epoch ms since when it was due, max(create_dt, dt before the claim); for the queue log
    due_ms: int | None = None
    # the type's live handler version when it was claimed (None: it had none)
    handler: str | None = None
    deadline: datetime | None = None  # it ends (408) if not done by then
    key: str | None = None  # its concurrency key (docs/api.md, "Concurrency keys")
    trace: str | None = None  # its add's span, a W3C traceparent (observe.tracing)

    @property
    def create_dt(self) -> datetime:
        return datetime.fromtimestamp(self.created_ms / 1000, UTC)


class Progress(NamedTuple):
    """A running job's progress as its holder (``lock``) reported it."""

    id: str
    lock: str
    fraction: float  # 0 to 1
    message: str


def epoch_ms(moment: datetime) -> int:
    """``moment`` in whole milliseconds since the epoch (as ``ClaimedJob.created_ms``)."""
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """Jobs of a fresh batch that the daemon ingesting it runs at once: stored
    already claimed by it (``sysid``, for ``lease`` seconds), with neither a
    notification nor a claim between their add and their run."""

    ids: frozenset[str]
    sysid: str
    lease: float
    # jobs the daemon runs already, stored again after a store crash took their
    # rows: claimed by it even when their type was paused since
    running: bool = False


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


@dataclass(slots=True, kw_only=True)  # made per job: not frozen (runners.models)
class Release:
    """The end of one run of one job, written by ``Store.release``."""

    id: str
    how: ReleaseHow
    code: str | None = None  # ok | failed | retry | error (None keeps the previous)
    exitcode: int | None = None
    result: str | None = None
    delay: float = 0.0  # seconds, for RETRY
    refund_attempt: bool = False  # the run did not count (e.g. no handler, daemon shutdown)
    log: str | None = None  # the run's last log lines (``log_excerpt``), kept with the job


@dataclass(frozen=True, slots=True)
class Resolution:
    """What resolving done jobs' dependents changed: (id, stored type) of the
    dependents now due, and of those failed (424) because a dependency failed."""

    freed: list[tuple[str, str]]
    failed: list[tuple[str, str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class UnhandledRound:
    """A round of the sweep of types no daemon runs."""

    expired: list[tuple[str, bool]]  # (stored type, pulled) with jobs past their time
    next_after: str | None  # the type the next round goes on after; None: from the start
