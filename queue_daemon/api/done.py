"""The routes on a tenant's done jobs (docs/api.md): a rerun of one, and the
bulk calls, bounded per call, that rerun the failed ones or delete them early."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize
from queue_daemon.api.errors import ApiError
from queue_daemon.api.jobs import job_body, job_id_of
from queue_daemon.api.web import SERVICES, json_response, parse_when
from queue_daemon.domain.names import JobType, valid_type
from queue_daemon.store.errors import Conflict, NotFound

DELETE_CHUNK = 1000  # rows a statement
DELETE_MAX = 10_000  # rows a call
DELETE_TIME_S = 1.0  # a call stops after about this long; the reply says there is more


async def delete_jobs(request: web.Request) -> web.Response:
    """Delete a tenant's done jobs early: ``state=done`` (required), ``type``,
    ``before`` (ISO-8601 or epoch ms, default now). Bounded per call: ``more``
    says to call again."""
    services = request.app[SERVICES]
    client = await authorize(request, services)
    query = request.query
    if query.get("state") != "done":
        raise errors.bad_request(
            "state=done is required: only done jobs can be deleted (cancel a waiting one first)"
        )
    stored, before = _done_filters(client, query)
    deleted = 0
    more = True
    ends = time.monotonic() + DELETE_TIME_S
    while more and deleted < DELETE_MAX and time.monotonic() < ends:
        counts = await services.jobs.delete_done(
            client, type=stored, before=before, limit=DELETE_CHUNK
        )
        if counts:
            services.queuelog.purged(counts)
        chunk = sum(counts.values())
        deleted += chunk
        more = chunk == DELETE_CHUNK
    return json_response({"deleted": deleted, "more": more})


async def rerun_job(request: web.Request) -> web.Response:
    """A done job (any outcome) waits again, with fresh attempts; its runs are kept."""
    services = request.app[SERVICES]
    client = await authorize(request, services)
    job_id = job_id_of(request)
    adds = services.adds
    if not adds.take_reruns(client, 1):
        raise errors.rate_limited("over this tenant's add rate", adds.rerun_wait(client))
    try:
        job = await services.jobs.rerun_job(client, job_id)
    except NotFound:
        adds.refund_reruns(client, 1)
        raise errors.not_found("no such job (or not yet in the store)") from None
    except Conflict as exc:
        adds.refund_reruns(client, 1)
        raise ApiError(409, "conflict", f"only a done job can be rerun: {exc}") from None
    services.metrics.rerun(JobType(client, job.type).stored, 1)
    return json_response(job_body(job))


RERUN_CODES = ("failed", "error")


async def rerun_jobs(request: web.Request) -> web.Response:
    """Rerun a tenant's failed or errored jobs: ``code`` (failed or error, default
    both), ``type``, ``before`` (ISO-8601 or epoch ms, default now). Bounded per
    call as a delete is: ``more`` says to call again."""
    services = request.app[SERVICES]
    client = await authorize(request, services)
    query = request.query
    code = query.get("code") or None
    if code is not None and code not in RERUN_CODES:
        raise errors.bad_request("code must be failed or error (a bulk rerun takes no ok jobs)")
    stored, before = _done_filters(client, query)
    adds = services.adds
    rerun = 0
    more = True
    ends = time.monotonic() + DELETE_TIME_S
    while more and rerun < DELETE_MAX and time.monotonic() < ends:
        allowed = adds.take_reruns(client, DELETE_CHUNK)  # each one counts as an add
        if not allowed:
            if not rerun:
                raise errors.rate_limited("over this tenant's add rate", adds.rerun_wait(client))
            break
        try:
            counts = await services.jobs.rerun_done(
                client,
                type=stored,
                codes=RERUN_CODES if code is None else (code,),
                before=before,
                limit=allowed,
            )
        except BaseException:
            adds.refund_reruns(client, allowed)
            raise
        for jobtype, n in counts.items():
            services.metrics.rerun(jobtype, n)
        chunk = sum(counts.values())
        adds.refund_reruns(client, allowed - chunk)
        rerun += chunk
        more = chunk == allowed
    return json_response({"rerun": rerun, "more": more})


def _done_filters(client: str, query: Any) -> tuple[str | None, datetime]:
    """The stored ``type`` (or None: any) and ``before`` of a bulk call on done jobs."""
    jobtype = query.get("type") or None
    if jobtype is not None and not valid_type(jobtype):
        raise errors.bad_name("type must match [A-Za-z0-9_.:-]{1,100}")
    now_ms = time.time_ns() // 1_000_000
    before_ms = now_ms if "before" not in query else parse_when({"dt": query["before"]}, now_ms)
    before = datetime.fromtimestamp(min(before_ms, now_ms) / 1000, UTC)
    return (None if jobtype is None else JobType(client, jobtype).stored), before
