"""Renewing the leases of the jobs this daemon runs, at a third of their length,
so that no other daemon takes them over while they run (River's job_rescuer's
other half: a lease kept alive is never rescued)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from queue_daemon.settings import DEFAULTS
from queue_daemon.store.ports import JobQueue


@dataclass(frozen=True, slots=True, kw_only=True)
class RenewSettings:
    lease: float = DEFAULTS.lease  # seconds a claim holds its jobs from the last renewal

    @property
    def every(self) -> float:
        return self.lease / 3


class Renew:
    """Renews the leases of the jobs ``running`` names."""

    name = "renew"

    def __init__(
        self,
        *,
        store: JobQueue,
        sysid: str,
        running: Callable[[], Collection[str]],
        settings: RenewSettings,
    ) -> None:
        self._store = store
        self._sysid = sysid
        self._running = running
        self._lease = settings.lease
        self.every = self.first = settings.every

    async def step(self) -> None:
        ids = list(self._running())
        if ids:
            await self._store.renew(ids, sysid=self._sysid, lease=self._lease)
