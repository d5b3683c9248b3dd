"""Jobs of pulled types, as the tenants' own workers hold them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from queue_daemon.domain.jobs import NewJob


@dataclass(slots=True, kw_only=True)  # made per job: not frozen (runners.models)
class PulledJob:
    """A job a tenant's worker now holds (``lock = 'w:<claim>:<worker>'``)."""

    id: str
    type: str  # stored jobtype, "client-type"
    data: str
    attempts: int  # including this run
    create_dt: datetime
    lease_until: datetime
    due_ms: int | None = None  # as ClaimedJob's, for the queue log
    key: str | None = None  # its concurrency key
    trace: str | None = None  # its add's span, a W3C traceparent (observe.tracing)


class HeldJob(NamedTuple):
    """A job the complete's claim still holds, locked until the complete commits."""

    id: str
    type: str  # stored jobtype, "client-type"
    attempts: int
    create_dt: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class OptedJobs:
    """Jobs of one add that asked for dependencies, a deadline, a priority or a key."""

    jobs: list[NewJob]
    after: list[str]  # ids of the jobs they wait for
    resolve_any: bool = False  # all-resolved: any outcome of a dependency counts
    deadline: datetime | None = None
    priority: int = 0
    key: str | None = None
    trace: str | None = None  # the add's span, a W3C traceparent (observe.tracing)
