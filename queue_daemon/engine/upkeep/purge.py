"""Purging done jobs past their retention, and forgetting pull workers that
have not been seen for as long."""

from __future__ import annotations

from dataclasses import dataclass

from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.settings import DEFAULTS
from queue_daemon.store.ports import JobQueue


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeSettings:
    retention: float = DEFAULTS.retention  # seconds a done job is kept
    every: float = 600.0


class Purge:
    name = "purge"

    def __init__(self, *, store: JobQueue, queuelog: QueueLog, settings: PurgeSettings) -> None:
        self._store = store
        self._queuelog = queuelog
        self._retention = settings.retention
        self.every = self.first = settings.every

    async def step(self) -> None:
        purged = await self._store.purge(self._retention)
        if purged:
            self._queuelog.purged(purged)
        await self._store.forget_workers()
