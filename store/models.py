"""Plain data the store hands out and takes in."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


class JobState(enum.StrEnum):
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


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPage:
    jobs: list[Job]
    next: str | None  # opaque cursor for the following page, None at the end


@dataclass(frozen=True, slots=True, kw_only=True)
class TypeStats:
    waiting: int = 0
    scheduled: int = 0
    running: int = 0
    done_ok: int = 0
    done_failed: int = 0
    done_error: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenant:
    client: str
    token_hash: bytes
    created_at: datetime
    revoked_at: datetime | None
