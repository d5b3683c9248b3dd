"""What the operators' and tenants' reads see of the queue: counts, running and
failed jobs, daemons and workers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


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
class Paused:
    """What of one tenant is paused: the whole tenant (by the operator), and
    its types (by the tenant, without the client prefix)."""

    tenant: bool = False
    types: frozenset[str] = frozenset()

    def type_paused(self, type: str) -> bool:
        return self.tenant or type in self.types


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
    paused: bool = False  # the type, or its whole tenant (migration 0015)


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
