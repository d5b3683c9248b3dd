"""Unlocking jobs whose lease ran out, on any daemon (one that died or stalled):
they wait again, or end (error, 500) when that was their last attempt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.settings import DEFAULTS
from queue_daemon.store.ports import JobQueue

LEASE_EXPIRED_EXIT = 500  # store.queries.queue's: every run's lease ran out


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireSettings:
    lease: float = DEFAULTS.lease

    @property
    def every(self) -> float:
        """Every few seconds, or a quarter of the lease when that is shorter."""
        return min(5.0, self.lease / 4)


class Expire:
    """Unlocks the jobs whose lease ran out; ``on_waiting`` is told when some
    wait again (the run loop and held claims look for them)."""

    name = "expire"

    def __init__(
        self,
        *,
        store: JobQueue,
        queuelog: QueueLog,
        metrics: Metrics,
        on_waiting: Callable[[], None],
        settings: ExpireSettings,
    ) -> None:
        self._store = store
        self._queuelog = queuelog
        self._metrics = metrics
        self._on_waiting = on_waiting
        self.every = self.first = settings.every

    async def step(self) -> None:
        expired = await self._store.expire_locks()
        again = [lock for lock in expired if not lock.ended]
        if again:
            self._queuelog.expired(again)
        ended: dict[str, list[Release]] = {}
        for lock in expired:
            if lock.ended:
                ended.setdefault(lock.type, []).append(
                    Release(
                        id=lock.id,
                        how=ReleaseHow.ARCHIVE,
                        code="error",
                        exitcode=LEASE_EXPIRED_EXIT,
                    )
                )
        for jobtype, releases in ended.items():
            attempts = {lock.id: lock.attempts for lock in expired}
            self._queuelog.finished(jobtype, releases, attempts=attempts)
            self._metrics.finished(jobtype, releases)
        if again:
            self._on_waiting()
