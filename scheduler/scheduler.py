"""The fair scheduler behind the seed's selectJobtypeToRun / jobsStarted / jobsStopped.

Fairness is measured in slots: a tenant's service is the number of jobs it has
running now. Each pick goes to the eligible tenant with the fewest running jobs
(ties: the one picked least recently), then to that tenant's type with the
fewest running jobs (ties: a type with an idle warm context, then the one
picked least recently). A deep queue therefore buys a tenant nothing: whoever
holds fewer slots is served next, so a newcomer with one job is picked as soon
as a slot frees.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from queue_daemon.domain.names import JobType
from queue_daemon.scheduler.errors import SchedulerError
from queue_daemon.scheduler.models import Pick

_NEVER = -1  # pick sequence of a tenant or type never picked: it sorts first on ties


class Scheduler:
    """Chooses which waiting jobtype to claim next, and how many of it.

    `concurrency` caps the jobs running at once in this daemon, `tenant_running`
    (None: no cap) the running jobs of one tenant unless `set_tenant_caps`
    gave that tenant a cap of its own, `max_batch` the jobs one pick may
    claim. The caller reports every claim with `jobs_started` and every job
    that stops running with `jobs_stopped`.
    """

    __slots__ = (
        "_concurrency",
        "_max_batch",
        "_running",
        "_running_by_tenant",
        "_running_by_type",
        "_seq",
        "_tenant_caps",
        "_tenant_picked",
        "_tenant_running",
        "_type_picked",
    )

    def __init__(
        self, *, concurrency: int, tenant_running: int | None = None, max_batch: int = 100
    ) -> None:
        if concurrency < 0:
            raise SchedulerError(f"concurrency must be >= 0, got {concurrency}")
        if tenant_running is not None and tenant_running < 1:
            raise SchedulerError(f"tenant_running must be >= 1 or None, got {tenant_running}")
        if max_batch < 1:
            raise SchedulerError(f"max_batch must be >= 1, got {max_batch}")
        self._concurrency = concurrency
        self._tenant_running = tenant_running
        self._tenant_caps: dict[str, int | None] = {}
        self._max_batch = max_batch
        self._running = 0
        self._running_by_type: dict[str, int] = {}
        self._running_by_tenant: dict[str, int] = {}
        # Sequence number of each name's latest pick, for round-robin among equals.
        # Recorded when picked, not when started: a claim that finds nothing must
        # still move the turn on, or one empty type would be picked forever.
        self._tenant_picked: dict[str, int] = {}
        self._type_picked: dict[str, int] = {}
        self._seq = 0

    @property
    def running(self) -> int:
        """Jobs running now in this daemon, as reported."""
        return self._running

    def running_of(self, jobtype: str) -> int:
        """Jobs of `jobtype` running now."""
        return self._running_by_type.get(jobtype, 0)

    def running_of_tenant(self, tenant: str) -> int:
        """Jobs of all of `tenant`'s types running now."""
        return self._running_by_tenant.get(tenant, 0)

    def free_slots(self) -> int:
        """How many more jobs may start before `concurrency` is reached."""
        return max(0, self._concurrency - self._running)

    def free_for(self, tenant: str) -> int:
        """How many more jobs of ``tenant`` may start now: the free slots, within
        its cap on running jobs."""
        free = self.free_slots()
        cap = self._cap_of(tenant)
        if cap is not None:
            free = min(free, max(0, cap - self.running_of_tenant(tenant)))
        return free

    def set_tenant_caps(self, caps: Mapping[str, int | None]) -> None:
        """Per-tenant caps on running jobs (None: no cap), replacing earlier
        ones; tenants not named keep the default `tenant_running`."""
        for tenant, cap in caps.items():
            if cap is not None and cap < 1:
                raise SchedulerError(f"cap of {tenant!r} must be >= 1 or None, got {cap}")
        self._tenant_caps = dict(caps)

    def _cap_of(self, tenant: str) -> int | None:
        caps = self._tenant_caps
        if caps and tenant in caps:
            return caps[tenant]
        return self._tenant_running

    def select_jobtype(
        self, waiting: Mapping[str, int], warm: Set[str] = frozenset()
    ) -> Pick | None:
        """The next jobtype to claim, or None when no slot is free or nothing is eligible.

        `waiting` maps jobtype to a count of its eligible jobs (exact, estimated
        or capped); `warm` holds the jobtypes with an idle warm context. Each
        call records its pick, so the caller should claim what it returns.
        """
        free = self.free_slots()
        if free == 0:
            return None

        groups: dict[str, list[str]] = {}
        client_of = JobType.client_of
        for jobtype, count in waiting.items():
            if count > 0:
                tenant = client_of(jobtype)
                group = groups.get(tenant)
                if group is None:
                    groups[tenant] = [jobtype]
                else:
                    group.append(jobtype)

        running_by_tenant = self._running_by_tenant
        tenant_picked = self._tenant_picked
        best_tenant = ""
        best_tenant_key = (0, 0)
        eligible = 0
        for tenant in groups:
            running = running_by_tenant.get(tenant, 0)
            cap = self._cap_of(tenant)
            if cap is not None and running >= cap:
                continue
            key = (running, tenant_picked.get(tenant, _NEVER))
            if eligible == 0 or key < best_tenant_key:
                best_tenant, best_tenant_key = tenant, key
            eligible += 1
        if eligible == 0:
            return None

        running_by_type = self._running_by_type
        type_picked = self._type_picked
        best_type = ""
        best_type_key = (0, False, 0)
        for jobtype in groups[best_tenant]:
            # False sorts before True: warm wins only between equally served types.
            type_key = (
                running_by_type.get(jobtype, 0),
                jobtype not in warm,
                type_picked.get(jobtype, _NEVER),
            )
            if not best_type or type_key < best_type_key:
                best_type, best_type_key = jobtype, type_key

        # Leave room for the other waiting tenants: they take the next picks.
        fair_share = max(1, free // eligible)
        limit = min(self._max_batch, free, fair_share, waiting[best_type])
        cap = self._cap_of(best_tenant)
        if cap is not None:
            limit = min(limit, cap - best_tenant_key[0])

        self._seq += 1
        tenant_picked[best_tenant] = self._seq
        type_picked[best_type] = self._seq
        return Pick(jobtype=best_type, limit=limit)

    def jobs_started(self, jobtype: str, count: int) -> None:
        """A batch of `count` jobs of `jobtype` started running."""
        if count < 0:
            raise SchedulerError(f"jobs_started count must be >= 0, got {count}")
        if count == 0:
            return
        tenant = JobType.client_of(jobtype)
        self._running_by_type[jobtype] = self._running_by_type.get(jobtype, 0) + count
        self._running_by_tenant[tenant] = self._running_by_tenant.get(tenant, 0) + count
        self._running += count

    def jobs_stopped(self, jobtype: str, count: int) -> None:
        """A batch of `count` jobs of `jobtype` is no longer running (done or to be retried).

        Stopping more than are running stops only those; an unknown type is a no-op.
        """
        if count < 0:
            raise SchedulerError(f"jobs_stopped count must be >= 0, got {count}")
        have = self._running_by_type.get(jobtype, 0)
        count = min(count, have)
        if count == 0:
            return
        tenant = JobType.client_of(jobtype)
        self._drop(self._running_by_type, jobtype, count)
        self._drop(self._running_by_tenant, tenant, count)
        self._running -= count

    @staticmethod
    def _drop(counts: dict[str, int], name: str, count: int) -> None:
        left = counts[name] - count
        if left > 0:
            counts[name] = left
        else:
            del counts[name]
