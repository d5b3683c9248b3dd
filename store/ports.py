"""The store's ports: one small protocol per consumer, so each part of the daemon
depends on the few calls it makes. ``queue_daemon.store.pg.PgStore`` implements them all
(``Store``), and so does ``tests/fakes/store/`` in memory; the contract suite
(``tests/contract``) runs the same tests against both.

| port          | used by                                               |
|---------------|-------------------------------------------------------|
| JobIntake     | the ingester (journal -> store)                        |
| JobQueue      | the worker (claims, leases, releases, expiry, purge)   |
| JobQueries    | the job routes (get, list, stats, cancel)              |
| TenantStore   | tokens, limits and quotas, the tenant and admin CLI    |
| HandlerLookup | the handler cache (the newest version of a type)      |
| HandlerStore  | the handler routes                                     |
| SysidLeases   | the daemon's sysid                                     |
| PulledJobs    | the pull-worker routes (claims by tenants' workers)   |
| Dashboard     | the overview, metrics and throughput                   |
| ScheduleStore | the schedule routes and the ticker (periodic jobs)     |
| BlobStore     | the blob routes, adds of a blob, wasm modules in blobs |

TenantStore, HandlerLookup, HandlerStore, ScheduleStore and BlobStore (what a tenant owns
besides its jobs) are defined in ``tenant_ports`` and re-exported here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Protocol

from queue_daemon.domain.jobs import (
    ClaimedJob,
    Dispatch,
    ExpiredLock,
    Job,
    JobPage,
    JobState,
    NewJob,
    Progress,
    Release,
    UnhandledRound,
)
from queue_daemon.domain.pulled import HeldJob, OptedJobs, PulledJob
from queue_daemon.domain.views import (
    DaemonLease,
    DaemonSeen,
    FailedJob,
    Paused,
    QueueDepth,
    RunningJobs,
    TypeStats,
    WorkerSeen,
)
from queue_daemon.store.listen import Delays
from queue_daemon.store.tenant_ports import BlobStore as BlobStore
from queue_daemon.store.tenant_ports import HandlerLookup as HandlerLookup
from queue_daemon.store.tenant_ports import HandlerStore as HandlerStore
from queue_daemon.store.tenant_ports import ScheduleStore as ScheduleStore
from queue_daemon.store.tenant_ports import TenantStore as TenantStore


class JobIntake(Protocol):
    async def add_jobs(
        self, jobs: Sequence[NewJob], *, durable: bool = True, fresh: bool = False
    ) -> int:
        """Insert jobs, idempotent by id; return how many rows were new. Without
        ``durable`` it returns once they are seen, before they are flushed.
        ``fresh``: no job of the batch can be in the store yet (the journal's
        first reading of it by the daemon that wrote it), so the done jobs are
        not looked through for its ids."""

    async def add_dispatched(
        self,
        jobs: Sequence[NewJob],
        dispatch: Dispatch,
        *,
        fresh: bool = True,
        early: bool = False,
    ) -> tuple[int, list[ClaimedJob]]:
        """Insert a batch of a few jobs as ``add_jobs`` without ``durable``,
        those of ``dispatch`` claimed by its sysid (unless its lease ran out or
        was released, as ``claim``): how many rows were new, and the jobs
        claimed. Only a batch that is not ``fresh`` may hold ids done already
        (skipped, as ``add_jobs`` skips them). An ``early`` batch (an add's, not
        yet journaled) stores nothing when the sysid may not claim."""

    async def remove_refused(self, ids: Sequence[str], sysid: str) -> int:
        """Delete the rows of ``ids`` that wait or that ``sysid`` holds (jobs of an
        add refused after they were stored, never started); how many went."""

    async def add_opted(self, groups: Sequence[OptedJobs]) -> int:
        """Insert jobs with dependencies or a deadline (blocked until their
        dependencies are done, or failed at once when one already failed),
        idempotent by id; return how many rows were new."""

    async def flush(self) -> str:
        """Return once every job added before the call is durable, with the epoch
        (the server's incarnation) it was flushed on."""

    async def epoch(self) -> str:
        """The server's incarnation, ``"<start> r<stats reset> tl<timeline>"``. Jobs added after
        ``epoch`` returned E are made durable by a ``flush`` that returns E; a flush
        that returns another epoch means the server restarted or failed over in
        between and may have lost them."""


def timeline_of(epoch: str) -> str:
    """The WAL timeline of an epoch ``"<incarnation> tl<timeline>"`` (``JobIntake.epoch``):
    a standby's promotion starts a new one, a restart keeps it."""
    return epoch.rpartition(" tl")[2]


class JobQueue(Protocol):
    async def waiting_jobtypes(self, limit_per_type: int = 1000) -> dict[str, int]:
        """Stored jobtypes that daemons run (a live handler, not a pull worker's)
        with eligible jobs (lock '' and dt <= now), each with its count of eligible
        jobs capped at ``limit_per_type`` (cheap: never counts past the cap, never
        touches done jobs or types that no daemon runs)."""

    async def claim(self, type: str, limit: int, *, sysid: str, lease: float) -> list[ClaimedJob]:
        """Take up to ``limit`` eligible jobs of ``type`` (FOR UPDATE SKIP LOCKED):
        lock = sysid, dt = now + lease, attempts + 1."""

    async def unhandled_types(
        self, older_than: float, *, after: str = "", steps: int = 5_000
    ) -> UnhandledRound | None:
        """A round of the sweep: of up to ``steps`` waiting types after ``after``,
        those that no daemon runs (no live handler, or a pulled type) and whose
        oldest job was due more than ``older_than`` seconds ago; None when another
        daemon is sweeping right now."""

    async def expire_waiting(self, type: str, older_than: float, result: str) -> list[str]:
        """Archive as error 503 (with ``result``) the waiting jobs of ``type``
        created and due more than ``older_than`` seconds ago; return their ids."""

    async def renew(self, ids: Sequence[str], *, sysid: str, lease: float) -> int:
        """dt = now + lease for those of ``ids`` locked by ``sysid``; return how many."""

    async def note_progress(self, notes: Sequence[Progress]) -> set[str]:
        """Each note's progress on its job, if its lock still holds the job (now
        as ``at``); the ids written."""

    async def release(self, releases: Sequence[Release], *, sysid: str) -> set[str]:
        """Apply each release to its job if locked by ``sysid``; return the ids it
        applied to (the others' leases were lost: their outcome is discarded)."""

    async def expire_locks(self) -> list[ExpiredLock]:
        """Unlock (lock '', eligible now) running jobs whose lease passed, and at
        once those locked by a sysid whose lease lapsed or that was released;
        return them."""

    async def purge(self, older_than: float) -> dict[str, int]:
        """Delete archived jobs done more than ``older_than`` seconds ago; return
        how many per stored jobtype."""

    async def fold_counts(self) -> bool:
        """Fold the waiting counts' appended moves into their totals (0012);
        False when another daemon is folding right now."""

    async def notify_jobs(self) -> None:
        """Wake listening daemons: new eligible jobs may exist."""

    async def forget_workers(self) -> int:
        """Delete pull workers not seen for a day; how many."""

    async def expire_deadlines(self) -> list[tuple[str, str, bool]]:
        """End (failed, 408) the jobs whose deadline passed, running ones too (their
        holder's outcome is then refused); (id, stored type, was running) of each."""

    async def resolve_pending(self) -> int:
        """Resolve the dependents of done jobs that a crash left unresolved."""

    async def listen(
        self,
        on_jobs: Callable[[dict[str, int] | None], None],
        on_handler: Callable[[str], None],
        *,
        retry: Delays,
        on_done: Callable[[set[str] | None], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> None:
        """Call ``on_jobs`` on new jobs (with the due ones added per jobtype when
        known, else None), ``on_handler(type)`` when a handler changes,
        ``on_done`` when jobs are done (the stored types, None: any) and
        ``on_cancel(sysid, id)`` when a job that daemon runs was cancelled, until
        the store is closed (a dedicated connection; reconnects)."""


class JobQueries(Protocol):
    async def get_job(self, client: str, job_id: str) -> Job:
        """Raise NotFound when absent or owned by another client."""

    async def list_jobs(
        self,
        client: str,
        *,
        type: str | None = None,
        state: JobState | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage: ...

    async def stats(self, client: str) -> dict[str, TypeStats]:
        """Counts per type (without the client prefix)."""

    async def cancel_job(self, client: str, job_id: str) -> Job:
        """Waiting -> done/failed/499. NotFound, or Conflict when running or done."""

    async def delete_done(
        self, client: str, *, type: str | None, before: datetime, limit: int
    ) -> dict[str, int]:
        """Delete up to ``limit`` of ``client``'s done jobs done before ``before``
        (of stored ``type``, or any); how many per stored type."""

    async def rerun_job(self, client: str, job_id: str) -> Job:
        """A done job (any outcome) waits again: due now, attempts 0, its
        outcome and deadline cleared, its runs kept. NotFound, or Conflict when
        it is not done."""

    async def rerun_done(
        self, client: str, *, type: str | None, codes: Sequence[str], before: datetime, limit: int
    ) -> dict[str, int]:
        """Rerun up to ``limit`` of ``client``'s jobs done with one of ``codes``
        (failed, error) before ``before`` (of stored ``type``, or any): how
        many per stored type."""

    async def pause_type(self, client: str, type: str, *, paused: bool, most: int) -> None:
        """Pause (or resume) the stored ``type`` of ``client``: its jobs wait, no
        claim takes them. LimitReached when ``client`` has ``most`` paused types."""

    async def pause_tenant(self, client: str, *, paused: bool, known: bool = True) -> None:
        """Pause (or resume) every type of ``client``. NotFound when pausing a
        tenant that is not active, unless not ``known`` (``--no-auth``: every
        name is a tenant)."""

    async def paused(self, client: str) -> Paused:
        """What of ``client`` is paused."""


class SysidLeases(Protocol):
    async def reserve_sysid(
        self,
        sysid: str | None,
        *,
        holder: str,
        host: str,
        data_dir: str,
        lease: float,
        takeover: bool = False,
    ) -> str:
        """Lease ``sysid`` (or a new unique one when None) for ``lease`` seconds.

        Raise SysidTaken when another holder's lease is live, unless ``takeover``
        and the row's host and data_dir equal ours (the caller proved by a file
        lock that the previous holder on this machine is dead).
        """

    async def renew_sysid(self, sysid: str, *, holder: str, lease: float) -> None:
        """Extend the lease; SysidTaken if someone else holds it now."""

    async def release_sysid(self, sysid: str, *, holder: str) -> None: ...


class Dashboard(Protocol):
    async def queue_depths(self, client: str | None, limit: int, cap: int) -> list[QueueDepth]:
        """Counts per stored jobtype, at most ``limit`` types (by name); waiting
        and scheduled jobs are counted up to ``cap`` each."""
        ...

    async def running_jobs(self, client: str | None, limit: int) -> RunningJobs:
        """How many jobs run, and the ``limit`` oldest of them."""
        ...

    async def recent_failures(
        self, client: str | None, limit: int, result_chars: int, *, type: str | None = None
    ) -> list[FailedJob]:
        """The newest ``limit`` failed or errored jobs (of the stored ``type`` only,
        when given), results cut to ``result_chars``."""
        ...

    async def daemon_leases(self, limit: int) -> list[DaemonLease]:
        """Sysid leases, live ones first."""
        ...

    async def workers(self, client: str | None = None) -> list[WorkerSeen]:
        """Pull workers seen within a day: ``client``'s, or every tenant's."""
        ...

    async def live_workers(self) -> dict[str, int]:
        """client -> its pull workers seen within their lease."""
        ...

    async def paused_counts(self) -> dict[str, tuple[bool, int]]:
        """client -> (whether it is paused, how many of its types are), for the
        tenants with anything paused."""
        ...

    async def archived_counts(self) -> dict[str, int]:
        """Stored jobtype -> jobs ever archived (only grows): throughput samples."""
        ...


# (job id, the whole lock value its claim put on it: 'w:<claim>:<worker>')
Claim = tuple[str, str]


class PulledJobs(Protocol):
    async def claim_pulled(
        self, type: str, limit: int, *, lock: str, lease: float, client: str, worker: str
    ) -> list[PulledJob]:
        """Take up to ``limit`` eligible jobs of ``type`` for a tenant's worker (as
        ``claim``, with ``lock``); the worker's heartbeat."""

    async def renew_pulled(
        self, claims: Sequence[Claim], *, client: str, worker: str
    ) -> dict[str, datetime]:
        """Extend the lease of the jobs still held by their claims (by their type's
        timeout); id -> the new end of the lease. The worker's heartbeat."""

    async def existing_jobs(self, ids: Sequence[str], *, client: str) -> set[str]:
        """Which of ``ids`` are ``client``'s jobs."""

    async def cancelled_jobs(self, ids: Sequence[str], *, client: str) -> set[str]:
        """Which of ``ids`` are ``client``'s jobs cancelled while they ran."""

    async def complete_pulled(
        self,
        claims: Sequence[Claim],
        decide: Callable[[list[HeldJob]], Awaitable[list[Release]]],
        *,
        client: str,
        worker: str,
    ) -> set[str]:
        """In one transaction: lock the jobs still held by their claims, ask
        ``decide`` for their releases (it may write follow-on jobs; an exception
        changes nothing), apply them and count them for the worker. The ids applied."""

    async def archive_pulled(
        self, releases: Sequence[Release], claims: Sequence[Claim], *, client: str, worker: str
    ) -> list[tuple[str, str, int]]:
        """Archive the jobs of ``releases`` (all of them ``archive``: runs that
        ended ok or failed, nothing to decide from the jobs' rows; each with its
        claim in ``claims``) that their claims still hold, in one statement, and
        count them for the worker; an ok run of a type whose live handler has a
        ``then`` is left held (its chained job comes first). The jobs archived:
        (id, stored type, attempts)."""

    async def hand_back(
        self, claims: Sequence[Claim], *, client: str, worker: str
    ) -> dict[str, str]:
        """Make held jobs waiting again without counting the claim's attempt;
        id -> stored type of those handed back."""

    async def done_among(self, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` are done."""

    async def daemons(self) -> list[DaemonSeen]:
        """Daemons seen within a day, with the jobs each runs now."""


class Store(
    JobIntake,
    JobQueue,
    PulledJobs,
    JobQueries,
    TenantStore,
    HandlerStore,
    SysidLeases,
    Dashboard,
    ScheduleStore,
    BlobStore,
    Protocol,
):
    """Every port, and the connection's own life: what the daemon's wiring holds."""

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless a trivial query succeeds."""
