"""Dispatch at ingest: of a fresh add or batch being ingested, the jobs an idle
daemon runs at once, stored already claimed by it (``engine.ingest.early``), so
their run waits for no notification and no claim. Part of the run loop's
bookkeeping (``engine.run.loop.RunLoop`` is one of these): the slots, batches
and claims it counts are the run loop's own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from queue_daemon.domain.jobs import ClaimedJob, Dispatch, NewJob
from queue_daemon.domain.names import JobType
from queue_daemon.engine.handlers import PULLED_LANG, HandlerCache
from queue_daemon.engine.run.fairness import TenantBatches
from queue_daemon.engine.run.pick import WaitingTypes
from queue_daemon.engine.run.sizes import BatchSizes
from queue_daemon.observe.metrics import Metrics
from queue_daemon.scheduler import Scheduler

if TYPE_CHECKING:
    from queue_daemon.engine.run.loop import RunSettings


class IngestDispatch:
    """The run loop's dispatch at add and at ingest (engine.ingest.early.Dispatcher)."""

    # the run loop's, set by its __init__
    _stopping: bool
    _waiting: WaitingTypes
    _claiming: int
    _batches: dict[asyncio.Task[None], list[ClaimedJob]]
    _settings: RunSettings
    _handlers: HandlerCache
    _tenants: TenantBatches
    _sizes: BatchSizes
    _scheduler: Scheduler
    _sysid: str
    _metrics: Metrics
    _running: dict[str, ClaimedJob]
    # dispatches the ingester is storing: their holds, and when they must start by
    _dispatches: dict[int, tuple[list[tuple[str, int]], float]]

    def _hold(self, jobtype: str, limit: int) -> None: ...
    def _let_go(self, jobtype: str, slots: int, *, all_of_it: bool) -> None: ...
    def _start(self, jobtype: str, jobs: list[ClaimedJob], start_by: float) -> None: ...

    def take(self, jobs: Sequence[NewJob]) -> Dispatch | None:
        """Of a fresh add or batch being ingested, the jobs this daemon runs at once, their
        slots held: the ingester stores them claimed (``dispatched`` then starts
        them), so their run waits for no notification and no claim. Only while
        nothing else waits here (no turn of another tenant or type is taken), for
        jobs due now of types whose handler (not a pull worker's) is in the cache,
        as many as the next batch of their type and the free slots allow."""
        if (
            self._stopping
            or self._waiting.counts
            or self._claiming
            or len(self._batches) >= self._settings.max_parallel_batches
        ):
            return None
        now = datetime.now(UTC)
        groups: dict[str, list[str]] = {}
        for job in jobs:
            if job.dt <= now:
                groups.setdefault(job.type, []).append(job.id)
        holds: list[tuple[str, int]] = []
        taken: list[str] = []
        for jobtype, ids in groups.items():
            spec = self._handlers.cached(jobtype)
            tenant = JobType.client_of(jobtype)
            if (
                spec is None
                or spec.lang == PULLED_LANG
                or tenant in self._tenants.full()  # (each hold counts a batch)
                or len(self._batches) + len(holds) >= self._settings.max_parallel_batches
                or not self._sizes.may_claim(jobtype)
            ):
                continue
            free = self._scheduler.free_for(tenant)
            if free <= 0:
                continue
            limit = min(len(ids), free, self._sizes.size(jobtype))
            self._hold(jobtype, limit)
            holds.append((jobtype, limit))
            taken += ids[:limit]
        if not holds:
            return None
        dispatch = Dispatch(ids=frozenset(taken), sysid=self._sysid, lease=self._settings.lease)
        self._dispatches[id(dispatch)] = (holds, time.monotonic() + self._settings.lease)
        return dispatch

    def dispatched(self, dispatch: Dispatch, claimed: Sequence[ClaimedJob]) -> None:
        """The jobs of ``dispatch`` stored ``claimed`` by this daemon (none when the
        insert failed or the sysid could not claim): run them, let the rest go."""
        holds, start_by = self._dispatches.pop(id(dispatch))
        by_type: dict[str, list[ClaimedJob]] = {}
        for job in claimed:
            by_type.setdefault(job.type, []).append(job)
        for jobtype, limit in holds:
            jobs = by_type.get(jobtype, [])
            self._let_go(jobtype, limit - len(jobs), all_of_it=not jobs)
            if jobs:
                self._metrics.dispatched(jobtype, len(jobs))
                self._start(jobtype, jobs, start_by)

    def still_running(self, ids: Collection[str]) -> Dispatch | None:
        """Of ``ids``, the jobs this daemon runs now, to be stored claimed by it
        again after a store crash took their rows (None: none of them)."""
        mine = frozenset(job_id for job_id in ids if job_id in self._running)
        if not mine:
            return None
        return Dispatch(ids=mine, sysid=self._sysid, lease=self._settings.lease, running=True)
