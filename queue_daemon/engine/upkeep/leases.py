"""The worker's upkeep of the store: renew the leases of the jobs this daemon
runs, unlock jobs whose lease ran out anywhere, archive jobs that waited for a
handler past their time, and purge archived jobs past their retention."""

from __future__ import annotations

from collections.abc import Sequence

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.domain.names import JobType
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.store.ports import JobQueue

NO_HANDLER_RESULT = "no handler for this type before the job's time ran out"
LEASE_EXPIRED_EXIT = 500  # store.queries.queue's: every run's lease ran out
NO_WORKER_RESULT = "no worker claimed this job before its time ran out"
# The types no daemon runs are swept a slice at a time: 5,000 waiting types a
# round (about 20 ms of the store's time), a round every 5 s: 100,000 idle types
# are all looked at every 100 s, at a steady cost instead of in one burst.
UNHANDLED_ROUND_S = 5.0
UNHANDLED_STEPS = 5_000


class Upkeep:
    def __init__(
        self,
        *,
        store: JobQueue,
        queuelog: QueueLog,
        metrics: Metrics,
        sysid: str,
        lease: float,
        job_ttl: float,
        retention: float,
    ) -> None:
        self._store = store
        self._queuelog = queuelog
        self._metrics = metrics
        self._sysid = sysid
        self._lease = lease
        self._job_ttl = job_ttl
        self._retention = retention
        self._unhandled_after = ""  # where the next round of the sweep goes on

    async def renew(self, ids: Sequence[str]) -> None:
        if ids:
            await self._store.renew(ids, sysid=self._sysid, lease=self._lease)

    async def expire(self) -> bool:
        """Unlock jobs whose lease ran out; True when there were any (they wait again)."""
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
        return bool(again)

    async def deadlines(self) -> None:
        """End the jobs whose deadline passed (408), and resolve what a crash left."""
        ended = await self._store.expire_deadlines()
        if ended:
            self._queuelog.deadline(ended)
            by_type: dict[str, list[Release]] = {}
            for job_id, jobtype, _ in ended:
                by_type.setdefault(jobtype, []).append(
                    Release(id=job_id, how=ReleaseHow.ARCHIVE, code="failed", exitcode=408)
                )
            for jobtype, releases in by_type.items():
                self._queuelog.finished(jobtype, releases)
                self._metrics.finished(jobtype, releases)
                self._metrics.graph(JobType.parse(jobtype).client, "deadline", len(releases))
        await self._store.resolve_pending()

    async def fold_counts(self) -> None:
        """Keep the store's waiting counts cheap to read (one daemon at a time)."""
        await self._store.fold_counts()

    async def purge(self) -> None:
        purged = await self._store.purge(self._retention)
        if purged:
            self._queuelog.purged(purged)
        await self._store.forget_workers()

    @property
    def unhandled_every(self) -> float:
        """Seconds between rounds of the sweep of the types no daemon runs: a
        few seconds, or a quarter of the jobs' time when that is shorter."""
        return max(1.0, min(UNHANDLED_ROUND_S, self._job_ttl / 4))

    async def sweep_unhandled(self) -> None:
        """A round of the sweep: archive the jobs whose time ran out in the next
        slice of the types no daemon runs (one daemon at a time; a round another
        daemon is doing is skipped)."""
        swept = await self._store.unhandled_types(
            self._job_ttl, after=self._unhandled_after, steps=UNHANDLED_STEPS
        )
        if swept is None:
            return
        self._unhandled_after = swept.next_after or ""
        for jobtype, pulled in swept.expired:
            await self.expire_unhandled(jobtype, pulled=pulled)

    async def expire_unhandled(self, jobtype: str, *, pulled: bool = False) -> None:
        """Archive the jobs of a type without a handler (or a pulled type, that no
        worker claimed) whose time ran out (503)."""
        result = NO_WORKER_RESULT if pulled else NO_HANDLER_RESULT
        ids = await self._store.expire_waiting(jobtype, self._job_ttl, result)
        if ids:
            releases = [
                Release(id=i, how=ReleaseHow.ARCHIVE, code="error", exitcode=503) for i in ids
            ]
            self._queuelog.finished(jobtype, releases)
            self._metrics.finished(jobtype, releases)
