"""The ticker: adds the due ticks of the tenants' schedules (periodic jobs).

Every daemon runs it; the store makes each tick one job however many do:

- A daemon takes due schedules from the store for ``HOLD_S`` seconds (``FOR
  UPDATE SKIP LOCKED``, then a hold in the row), so normally one daemon adds a
  tick. The tick it adds is the latest at or before the moment the row was
  first taken (the database's clock, kept in the row): after an outage that is
  the latest missed tick, added once, with the ones before it skipped.
- The job's id is derived from the tenant, the schedule's name and version and
  the tick (``engine.admit.ids.tick_id``), and the job goes through the ordinary
  intake (journal, then ingestion). A daemon that dies after journaling the
  job, before recording the tick, leaves the row to be taken over when the
  hold ends: the next daemon journals the same id, and ingestion, idempotent
  by id, keeps one job.
- A tick over its tenant's add rate or waiting limit (or that the journal
  cannot take) is not lost: the row is given back, due again in ``DEFER_S``
  seconds, for the same tick (by any daemon). Ticks that pass meanwhile are
  skipped like those of an outage.

The loop wakes when the soonest schedule is due, at least every ``POLL_S``
seconds (schedules added or replaced on other daemons are seen then), and at
once when one is added here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from cronsim import CronSimError

from queue_daemon.domain.jobs import epoch_ms
from queue_daemon.domain.names import JobType
from queue_daemon.domain.schedules import DueSchedule, TickAdded
from queue_daemon.engine.admit.adds import AddRefused, Adds, NeverFits, OverRate
from queue_daemon.engine.admit.ids import tick_id
from queue_daemon.engine.backoff import Backoff
from queue_daemon.engine.schedule.cron import Cron, CronError, zone
from queue_daemon.journal import JournalError
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import ScheduleStore

logger = logging.getLogger(__name__)

MAX_SCHEDULES = 1000  # per tenant
POLL_S = 1.0  # the longest the ticker sleeps: how soon it sees other daemons' changes
HOLD_S = 10.0  # a daemon's hold on a due schedule; then another may take it over
DEFER_S = 1.0  # a tick that could not be added now is tried again after this
# a revoked tenant's schedule, or a stored expression that no longer parses, is
# looked at again after this
BROKEN_S = 60.0
BATCH = 100  # schedules taken at once
MIN_WAIT_S = 0.01  # a row due but locked by another daemon's claim: look again soon
NEVER = timedelta(days=365 * 50)  # the next tick of an expression that fires no more


@dataclass(frozen=True, slots=True)
class PlannedTick:
    """A tick to add: its job's id, and the schedule's next tick after it."""

    due: DueSchedule
    job: str
    tick: datetime
    next_fire: datetime
    catchup: bool


def plan_tick(due: DueSchedule) -> PlannedTick:
    """The tick to add for a schedule taken: the latest at or before ``firing_at``
    (never before ``next_fire``), and the first after it and after now.
    CronError, or cronsim's, when the stored expression does not parse."""
    cron = Cron(due.cron, zone(due.tz))
    latest = cron.latest(due.firing_at)
    tick = latest if latest is not None and latest > due.next_fire else due.next_fire
    try:
        next_fire = cron.after(max(tick, due.now))[0]
    except StopIteration:
        next_fire = due.now + NEVER
    job = tick_id(due.client, due.name, due.version, epoch_ms(tick))
    return PlannedTick(due, job, tick, next_fire, catchup=tick > due.next_fire)


class Ticker:
    def __init__(
        self,
        *,
        store: ScheduleStore,
        adds: Adds,
        queuelog: QueueLog,
        metrics: Metrics,
        sysid: str,
        poll: float = POLL_S,
        hold: float = HOLD_S,
    ) -> None:
        self._store = store
        self._adds = adds
        self._queuelog = queuelog
        self._metrics = metrics
        self._sysid = sysid
        self._poll = poll
        self._hold = hold
        self._wake = asyncio.Event()

    def changed(self) -> None:
        """A schedule was added or replaced here: look at the store now."""
        self._wake.set()

    async def run(self) -> None:
        """Add due ticks until cancelled."""
        backoff = Backoff(0.1, 5.0, jitter=True)
        while True:
            self._wake.clear()
            try:
                wait = await self.step()
            except StoreError as exc:
                logger.warning("schedules: %s", exc, extra={"action": "schedules_failed"})
                wait = backoff.next()
            else:
                backoff.reset()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)

    async def step(self) -> float:
        """Add the ticks due now; return the seconds until the next is due (0: at once).

        While nothing is due this costs one indexed read of the soonest due time."""
        seconds = await self._store.next_schedule_due()
        if seconds is None:
            return self._poll
        if seconds > 0:
            return min(self._poll, seconds)
        due = await self._store.claim_schedules(sysid=self._sysid, limit=BATCH, hold=self._hold)
        if not due:
            return MIN_WAIT_S  # due, but being taken by another daemon at this moment
        await self._add(due)
        return 0.0

    async def _add(self, due: list[DueSchedule]) -> None:
        held_back: list[DueSchedule] = []  # revoked tenants', or unreadable
        deferred: list[DueSchedule] = []
        groups: dict[JobType, list[PlannedTick]] = {}
        for schedule in due:
            if schedule.revoked:
                held_back.append(schedule)  # looked at again later: the tenant may come back
                continue
            try:
                tick = plan_tick(schedule)
            except (CronError, CronSimError) as exc:
                logger.error(
                    "schedule %s of %s cannot be evaluated: %s",
                    schedule.name,
                    schedule.client,
                    exc,
                    extra={"action": "schedule_broken", "tenant": schedule.client},
                )
                held_back.append(schedule)
                continue
            reason = await self._admit(schedule)
            if reason is not None:
                self._metrics.ticks_deferred(schedule.client, reason, 1)
                deferred.append(schedule)
                continue
            groups.setdefault(JobType(schedule.client, schedule.type), []).append(tick)
        added: list[TickAdded] = []
        for jobtype, ticks in groups.items():
            try:
                await self._adds.write(
                    jobtype, [t.due.payload for t in ticks], ids=[t.job for t in ticks]
                )
            except (JournalError, ValueError) as exc:
                logger.warning(
                    "schedule ticks of %s not added: %s",
                    jobtype,
                    exc,
                    extra={"action": "schedule_tick_failed", "tenant": jobtype.client},
                )
                self._metrics.ticks_deferred(jobtype.client, "journal", len(ticks))
                deferred += [t.due for t in ticks]
                continue
            for t in ticks:
                self._queuelog.tick(
                    jobtype.stored, t.job, t.due.name, epoch_ms(t.tick), catchup=t.catchup
                )
                self._metrics.ticks(jobtype.client, 1, catchup=t.catchup)
                added.append(
                    TickAdded(t.due.client, t.due.name, t.due.version, t.tick, t.next_fire, t.job)
                )
        await self._store.record_ticks(added, sysid=self._sysid)
        await self._store.defer_ticks(deferred, sysid=self._sysid, delay=DEFER_S)
        await self._store.defer_ticks(held_back, sysid=self._sysid, delay=BROKEN_S)

    async def _admit(self, schedule: DueSchedule) -> str | None:
        """None when the tick fits its tenant's add rate and waiting limit (and is
        counted against them), else which it is over."""
        payload = schedule.payload
        try:
            await self._adds.admit(schedule.client, 1, len(payload.encode()))
        except NeverFits as exc:
            return exc.quota
        except OverRate:
            return "rate"
        except AddRefused:
            return "waiting"
        return None
