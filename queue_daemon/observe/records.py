"""The queue logfile's records: one schema for the writer (``observe.queuelog``)
and the readers (``tools.analytics`` and the HTML report).

Every record is one JSON object on one line, beginning with the same four
fields, ``{"ev": kind, "t": epoch ms, "tenant": client, "type": name, …}``,
then the fields of its kind (``FIELDS``). Lines written before records had a
``tenant`` carry the stored ``client-type`` in ``type``; ``read_head`` reads
both. Rotated files may be gzipped (``GZIP_MAGIC``).
"""

from __future__ import annotations

import enum
from typing import Any

import orjson

from queue_daemon.domain.names import JobType

GZIP_MAGIC = b"\x1f\x8b"


class Ev(enum.StrEnum):
    ADDED = "added"  # a job accepted (an add or a follow-on job)
    STARTED = "started"  # a job claimed to run
    FINISHED = "finished"  # a run ended: archived, retried or put back
    RETRY = "retry"  # a job that will run again, and when
    EXPIRED = "expired"  # a lease ran out; the job waits again
    LOST_LEASE = "lost-lease"  # a run ended after its daemon lost the lease: outcome discarded
    CANCELLED = "cancelled"  # a waiting job cancelled by its tenant
    PURGED = "purged"  # archived jobs deleted after the retention time, counted
    LOG = "log"  # what a run printed that was neither a follow-on job nor a status
    TICK = "tick"  # a schedule's tick added as a job
    BLOCKED = "blocked"  # a job added to wait for other jobs
    UNBLOCKED = "unblocked"  # its dependencies are done: it is due
    DEADLINE = "deadline"  # its deadline passed before it was done: failed, 408


HEAD = ("ev", "t", "tenant", "type")
FIELDS: dict[Ev, tuple[str, ...]] = {
    Ev.ADDED: ("id", "size", "sysid", "dt"),
    Ev.STARTED: ("id", "attempt", "sysid", "wait_ms"),
    Ev.FINISHED: ("id", "attempt", "sysid", "code", "exitcode", "run_ms", "how"),
    Ev.RETRY: ("id", "attempt", "sysid", "code", "exitcode", "delay_ms", "dt"),
    Ev.EXPIRED: ("id", "attempt", "sysid"),
    Ev.LOST_LEASE: ("id", "attempt", "sysid", "code", "exitcode", "run_ms"),
    Ev.CANCELLED: ("id", "sysid"),
    Ev.PURGED: ("n", "sysid"),
    Ev.LOG: ("id", "lines"),  # no sysid: the daemon that ran it is in the started line
    Ev.TICK: ("id", "schedule", "tick", "catchup", "sysid"),
    Ev.BLOCKED: ("id", "after", "sysid"),
    Ev.UNBLOCKED: ("id", "sysid"),
    Ev.DEADLINE: ("id", "running", "sysid"),
}


def record_head(ev: Ev, at_ms: int, jobtype: str) -> str:
    """The start of a record of ``jobtype`` (stored ``client-type``), up to the
    fields of its kind: the writer appends those and the closing brace."""
    tenant, name = JobType.parse(jobtype)
    return f'{{"ev":"{ev.value}","t":{at_ms},"tenant":"{tenant}","type":"{name}"'


def read_head(raw: bytes) -> tuple[str, int, str, str, dict[str, Any]] | None:
    """``(ev, t, tenant, type, record)`` of a line, or None when it is not a queue log
    record (a torn last line, garbage)."""
    try:
        record = orjson.loads(raw)
        ev = record["ev"]
        t = record["t"]
        name = record["type"]
        tenant = record.get("tenant")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    if type(t) is not int or type(ev) is not str or type(name) is not str:
        return None
    if tenant is None:  # lines of earlier versions: type "client-type"
        tenant, name = JobType.parse(name)
    return ev, t, tenant, name, record
