"""Periodic jobs: schedules, their due ticks, and what adding a tick did."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


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
