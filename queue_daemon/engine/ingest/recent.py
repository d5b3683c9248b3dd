"""The batches an ingester settled lately, kept in memory to be inserted again when
the store turns out to be on a new history.

A flush proves rows durable on the server that ran it. A standby that
replicates asynchronously may lack the last of them when it is promoted; the
journal's read point has passed them, and the journal no longer holds them.
The ingester keeps what it settled in the last ``RECENT_S`` seconds (at most
``RECENT_BYTES``, oldest dropped first) and, once a flush or a check names
another history than the one they were settled on, inserts them again:
idempotent by id, so rows the new primary has are left alone (done ones too)
and only the missing ones come back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from queue_daemon.domain.jobs import NewJob
from queue_daemon.domain.pulled import OptedJobs

RECENT_S = 10.0  # seconds a settled batch is kept: well past an asynchronous standby's lag
RECENT_BYTES = 32 << 20  # at most this much of them (estimated), the oldest dropped first
JOB_BYTES = 300  # a kept job's memory besides its payload (the tuple, its id, its times)


@dataclass(slots=True)
class Recent:
    """A settled batch: its jobs, when it was settled and on which history."""

    at: float  # time.monotonic()
    epoch: str
    jobs: list[NewJob]
    opted: list[OptedJobs]
    dispatched: frozenset[str]
    size: int


class RecentBatches:
    """Settled batches of the last ``seconds``, at most ``limit`` bytes."""

    def __init__(self, seconds: float = RECENT_S, limit: int = RECENT_BYTES) -> None:
        self._seconds = seconds
        self._limit = limit
        self._kept: deque[Recent] = deque()
        self._size = 0

    def __len__(self) -> int:
        return len(self._kept)

    def add(self, now: float, epoch: str, batch: Recent) -> None:
        """Keep ``batch``, settled at ``now`` on ``epoch``."""
        batch.at, batch.epoch = now, epoch
        self._kept.append(batch)
        self._size += batch.size
        self.prune(now)

    def prune(self, now: float) -> bool:
        """Drop what is older than the window or over the limit; whether any is left."""
        kept = self._kept
        while kept and (kept[0].at < now - self._seconds or self._size > self._limit):
            self._size -= kept.popleft().size
        return bool(kept)

    def not_on(self, epoch: str) -> list[Recent]:
        """The batches settled on another history than ``epoch``, oldest first."""
        return [batch for batch in self._kept if batch.epoch != epoch]
