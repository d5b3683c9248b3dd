"""The payload of the ``qd_jobs`` notification: which jobs were just added.

A daemon woken by it adds the counts to what it knows is waiting, instead of
asking the store again (one round trip less between an add and its start).
An empty payload means "anything may have changed": read the waiting types
again. Jobs that are not due yet are left out; a daemon finds them when it
next reads the waiting types (at least once a second). Jobtype names hold no
spaces or ``=`` (``queue_daemon.domain.names.TYPE_RE``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from queue_daemon.domain.jobs import NewJob

# PostgreSQL refuses payloads of 8000 bytes or more; beyond this, say "re-read"
MAX_PAYLOAD = 7000


def added_payload(jobs: Iterable[NewJob]) -> str:
    """The payload for ``jobs`` just inserted: the due ones counted per jobtype."""
    now = datetime.now(UTC)
    counts: dict[str, int] = {}
    for job in jobs:
        if job.dt <= now:
            counts[job.type] = counts.get(job.type, 0) + 1
    payload = " ".join(f"{jobtype}={n}" for jobtype, n in counts.items())
    return payload if len(payload) <= MAX_PAYLOAD else ""


def parse_payload(payload: str) -> dict[str, int] | None:
    """The due jobs added per jobtype; None when the payload does not say
    (empty, or not in this format): read the waiting types again."""
    counts: dict[str, int] = {}
    for part in payload.split():
        jobtype, sep, n = part.rpartition("=")
        if not sep or not jobtype or not n.isdigit():
            return None
        counts[jobtype] = counts.get(jobtype, 0) + int(n)
    return counts or None
