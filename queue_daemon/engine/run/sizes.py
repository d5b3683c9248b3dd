"""How many jobs of a type one batch takes, learnt from how long its jobs run.

A batch runs its jobs one after another in one context: aim for batches that
take about ``BATCH_TARGET_S``, so fast handlers get big batches (few round
trips) and slow ones small batches (jobs spread over many contexts, short
waits), and that carry about ``BATCH_BYTES`` of payloads at most, so a type
of big payloads (up to ``--payload-limit`` each) is claimed a few at a time
(the daemon's memory stays bounded by the batches it runs at once). A type
whose run time is not known yet runs batches of ``FIRST_BATCH``, at most
``LEARNING_BATCHES`` at once, each in its own context. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable

BATCH_TARGET_S = 0.1
BATCH_BYTES = 16 << 20  # payload characters a batch aims to stay under (learnt mean per job)
FIRST_BATCH = 1  # jobs of a type whose run time is not known yet
LEARNING_BATCHES = 4  # such batches running at once


class BatchSizes:
    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._job_seconds: dict[str, float] = {}  # moving average of a job's run time
        self._job_bytes: dict[str, float] = {}  # moving average of a job's payload bytes
        self.learning: dict[str, int] = {}  # types still learning -> batches running

    def may_claim(self, jobtype: str) -> bool:
        """False while the type already runs all the learning batches it may."""
        return self.learning.get(jobtype, 0) < LEARNING_BATCHES

    def learning_full(self) -> set[str]:
        """Types running all the learning batches they may."""
        return {t for t, n in self.learning.items() if n >= LEARNING_BATCHES}

    def size(self, jobtype: str) -> int:
        """The size of the next batch of ``jobtype``; a learning batch is counted
        until ``done`` is called for it."""
        per_job = self._job_seconds.get(jobtype)
        if per_job is None:
            self.learning[jobtype] = self.learning.get(jobtype, 0) + 1
            return FIRST_BATCH
        by_time = int(BATCH_TARGET_S / max(per_job, 1e-6))
        by_bytes = int(BATCH_BYTES / max(self._job_bytes.get(jobtype, 0.0), 1.0))
        return max(1, min(self.max_batch, by_time, by_bytes))

    def done(self, jobtype: str) -> None:
        """A batch of ``jobtype`` ended (or its claim found nothing)."""
        left = self.learning.get(jobtype, 0) - 1
        if left > 0:
            self.learning[jobtype] = left
        else:
            self.learning.pop(jobtype, None)

    def timed(self, jobtype: str, seconds: float, count: int, payload_bytes: int = 0) -> None:
        """A batch of ``count`` jobs took ``seconds`` and carried ``payload_bytes``."""
        _average(self._job_seconds, jobtype, seconds / count)
        _average(self._job_bytes, jobtype, payload_bytes / count)


def ran_seconds(run_ms: Iterable[float | None], elapsed: float) -> float:
    """How long a batch's jobs ran, for ``timed``: the sum of their runs' own times
    where the runner measured each (python and node), else the batch's
    ``elapsed``, which holds a cold context's start (a first batch of one no-op
    job took 70 ms, and the batches after it were sized for 70 ms jobs while that
    average came down)."""
    total = 0.0
    for ms in run_ms:
        if ms is None:
            return elapsed
        total += ms
    return total / 1000


def _average(means: dict[str, float], jobtype: str, value: float) -> None:
    old = means.get(jobtype)
    means[jobtype] = value if old is None else 0.5 * (old + value)
