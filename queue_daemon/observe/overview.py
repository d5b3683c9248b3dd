"""The dashboard's data: depth and throughput per tenant and type, running jobs,
recent failures and daemons, as one JSON body.

Every list is bounded and every count is read from an index or a counter
table (``queue_daemon.store.queries``, "the dashboard"), so a page polling every two
seconds costs the store the same with a thousand or a billion archived jobs.
Bodies are kept for ``CACHE_S`` per scope, so any number of open pages cost
one set of queries a second.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from queue_daemon.domain.names import JobType, iso
from queue_daemon.domain.views import DaemonLease, FailedJob, QueueDepth, RunningJob, WorkerSeen
from queue_daemon.observe.throughput import Throughput
from queue_daemon.store.ports import Dashboard

MAX_QUEUES = 1000  # types listed at most; "queues_cut" says when there were more
COUNT_CAP = 10_000  # waiting (and scheduled) jobs counted per type at most; "capped" beyond
MAX_DAEMONS = 100
MAX_WORKERS = 200  # listed at most; "workers_cut" says when there were more
DEFAULT_LIMIT = 50  # running jobs and failures listed, unless ?limit= says otherwise
MAX_LIMIT = 500
RESULT_CHARS = 500  # of a failure's result
CACHE_S = 1.0
_CACHE_ENTRIES = 1024


def _split(stored_type: str) -> tuple[str, str]:
    jobtype = JobType.parse(stored_type)
    return jobtype.client, jobtype.name


class Overview:
    """Builds (and briefly caches) the overview of every tenant or of one."""

    def __init__(self, store: Dashboard, throughput: Throughput, sysid: str) -> None:
        self.store = store
        self.throughput = throughput
        self.sysid = sysid
        self._cache: dict[tuple[str | None, int, str | None], tuple[float, dict[str, Any]]] = {}

    async def body(
        self, client: str | None, limit: int = DEFAULT_LIMIT, *, failed_type: str | None = None
    ) -> dict[str, Any]:
        """The overview of ``client``'s queues, or of every tenant's when None;
        its failures those of the stored type ``failed_type`` only, when given."""
        key = (client, limit, failed_type)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < CACHE_S:
            return cached[1]
        body = await self._build(client, limit, failed_type)
        if len(self._cache) >= _CACHE_ENTRIES:
            self._cache.clear()
        self._cache[key] = (now, body)
        return body

    async def _build(
        self, client: str | None, limit: int, failed_type: str | None
    ) -> dict[str, Any]:
        store = self.store
        depths, running, failures, daemons, workers = await asyncio.gather(
            store.queue_depths(client, MAX_QUEUES + 1, COUNT_CAP),
            store.running_jobs(client, limit),
            store.recent_failures(client, limit, RESULT_CHARS, type=failed_type),
            store.daemon_leases(MAX_DAEMONS),
            store.workers(client),
        )
        now = datetime.now(UTC)
        return {
            "scope": "operator" if client is None else "tenant",
            "client": client,
            "sysid": self.sysid,
            "now": iso(now),
            "step_s": self.throughput.step,
            "queues": [self._queue(d) for d in depths[:MAX_QUEUES]],
            "queues_cut": len(depths) > MAX_QUEUES,
            "running": {
                "total": running.total,
                "oldest": [_running(job, now) for job in running.oldest],
            },
            "failures": [_failure(job) for job in failures],
            "failures_of": None if failed_type is None else "/".join(_split(failed_type)),
            "daemons": [_daemon(lease, operator=client is None) for lease in daemons],
            "workers": [_worker(seen) for seen in workers[:MAX_WORKERS]],
            "workers_cut": len(workers) > MAX_WORKERS,
        }

    def _queue(self, depth: QueueDepth) -> dict[str, Any]:
        client, jobtype = _split(depth.type)
        per_s, series = self.throughput.of(depth.type)
        return {
            "client": client,
            "type": jobtype,
            "waiting": depth.waiting,
            "scheduled": depth.scheduled,
            "blocked": depth.blocked,
            "capped": depth.capped,
            "running": depth.running,
            "done_ok": depth.done_ok,
            "done_failed": depth.done_failed,
            "done_error": depth.done_error,
            "paused": depth.paused,
            "per_s": per_s,
            "throughput": series,
        }


def _running(job: RunningJob, now: datetime) -> dict[str, Any]:
    client, jobtype = _split(job.type)
    return {
        "id": job.id,
        "client": client,
        "type": jobtype,
        "sysid": job.sysid,
        "attempts": job.attempts,
        "create_dt": iso(job.create_dt),
        "age_s": round(max((now - job.create_dt).total_seconds(), 0.0), 1),
        "lease_until": iso(job.lease_until),
    }


def _worker(seen: WorkerSeen) -> dict[str, Any]:
    return {
        "client": seen.client,
        "name": seen.name,
        "live": seen.live,
        "holding": seen.holding,
        "last_seen": iso(seen.last_seen),
        "done_ok": seen.done_ok,
        "done_failed": seen.done_failed,
        "done_error": seen.done_error,
    }


def _failure(job: FailedJob) -> dict[str, Any]:
    client, jobtype = _split(job.type)
    return {
        "id": job.id,
        "client": client,
        "type": jobtype,
        "code": job.code,
        "exitcode": job.exitcode,
        "attempts": job.attempts,
        "create_dt": iso(job.create_dt),
        "done_dt": iso(job.done_dt),
        "result": job.result,
        "result_cut": job.result_cut,
    }


def _daemon(lease: DaemonLease, *, operator: bool) -> dict[str, Any]:
    """A tenant sees which daemons exist and whether they live; where they run
    (host, data directory) is the operator's business."""
    body: dict[str, Any] = {
        "sysid": lease.sysid,
        "state": lease.state,
        "expires": iso(lease.expires),
        "expires_in_s": None
        if lease.expires is None
        else round((lease.expires - lease.now).total_seconds(), 1),
        "released_at": iso(lease.released_at),
    }
    if operator:
        body["host"] = lease.host
        body["data_dir"] = lease.data_dir
    return body
