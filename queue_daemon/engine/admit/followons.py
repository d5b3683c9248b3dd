"""A batch's follow-on jobs on their way into the journal.

Each finished run's follow-on jobs (``J:`` lines, ``ctx.emit`` calls and a
``then`` job) are taken as its result arrives, checked against its tenant's
limits and written to the journal once ``CHUNK_BYTES`` of them are pending, so a
batch holds at most a chunk and one run's of them, however much its handlers print.

Per run, in this order:

- ``follow_ons``: follow-on jobs one run may add; the rest are dropped;
- ``emit``: bytes of follow-on payloads one run may add; the ones past it are
  dropped;
- the add rate and the waiting limit, which follow-on jobs count against like
  adds: when the run's follow-on jobs do not fit now, none is added and the
  run is retried later (``OVER_LIMITS``, a retry code: its attempts and its
  time bound how often), as a client's add gets ``429``; when they could never
  fit (more than the burst, or than the waiting limit), they are dropped.

What a context sends of ``ctx.emit`` is bounded before it leaves the context:
each run by ``emit`` and by what the burst holds (its payload bytes,
``emit_limit``), past which they are dropped as above; and the batch's runs
together, in their order, by what the tenant's add rate would take now,
shared with the tenant's other batches running (``emit_budget``): a run
whose context dropped some only for that (``emit_short``) runs again later
(``OVER_LIMITS``), as it would have been over the rate here, but the daemon
never reads those megabytes only to refuse them.

A dropped follow-on job is logged and counted, and the run's result ends with
a line saying how many were dropped and why.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

from queue_daemon.domain.names import JobType
from queue_daemon.domain.outcomes import code_of
from queue_daemon.engine.admit.adds import Adds, NeverFits, OverRate, OverWaiting
from queue_daemon.engine.admit.limits import TenantLimits
from queue_daemon.journal import JournalError
from queue_daemon.runners.models import HandlerSpec, JobResult
from queue_daemon.runners.output import emit_problem

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # follow-on payload bytes held before they are journaled
OVER_LIMITS = 129  # a retry code: the run's follow-on jobs are over the add rate or waiting limit

# counts dropped follow-on jobs by tenant and reason
Count = Callable[[str, str, int], None]


@dataclass(slots=True)
class _Drops:
    counts: dict[str, int]  # reason -> follow-on jobs dropped
    problems: dict[str, str]  # reason -> what it says

    def add(self, reason: str, count: int, problem: str) -> None:
        if count:
            self.counts[reason] = self.counts.get(reason, 0) + count
            self.problems.setdefault(reason, problem)

    def note(self) -> str | None:
        """The line the run's result ends with: the drops over the tenant's limits
        (invalid follow-on jobs are in the run's log lines, as the runner found them)."""
        over = {r: n for r, n in self.counts.items() if r != "invalid"}
        if not over:
            return None
        said = "; ".join(self.problems[r] for r in over)
        return f"[{sum(over.values())} follow-on job(s) dropped: {said}]"


class FollowOns:
    """The follow-on jobs of one batch of ``spec``'s jobs."""

    def __init__(
        self,
        spec: HandlerSpec,
        limits: TenantLimits,
        adds: Adds,
        count: Count,
        progress: Callable[[str, object, object], None] | None = None,
    ) -> None:
        self._spec = spec
        self._progress = progress
        self._limits = limits
        self._adds = adds
        self._count = count
        self._pending: dict[str, list[str]] = defaultdict(list)
        self._pending_bytes = 0
        self.failed = False  # a chunk could not be journaled: the batch runs again
        self._taken: set[str] = set()
        # the pool of the tenant's rate this batch took a share of (``emit_budget``)
        self._sharing = False
        self._pool: str | None = None

    def emit_limit(self) -> int:
        """Bytes of ``ctx.emit`` payloads a run of this batch may send: the most it
        could ever add (see the module docstring)."""
        return int(min(self._limits.emit, self._adds.burst_bytes(self._spec.client)))

    def emit_budget(self) -> int | None:
        """Bytes of ``ctx.emit`` payloads the batch's runs may send together (None:
        the tenant has no rate): what its add rate would take now, shared with its
        other batches running: those of the types whose runs sent follow-on jobs
        before with each other, those of a type not yet seen to do so with that
        type's others (a type that never did takes nothing from those that do).
        Asked once a batch; ``end`` ends its share."""
        client, type = self._spec.client, self._spec.type
        self.end()  # asked again: its share so far goes back first
        pool = None if self._adds.emits(client, type) else type
        room = self._adds.share_room_bytes(client, pool)
        if math.isinf(room):
            return None
        self._sharing, self._pool = True, pool
        return int(room)

    def end(self) -> None:
        """The batch ended (flushed or abandoned): its share goes back."""
        if self._sharing:
            self._sharing = False
            self._adds.end_share(self._spec.client, self._pool)

    def progress(self, job_id: str, fraction: object, message: object) -> None:
        """The batch's runs' progress, to the daemon's board (engine.progress)."""
        if self._progress is not None:
            self._progress(job_id, fraction, message)

    def took(self, job_id: str) -> bool:
        """Whether the result of ``job_id`` was taken (as it arrived)."""
        return job_id in self._taken

    def wants(self, result: JobResult) -> bool:
        """Whether ``take`` has anything to do for ``result`` (most runs: nothing,
        and the result is kept as it is, with no coroutine to await)."""
        return result.ran and bool(
            result.emits
            or result.dropped
            or result.emit_over
            or (self._spec.then and code_of(result.exitcode) == "ok")
        )

    async def take(self, result: JobResult) -> JobResult:
        """``result`` without its follow-on jobs, which are now pending or written;
        its exit code and result say so when some were dropped or refused."""
        self._taken.add(result.id)
        if not self.wants(result):  # nothing to take: the result as it is
            return result
        client = self._spec.client
        if result.emits or result.emit_short or result.emit_over:
            self._adds.emitted(client, self._spec.type)
        if result.emit_short and result.emit_cost <= self._adds.burst_bytes(client):
            # dropped by its context as the rate's room was spent; it fits another time
            self._count(client, "rate", result.emit_short)
            return replace(
                result,
                exitcode=OVER_LIMITS,
                result="its follow-on jobs are over this tenant's add rate; retried later",
                emits=[],
                dropped=[],
            )
        jobs, sizes, drops = self._within_limits(result)
        if jobs:
            admitted, retry = await self._admit(len(jobs), sum(sizes), drops)
            if retry is not None:
                return replace(result, exitcode=OVER_LIMITS, result=retry, emits=[], dropped=[])
            if not admitted:
                jobs, sizes = [], []
        if drops.counts:
            self._log(result.id, drops)
        if self.failed:
            if jobs:
                self._adds.give_back(self._spec.client, len(jobs))
            return replace(result, emits=[], dropped=[])
        for (name, payload), size in zip(jobs, sizes, strict=True):
            self._pending[name].append(payload)
            self._pending_bytes += size
        if self._pending_bytes >= CHUNK_BYTES:
            await self.flush()
        note = drops.note()
        text = result.result
        if note:
            text = note if text is None else f"{text}\n{note}"
        return replace(result, result=text, emits=[], dropped=[])

    async def flush(self) -> bool:
        """Journal what is pending; False once any chunk of the batch failed."""
        pending, self._pending, self._pending_bytes = self._pending, defaultdict(list), 0
        if self.failed or not pending:
            return not self.failed
        client = self._spec.client
        unwritten = sum(map(len, pending.values()))
        try:
            for name, payloads in pending.items():
                # a chunk that fails is given back by ``write`` itself
                unwritten -= len(payloads)
                await self._adds.write(JobType(client, name), payloads)
        except (JournalError, ValueError) as exc:
            logger.error("follow-on jobs not written: %s", exc, extra={"action": "emit_failed"})
            self.failed = True
            self._adds.give_back(client, unwritten)
        except BaseException:  # cancelled: the chunks not begun will never be written
            self._adds.give_back(client, unwritten)
            raise
        return not self.failed

    def abandon(self) -> None:
        """The batch ends without its flush (cancelled, or its run failed): what
        is pending will never be journaled, so the waiting limit gets it back."""
        pending, self._pending, self._pending_bytes = self._pending, defaultdict(list), 0
        unwritten = sum(map(len, pending.values()))
        if unwritten:
            self._adds.give_back(self._spec.client, unwritten)

    def _within_limits(self, result: JobResult) -> tuple[list[tuple[str, str]], list[int], _Drops]:
        limits = self._limits
        drops = _Drops({}, {})
        if result.dropped:
            n = len(result.dropped)
            drops.add("invalid", n, f"{n} invalid, e.g. {result.dropped[0]}")
        wanted = list(result.emits)
        then = self._spec.then
        if then and code_of(result.exitcode) == "ok":
            # an empty result still chains (``then`` as a trigger)
            wanted.append((then, (result.result or "").replace("\n", " ").replace("\x00", "")))
        jobs: list[tuple[str, str]] = []
        sizes: list[int] = []
        total = invalid = 0
        over_bytes = result.emit_over  # dropped by the context itself
        first: str | None = None
        for name, payload in wanted:
            # the runner checked these already; the journal's framing depends on it
            problem = emit_problem(name, payload, limits.payload) if payload else None
            if problem is not None:
                invalid += 1
                first = first or problem
                continue
            size = len(payload) if payload.isascii() else len(payload.encode())
            if total + size > limits.emit:
                over_bytes += 1
                continue
            total += size
            jobs.append((name, payload))
            sizes.append(size)
        drops.add("invalid", invalid, f"{invalid} invalid, e.g. {first}")
        over_count = max(0, len(jobs) - limits.follow_ons)
        if over_count:
            del jobs[limits.follow_ons :], sizes[limits.follow_ons :]
        drops.add(
            "count",
            over_count,
            f"{over_count} over this tenant's limit of {limits.follow_ons} follow-on jobs per job",
        )
        drops.add(
            "bytes",
            over_bytes,
            f"{over_bytes} over this tenant's limit of {limits.emit} bytes of follow-on jobs"
            " per job",
        )
        return jobs, sizes, drops

    async def _admit(self, n: int, size: int, drops: _Drops) -> tuple[bool, str | None]:
        """Whether ``n`` follow-on jobs fit the tenant's add rate and waiting limit
        (then they are counted), and if not, why the run is retried later (None:
        they could never fit, and are dropped)."""
        client, limits = self._spec.client, self._limits
        try:
            await self._adds.admit(client, n, size)
        except NeverFits as exc:
            if exc.quota == "rate":
                drops.add("rate", n, exc.message)
            else:
                drops.add(
                    "waiting", n, f"{n} is over this tenant's waiting limit of {limits.waiting}"
                )
            return False, None
        except OverRate:
            self._count(client, "rate", n)
            return False, f"its {n} follow-on jobs are over this tenant's add rate; retried later"
        except OverWaiting:
            self._count(client, "waiting", n)
            return False, (
                f"its {n} follow-on jobs are over this tenant's limit of {limits.waiting}"
                " waiting jobs; retried later"
            )
        return True, None

    def _log(self, job_id: str, drops: _Drops) -> None:
        client = self._spec.client
        total = 0
        for reason, n in drops.counts.items():
            self._count(client, reason, n)
            total += n
        logger.warning(
            "dropped %d follow-on job(s) of job %s: %s",
            total,
            job_id,
            "; ".join(drops.problems.values()),
            extra={
                "action": "emit_dropped",
                "tenant": client,
                "job_id": job_id,
                "dropped": total,
            },
        )
