"""Running jobs' progress: the last value each reported (a handler's
``ctx.progress`` or ``P:`` line, a pull worker's renew), written to the store
at most every ``EVERY`` seconds, all of them in one statement, and for a batch's
jobs once more before their release, so the last one is kept when they are done.

Progress is advice, not an outcome: a value the store cannot take (it is
down, or the job moved on) is dropped, never retried, and a job reporting in a
tight loop costs one dict entry here and one row in the next write."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection

from queue_daemon.domain.jobs import Progress
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import JobQueue

logger = logging.getLogger(__name__)

EVERY = 0.5  # seconds between writes
MAX_MESSAGE = 200  # characters of a message kept


def progress_of(job_id: str, lock: str, fraction: object, message: object) -> Progress | None:
    """A report as stored: ``fraction`` a number from 0 to 1 (clamped), ``message``
    text cut to MAX_MESSAGE characters; None when the fraction is not a number."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        return None
    if not math.isfinite(fraction):
        return None
    text = message if isinstance(message, str) else ""
    text = text[:MAX_MESSAGE].replace("\x00", "")
    return Progress(job_id, lock, min(1.0, max(0.0, float(fraction))), text)


class ProgressBoard:
    """The progress not yet written, one entry a job (a service: ``step``)."""

    name = "progress"

    def __init__(self, *, store: JobQueue, sysid: str, every: float = EVERY) -> None:
        self._store = store
        self._sysid = sysid
        self._pending: dict[str, Progress] = {}
        self.every = self.first = every

    def ran(self, job_id: str, fraction: object, message: object) -> None:
        """A report of a job this daemon runs (its lock is the daemon's sysid)."""
        self.note(progress_of(job_id, self._sysid, fraction, message))

    def note(self, progress: Progress | None) -> None:
        if progress is not None:
            self._pending[progress.id] = progress

    def pending(self, ids: Collection[str]) -> bool:
        return bool(self._pending) and any(i in self._pending for i in ids)

    async def step(self) -> None:
        await self.flush()

    async def flush(self, ids: Collection[str] | None = None) -> None:
        """Write what is pending (of ``ids`` only, when given)."""
        if ids is None:
            notes, self._pending = list(self._pending.values()), {}
        else:
            notes = [self._pending.pop(i) for i in ids if i in self._pending]
        if not notes:
            return
        try:
            await self._store.note_progress(notes)
        except StoreError as exc:
            logger.info("progress not written: %s", exc, extra={"action": "progress_dropped"})
