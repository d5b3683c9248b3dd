"""What resolving dependencies changed, told to the queue log and the metrics:
jobs now due (``unblocked``) and jobs failed because a dependency failed (424)."""

from __future__ import annotations

from queue_daemon.domain.jobs import Release, ReleaseHow, Resolution
from queue_daemon.domain.names import JobType
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog

DEPENDENCY_FAILED = 424


class Resolved:
    """The store's ``on_resolved``: called on the event loop, cheap."""

    def __init__(self, queuelog: QueueLog, metrics: Metrics) -> None:
        self._queuelog = queuelog
        self._metrics = metrics

    def __call__(self, resolution: Resolution) -> None:
        if resolution.freed:
            self._queuelog.unblocked(resolution.freed)
            for jobtype in {t for _, t in resolution.freed}:
                client = JobType.parse(jobtype).client
                self._metrics.graph(
                    client, "unblocked", sum(1 for _, t in resolution.freed if t == jobtype)
                )
        by_type: dict[str, list[Release]] = {}
        for job_id, jobtype in resolution.failed:
            by_type.setdefault(jobtype, []).append(
                Release(
                    id=job_id, how=ReleaseHow.ARCHIVE, code="failed", exitcode=DEPENDENCY_FAILED
                )
            )
        for jobtype, releases in by_type.items():
            self._queuelog.finished(jobtype, releases)
            self._metrics.finished(jobtype, releases)
            self._metrics.graph(JobType.parse(jobtype).client, "dependency_failed", len(releases))
