"""The busy marks as a periodic service: every quarter second, the tenants that
ran more contexts at once than their share of the cores are told to the runner
pool, which puts their handlers behind the others' on the CPU
(``engine.run.fairness.BusyMarks``, ``runners.sandbox.cpushare``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from queue_daemon.engine.run.batch import Runners
from queue_daemon.engine.run.fairness import BusyMarks, TenantBatches


@dataclass(frozen=True, slots=True, kw_only=True)
class BusySettings:
    every: float = 0.25


def cores() -> int:
    """The cores this daemon may run on."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    return len(affinity(0)) if affinity else os.cpu_count() or 1


class BusyMarking:
    name = "busy-marks"

    def __init__(self, *, pool: Runners, tenants: TenantBatches, settings: BusySettings) -> None:
        self._pool = pool
        self._tenants = tenants
        self._marks = BusyMarks(cores(), pool.busy_remark_s)
        self.every = self.first = settings.every

    async def step(self) -> None:
        busy = self._marks.check(self._tenants.take_peak(), time.monotonic())
        if busy is not None:
            await self._pool.mark_busy(busy)
