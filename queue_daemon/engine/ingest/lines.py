"""Journal lines as the store's new jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from queue_daemon.domain.jobs import NewJob
from queue_daemon.domain.options import JobOptions
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.journal import Entry

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def split_opted(entries: list[Entry]) -> tuple[list[Entry], list[OptedJobs]]:
    """The entries without options, and those with options grouped by their add
    (consecutive lines of one type and the same options)."""
    if not any(e.opts for e in entries):  # nearly always: one pass, no copies
        return entries, []
    plain = [e for e in entries if not e.opts]
    groups: list[OptedJobs] = []
    key: tuple[str, str] | None = None
    for e in entries:
        if not e.opts:
            continue
        if (e.type, e.opts) != key:
            key = (e.type, e.opts)
            options = JobOptions.parse(e.opts)
            deadline = options.deadline_ms
            groups.append(
                OptedJobs(
                    jobs=[],
                    after=list(options.after),
                    resolve_any=options.resolve_any,
                    deadline=None if deadline is None else EPOCH + timedelta(milliseconds=deadline),
                    priority=options.priority,
                    key=options.key,
                    trace=options.trace,
                )
            )
        groups[-1].jobs.extend(to_new_jobs([e]))
    return plain, groups


def to_new_jobs(entries: list[Entry]) -> list[NewJob]:
    # A batch's lines share a handful of timestamps: convert each distinct one once.
    stamps: dict[int, datetime] = {}
    jobs = []
    for e in entries:
        dt = stamps.get(e.dt_ms)
        if dt is None:
            dt = stamps[e.dt_ms] = EPOCH + timedelta(milliseconds=e.dt_ms)
        created = stamps.get(e.create_ms)
        if created is None:
            created = stamps[e.create_ms] = EPOCH + timedelta(milliseconds=e.create_ms)
        jobs.append(NewJob(id=e.id, type=e.type, dt=dt, data=e.payload, create_dt=created))
    return jobs


class _AddTrace(NamedTuple):
    id: str  # its first job's
    trace: str | None


def opted_traces(groups: list[OptedJobs]) -> list[_AddTrace]:
    """The traced adds among ``groups``, named by their first job (observe.tracing)."""
    return [_AddTrace(g.jobs[0].id, g.trace) for g in groups if g.trace is not None and g.jobs]
