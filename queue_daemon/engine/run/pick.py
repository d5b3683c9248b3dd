"""What waits, per jobtype: read from the store when stale (one read at a time,
shared by the claim loops), kept up to date between reads by the store's
notifications, and narrowed to what a claim loop may pick now."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Set

from queue_daemon.domain.names import JobType
from queue_daemon.store.ports import JobQueue

POLL_S = 1.0  # re-read the waiting jobtypes at least this often (delayed jobs come due)
# The store lists only types with a live handler; one whose handler went since
# (the cache found none) is not picked again for this long.
NO_HANDLER_RECHECK_S = 30.0
READ_CAP = 1000  # a type's waiting jobs are counted up to this many at a read


def _add_counts(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for jobtype, n in counts.items():
        into[jobtype] = into.get(jobtype, 0) + n


class WaitingTypes:
    def __init__(self, store: JobQueue) -> None:
        self._store = store
        self.counts: dict[str, int] = {}
        self._fresh = False
        self._read_at = 0.0
        self._reading: asyncio.Task[None] | None = None
        self._added_while_reading: dict[str, int] = {}
        self._capped: set[str] = set()  # types the last read counted READ_CAP of

    def noted(self, added: Mapping[str, int] | None) -> None:
        """New jobs: ``added`` counts the due ones per jobtype; None when it is not
        known what changed (the store is read again)."""
        if added is None:
            self._fresh = False
        else:
            _add_counts(self.counts, added)
            if self._reading is not None:  # the read may have missed them
                _add_counts(self._added_while_reading, added)

    def claimed(self, jobtype: str, asked: int, got: int) -> None:
        """A claim of ``asked`` jobs of ``jobtype`` took ``got``."""
        left = self.counts.get(jobtype, 0) - got
        if got < asked:
            # none left that was due when it looked (what comes after is notified):
            # the other types' counts stand, and the next claim need not read them
            self.counts.pop(jobtype, None)
            self._capped.discard(jobtype)  # what is noted next is counted exactly
        elif left > 0:
            self.counts[jobtype] = left
        elif jobtype in self._capped:
            # a count the read capped ran out: a cap's worth more, until a claim
            # finds fewer (then it is dropped, above) or the next read counts
            # them (a read after every claim of a deep queue put a round trip to
            # the store between two claims)
            self.counts[jobtype] = READ_CAP
        else:
            # the count ran out, and more may wait: ask the store again
            self.counts.pop(jobtype, None)
            self._fresh = False

    async def get(self) -> dict[str, int]:
        if not self._fresh or time.monotonic() - self._read_at > POLL_S:
            if self._reading is None:
                self._reading = asyncio.create_task(self._read())
            reading = self._reading
            try:
                await asyncio.shield(reading)
            finally:
                if reading.done() and self._reading is reading:
                    self._reading = None
        return self.counts

    async def _read(self) -> None:
        # fresh from the moment the read begins: a "something changed" note
        # arriving during the read makes it stale again, and jobs noted during
        # the read are added to what it returns (it may not see them)
        self._fresh = True
        self._read_at = time.monotonic()
        self._added_while_reading = {}
        try:
            counts = await self._store.waiting_jobtypes(READ_CAP)
        except BaseException:
            self._fresh = False
            raise
        self._capped = {jobtype for jobtype, n in counts.items() if n >= READ_CAP}
        _add_counts(counts, self._added_while_reading)
        self._added_while_reading = {}
        self.counts = counts


def claimable(
    waiting: dict[str, int],
    *,
    no_handler: Mapping[str, float],
    now: float,
    full: Set[str],
    claiming: Set[str],
    learning_full: Set[str],
) -> dict[str, int]:
    """What a claim loop may pick from ``waiting``: not a type found without a handler
    in the last ``NO_HANDLER_RECHECK_S``; not a full tenant's (its other jobs wait for
    one of its own batches to end); not a type being claimed (it waits for that
    claim); not a type running all the learning batches it may."""
    if no_handler:
        cutoff = now - NO_HANDLER_RECHECK_S
        waiting = {t: n for t, n in waiting.items() if no_handler.get(t, 0) < cutoff}
    if full or claiming or learning_full:
        waiting = {
            t: n
            for t, n in waiting.items()
            if t not in claiming and t not in learning_full and JobType.client_of(t) not in full
        }
    return waiting
