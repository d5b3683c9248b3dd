"""The store's history as an ingester sees it, and the batches it settled lately,
kept in memory to be inserted again when a standby is promoted.

A flush proves rows durable on the server that ran it. A standby that
replicates asynchronously may lack the last of them when it is promoted; the
journal's read point has passed them, and the journal no longer holds them.
So the ingester keeps each batch it settles until the store has been seen
alive on the same history ``RECENT_S`` seconds after (at most ``RECENT_BYTES``
of them, the oldest dropped first): a standby more than that behind is not
covered. When a flush or a check names a new history, every batch settled on
another timeline is inserted again: idempotent by id, so rows the new primary
has are left alone (done ones too) and only the missing ones come back. A
restart on the same timeline (the same server) loses no flushed row, and
inserts nothing again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from queue_daemon.domain.jobs import NewJob
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.journal import Reservation
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import timeline_of

logger = logging.getLogger(__name__)

RECENT_S = 10.0  # seconds of the store seen alive after a batch before it is let go
RECENT_BYTES = 32 << 20  # at most this much of them (estimated), the oldest dropped first
JOB_BYTES = 300  # a kept job's memory besides its payload (the tuple, its id, its times)


class Settled(Protocol):
    """What the ingester settled: a batch's jobs."""

    @property
    def jobs(self) -> list[NewJob]: ...

    @property
    def opted(self) -> list[OptedJobs]: ...

    @property
    def dispatched(self) -> frozenset[str]: ...


# inserts a batch again until it is durable; the epoch it is durable on
Reinsert = Callable[[list[NewJob], list[OptedJobs], frozenset[str]], Awaitable[str]]


@dataclass(slots=True)
class Recent:
    """A settled batch: its jobs, when it was settled and on which history."""

    at: float  # time.monotonic()
    epoch: str
    jobs: list[NewJob]
    opted: list[OptedJobs]
    dispatched: frozenset[str]
    size: int

    @property
    def job_count(self) -> int:
        return len(self.jobs) + sum(len(o.jobs) for o in self.opted)


class History:
    """The epoch of the last flush, and the batches settled lately."""

    def __init__(
        self, reinsert: Reinsert, seconds: float = RECENT_S, limit: int = RECENT_BYTES
    ) -> None:
        self._reinsert = reinsert
        self._seconds = seconds
        self._limit = limit
        self._kept: deque[Recent] = deque()
        self._size = 0
        self.epoch: str | None = None  # of the last flush
        self.replaying = False
        # a kept batch may be on another epoch than ``epoch``: only then does a
        # look at the history walk them all (one a settled add: thousands are kept)
        self._others = False

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, batch: Recent) -> None:
        """``batch`` is settled, durable on ``batch.epoch`` since ``batch.at``."""
        self._kept.append(batch)
        self._others = self._others or batch.epoch != self.epoch
        self._size += batch.size
        while self._size > self._limit:
            self._size -= self._kept.popleft().size

    def keep_settled(
        self, now: float, epoch: str, reservation: Reservation, batch: Settled
    ) -> None:
        """Keep a batch of ``reservation`` settled at ``now``, durable on ``epoch``."""
        size = sum(b.body_len for b in reservation.batches) + JOB_BYTES * reservation.lines
        self.keep(Recent(now, epoch, batch.jobs, batch.opted, batch.dispatched, size))

    async def check(self, flush: Callable[[], Awaitable[str]]) -> None:
        """One ``flush``, to see the store's history (and insert again what a
        promoted standby may lack); a store away is looked at again later."""
        sent = time.monotonic()
        with contextlib.suppress(StoreError):
            await self.seen(await flush(), sent)

    async def seen(self, epoch: str, alive_at: float) -> None:
        """A flush sent at ``alive_at`` (or later) ran on ``epoch``. On a new history,
        say so; insert again what was settled on another timeline, and count the
        kept batches' time on the new history from now."""
        while epoch != self.epoch or self._others:
            if self.epoch is not None and epoch != self.epoch:
                logger.warning(
                    "the store is on a new history (restarted or failed over): %s, was %s",
                    epoch,
                    self.epoch,
                    extra={"action": "store_history", "epoch": epoch, "was": self.epoch},
                )
            self.epoch = epoch
            self._others = False  # (a batch kept during the inserts below sets it again)
            replay = []
            for batch in self._kept:
                if batch.epoch == epoch:
                    continue
                if timeline_of(batch.epoch) != timeline_of(epoch):
                    replay.append(batch)
                else:  # a restart: flushed rows survive it, not yet on a standby
                    batch.epoch, batch.at = epoch, max(batch.at, alive_at)
            if not replay:
                break
            logger.warning(
                "a standby was promoted: inserting again the %d jobs settled lately",
                sum(batch.job_count for batch in replay),
                extra={"action": "ingest_replay"},
            )
            self.replaying = True
            try:
                for batch in replay:
                    before = time.monotonic()
                    batch.epoch = await self._reinsert(batch.jobs, batch.opted, batch.dispatched)
                    batch.at = time.monotonic()
                    if batch.epoch != epoch:  # it moved again meanwhile
                        epoch, alive_at = batch.epoch, before
                    if batch.epoch != self.epoch:  # (compared again on a later look)
                        self._others = True
            finally:
                self.replaying = False
            if epoch == self.epoch:
                break
        kept = self._kept
        while kept and kept[0].at < alive_at - self._seconds:
            self._size -= kept.popleft().size
