"""Jobs of pulled types, run by the tenants' own workers over HTTP: claims (held
until a job comes, ``engine.pull.holds``), renewals, completes and hand-backs.

A claim locks its jobs with ``w:<claim token>:<worker>``: only a request that
names that token and worker acts on them, so a worker that stalled past its
lease, after another worker claimed the job again, changes nothing. A complete
decides each job's outcome as a daemon-run job's, in the same step
(``engine.releases``: the handler's ``maxAttempts``, the job's time, backoff)
and journals its follow-on jobs (``then``, the tenant's limits) while the store
holds the jobs locked, in one transaction: an outcome is never stored without
its follow-on jobs being durable, and a stale claim writes nothing.
"""

from __future__ import annotations

import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.domain.names import JobType
from queue_daemon.domain.outcomes import code_of
from queue_daemon.domain.pulled import HeldJob, PulledJob
from queue_daemon.engine.handlers import PULLED_LANG, HandlerCache
from queue_daemon.engine.progress import ProgressBoard, progress_of
from queue_daemon.engine.pull.holds import RECHECK_S, JobWaits
from queue_daemon.engine.releases import Releases
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.observe.tracing import Tracing, end
from queue_daemon.runners.models import HandlerSpec, JobResult
from queue_daemon.runners.output import clip
from queue_daemon.store.errors import StoreUnavailable
from queue_daemon.store.ports import Claim, PulledJobs

MAX_ITEMS = 1000  # jobs per claim, and items per batch request
NOT_FOUND, CANCELLED = "not_found", "cancelled"  # why a claim's job is gone (Pulls._gone)
FINAL = (2, 4)  # exit-code classes (ok, failed) archived whatever the job's attempts and age


class NotPulled(Exception):
    """The type has no handler of lang ``worker``: no worker may claim it."""


class FollowOnsNotWritten(Exception):
    """The journal refused a complete's follow-on jobs: nothing was changed."""


@dataclass(slots=True, kw_only=True)  # made per job: not frozen (runners.models)
class Completion:
    """One job's end as a worker reports it."""

    id: str
    claim: str
    exitcode: int
    result: str | None = None
    jobs: list[tuple[str, str]] = field(default_factory=list)  # follow-on (type, payload)


def lock_of(claim: str, worker: str) -> str:
    return f"w:{claim}:{worker}"


class Pulls:
    def __init__(
        self,
        *,
        store: PulledJobs,
        handlers: HandlerCache,
        releases: Releases,
        queuelog: QueueLog,
        metrics: Metrics,
        progress: ProgressBoard | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._store = store
        self._tracing = tracing or Tracing.off()  # traced jobs' claim spans
        self._progress = progress
        self._handlers = handlers
        self._releases = releases
        self._queuelog = queuelog
        self._metrics = metrics
        self.waits = JobWaits()

    async def spec(self, jobtype: JobType) -> HandlerSpec:
        spec = await self._handlers.get(jobtype.stored)
        if spec is None or spec.lang != PULLED_LANG:
            said = "has no handler" if spec is None else f"is run by the daemon ({spec.lang})"
            raise NotPulled(
                f"type {jobtype.name!r} {said}; workers claim types whose handler has"
                f' lang "{PULLED_LANG}"'
            )
        return spec

    async def claim(
        self,
        jobtype: JobType,
        *,
        worker: str,
        limit: int,
        wait: float,
        gone: Callable[[], bool] = lambda: False,
    ) -> tuple[str, float, list[PulledJob]]:
        """The claim token, its lease in seconds and up to ``limit`` due jobs, held
        for ``wait`` seconds until at least one is due. ``gone``: whether the
        worker hung up (then nothing more is claimed, and what was is handed
        back at once)."""
        claim = secrets.token_hex(16)
        deadline = time.monotonic() + wait
        stored = jobtype.stored
        spec: HandlerSpec | None = None
        while True:
            began, began_ns = time.perf_counter(), time.time_ns()
            try:
                spec = spec or await self.spec(jobtype)
                jobs = await self._store.claim_pulled(
                    stored,
                    limit,
                    lock=lock_of(claim, worker),
                    lease=spec.timeout,
                    client=jobtype.client,
                    worker=worker,
                )
            except StoreUnavailable:
                # a held claim outlasts a store away for less than its hold (a
                # restart, a failover): it tries again until the hold runs out
                if deadline - time.monotonic() <= 0 or self.waits.closed or gone():
                    raise
                jobs = []
            else:
                self._metrics.claimed(stored, len(jobs), time.perf_counter() - began)
            left = deadline - time.monotonic()
            if jobs or left <= 0 or self.waits.closed or gone():
                break
            await self.waits.wait(stored, min(left, RECHECK_S))
        if spec is None:  # the store was away for the whole hold
            raise StoreUnavailable("the store cannot be reached")
        if jobs and gone():
            await self.hand_back(jobtype.client, worker, [(job.id, claim) for job in jobs])
            return claim, spec.timeout, []
        if jobs:
            self._metrics.pulled(jobtype.client, "claimed", len(jobs))
            self._queuelog.started(stored, jobs, worker=worker)
            if self._tracing.on:  # a traced job's worker gets its claim's span
                attributes = {"queue.type": stored, "queue.worker": worker}
                for span in self._tracing.begin(
                    "queue.claim", jobs, attributes, start_ns=began_ns
                ).values():
                    end(span)
        return claim, spec.timeout, jobs

    async def renew(
        self,
        client: str,
        worker: str,
        claims: Sequence[tuple[str, str]],
        reports: dict[str, tuple[float, str]] | None = None,
    ) -> tuple[dict[str, datetime], dict[str, str]]:
        """The new end of the lease of each job still held, and why some are not
        (``_gone``); ``reports``: the progress of some (job id -> fraction, message),
        kept for those still held."""
        locks = _locks(claims, worker)
        held = await self._store.renew_pulled(locks, client=client, worker=worker)
        if reports and self._progress is not None:
            for job_id, lock in locks:
                if job_id in reports and job_id in held:
                    self._progress.note(progress_of(job_id, lock, *reports[job_id]))
        return held, await self._gone(client, claims, held)

    async def hand_back(
        self, client: str, worker: str, claims: Sequence[tuple[str, str]]
    ) -> tuple[set[str], dict[str, str]]:
        """Held jobs made waiting again, their attempt not counted; and why some
        are not (``_gone``)."""
        back = await self._store.hand_back(_locks(claims, worker), client=client, worker=worker)
        for jobtype in set(back.values()):
            self.waits.on_jobs({jobtype: 1})
        self._metrics.pulled(client, "handed_back", len(back))
        return set(back), await self._gone(client, claims, back)

    async def complete(
        self, client: str, worker: str, completions: Sequence[Completion]
    ) -> tuple[set[str], dict[str, str]]:
        """Apply each completion whose claim still holds its job; the ids applied,
        and why some were not (``_gone``). FollowOnsNotWritten when the journal
        refused the follow-on jobs (nothing changed)."""
        claims = [(c.id, c.claim) for c in completions]
        if all(not c.jobs and c.exitcode // 100 in FINAL for c in completions):
            applied = await self._archive(client, worker, completions)
            # what is left: stale claims, and ok runs of a type whose handler
            # chains a ``then`` job (journaled before their outcomes)
            left = [c for c in completions if c.id not in applied]
            if left:
                applied |= await self._decided(client, worker, left)
        else:
            applied = await self._decided(client, worker, completions)
        self._metrics.pulled(client, "completed", len(applied))
        stale = len(completions) - len(applied)
        gone = await self._gone(client, claims, applied)
        self._metrics.pulled(client, "stale", stale - sum(g == NOT_FOUND for g in gone.values()))
        return applied, gone

    async def _archive(
        self, client: str, worker: str, completions: Sequence[Completion]
    ) -> set[str]:
        """Runs that all ended ok or failed, without follow-on jobs: archived in one
        statement, nothing read or decided from their rows first (the store
        leaves those of a type that chains a ``then`` job)."""
        limit = self._releases.result_limit(client)
        # an id or claim with a space was never given out: no job is held by it
        # (and the statement's texts are split on spaces)
        sendable = [c for c in completions if " " not in c.id and " " not in c.claim]
        releases = [
            Release(
                id=c.id,
                how=ReleaseHow.ARCHIVE,
                code=code_of(c.exitcode),
                exitcode=c.exitcode,
                result=None if c.result is None else clip(c.result, limit),
            )
            for c in sendable
        ]
        claims = [(c.id, c.claim) for c in sendable]
        done = await self._store.archive_pulled(
            releases, _locks(claims, worker), client=client, worker=worker
        )
        attempts: dict[str, dict[str, int]] = defaultdict(dict)  # stored type -> id -> attempts
        for job_id, stored, tries in done:
            attempts[stored][job_id] = tries
        for stored, of_type in attempts.items():
            mine = [r for r in releases if r.id in of_type]
            self._queuelog.finished(stored, mine, attempts=of_type, worker=worker)
            self._metrics.finished(stored, mine)
        return {job_id for job_id, _, _ in done}

    async def _decided(
        self, client: str, worker: str, completions: Sequence[Completion]
    ) -> set[str]:
        """Each run's release decided from its job's row (its attempts, its time,
        the handler's rules) while the store holds the jobs locked, follow-on jobs
        journaled before the releases are written."""
        by_id = {c.id: c for c in completions}
        logged: list[tuple[str, list[Release], dict[str, int]]] = []

        async def decide(held: list[HeldJob]) -> list[Release]:
            logged.clear()
            return await self._decide(held, by_id, logged)

        claims = [(c.id, c.claim) for c in completions]
        applied = await self._store.complete_pulled(
            _locks(claims, worker), decide, client=client, worker=worker
        )
        for stored, releases, attempts in logged:
            mine = [r for r in releases if r.id in applied]
            self._queuelog.finished(stored, mine, attempts=attempts, worker=worker)
            self._metrics.finished(stored, mine)
        return applied

    async def _decide(
        self,
        held: list[HeldJob],
        by_id: dict[str, Completion],
        logged: list[tuple[str, list[Release], dict[str, int]]],
    ) -> list[Release]:
        by_type: dict[str, list[HeldJob]] = defaultdict(list)
        for job in held:
            by_type[job.type].append(job)
        now = datetime.now(UTC)
        releases: list[Release] = []
        for stored, jobs in by_type.items():
            spec = await self._handlers.get(stored) or _orphan_spec(JobType.parse(stored))
            batch = self._releases.of(spec)
            mine: list[Release] = []
            for job in jobs:
                done = by_id[job.id]
                ran = await batch.take(
                    JobResult(
                        id=job.id, exitcode=done.exitcode, result=done.result, emits=done.jobs
                    )
                )
                mine.append(batch.release(job, ran, now=now))
            if not await batch.flush():
                raise FollowOnsNotWritten("the journal cannot be written; nothing was changed")
            releases += mine
            logged.append((stored, mine, {job.id: job.attempts for job in jobs}))
        return releases

    async def _gone(
        self, client: str, claims: Sequence[tuple[str, str]], answered: Container[str]
    ) -> dict[str, str]:
        """Of the claims not ``answered``: the ids that are not ``client``'s jobs
        (NOT_FOUND) and those cancelled while they ran (CANCELLED); the others
        are held by no claim of theirs any more (a lease ran out, or done)."""
        missing = [job_id for job_id, _ in claims if job_id not in answered]
        if not missing:
            return {}
        found = await self._store.existing_jobs(missing, client=client)
        gone = {job_id: NOT_FOUND for job_id in missing if job_id not in found}
        if found:
            cancelled = await self._store.cancelled_jobs(list(found), client=client)
            gone.update(dict.fromkeys(cancelled, CANCELLED))
        return gone


def _locks(claims: Sequence[tuple[str, str]], worker: str) -> list[Claim]:
    locks: dict[str, str] = {}  # a request's jobs mostly share one claim
    return [
        (job_id, locks.get(claim) or locks.setdefault(claim, lock_of(claim, worker)))
        for job_id, claim in claims
    ]


def _orphan_spec(jobtype: JobType) -> HandlerSpec:
    """The rules for a held job whose type lost its handler meanwhile: the defaults."""
    return HandlerSpec(
        version="", client=jobtype.client, type=jobtype.name, lang=PULLED_LANG, body=""
    )
