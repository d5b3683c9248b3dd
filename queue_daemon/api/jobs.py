"""The job routes of docs/api.md: add, get, cancel, list, stats."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize
from queue_daemon.api.blobs import address, blob_read
from queue_daemon.api.errors import ApiError
from queue_daemon.api.web import (
    MAX_DELAY_S,
    SERVICES,
    Services,
    jobtype_of,
    json_response,
    parse_when,
    read_body,
    split_payloads,
)
from queue_daemon.domain.jobs import Job, JobState
from queue_daemon.domain.names import JobType, iso, valid_type
from queue_daemon.domain.options import (
    ID_RE,
    MAX_AFTER,
    NO_OPTIONS,
    PRIORITIES,
    JobOptions,
    valid_key,
)
from queue_daemon.domain.options import MAX_KEY as MAX_CKEY
from queue_daemon.domain.views import Paused, TypeStats
from queue_daemon.engine.admit.ids import MAX_KEY
from queue_daemon.engine.backoff import Backoff
from queue_daemon.engine.pull.holds import RECHECK_S
from queue_daemon.observe.tracing import Attributes, end, traceparent_of, valid_traceparent
from queue_daemon.store.errors import BadCursor, Conflict, NotFound, StoreUnavailable

logger = logging.getLogger(__name__)

MAX_WAIT_S = 60.0  # the longest a GET of a job is held (wait=)
NO_JOBS = TypeStats()  # the counts of a paused type without jobs


async def add_jobs(request: web.Request) -> web.Response:
    """Parse, call the engine's ``Adds``, reply; its refusals become errors in
    ``web.error_middleware``."""
    began = time.perf_counter()
    services = request.app[SERVICES]
    client = await authorize(request, services)
    jobtype = jobtype_of(request)
    query = request.query
    now_ms = time.time_ns() // 1_000_000
    dt_ms = parse_when(query, now_ms)
    options = parse_options(query, now_ms)
    key = _idempotency_key(request)
    adds = services.adds
    adds.check(client, request.content_length)
    body = await read_body(request, client, services.settings.body_limit)
    content_type = request.content_type
    if "input" in query:
        body = await _input(services, client, query["input"], body)
        content_type = "text/plain"  # the blob is one payload, never a JSON array of them
    lines = split_payloads(body, content_type, services.limits.of(client).payload)
    span = None
    if services.tracing.on:  # the add's span, a child of the caller's; its jobs keep it
        caller = valid_traceparent(request.headers.get("traceparent"))
        attributes: Attributes = {
            "queue.tenant": client,
            "queue.type": jobtype,
            "queue.jobs": len(lines),
        }
        span = services.tracing.span("queue.add", caller, attributes=attributes, server=True)
        options = replace(options, trace=traceparent_of(span))
    try:
        added = await adds.add(
            client,
            jobtype,
            lines,
            size=len(body),
            create_ms=now_ms,
            dt_ms=dt_ms,
            options=options,
            key=key,
        )
    except BaseException as exc:
        end(span, error=type(exc).__name__)
        raise
    end(span)
    services.metrics.add_took(time.perf_counter() - began)
    return json_response({"ids": added.ids})


async def _input(services: Services, client: str, addr: str, body: bytes) -> bytes:
    """The payload of an add with ``?input=``: the blob's bytes, one line of text."""
    address(addr)
    if body:
        raise errors.bad_request("an add with input has an empty body: the blob is its payload")
    async with blob_read():
        data = await services.blobs.read_blob(client, addr)
    if data is None:
        raise errors.not_found(f"this tenant has no blob {addr}")
    if data.endswith(b"\n"):
        data = data[:-1].removesuffix(b"\r")
    if b"\n" in data:
        raise errors.bad_payload(
            "the blob holds more than one line: a job's payload is one line of text"
        )
    if not data:
        raise errors.bad_payload("the blob is empty")
    return data


REQUIRES = {"all-completed": False, "all-resolved": True}
_INTEGER = re.compile(r"[+-]?[0-9]{1,6}")


def parse_options(query: Any, now_ms: int) -> JobOptions:
    """``after``, ``requires``, ``deadline``, ``priority`` and ``key`` of an add
    (docs/api.md), or ApiError."""
    after: tuple[str, ...] = ()
    text = query.get("after")
    deadline = query.get("deadline")
    if (
        text is None
        and deadline is None
        and "requires" not in query
        and "priority" not in query
        and "key" not in query
    ):
        return NO_OPTIONS  # nearly every add
    if text is not None:
        after = tuple(dict.fromkeys(i for i in text.split(",") if i))
        if not after or not all(ID_RE.fullmatch(i) for i in after):
            raise errors.bad_request("after must be job ids separated by commas")
        if len(after) > MAX_AFTER:
            raise errors.bad_request(f"a job may depend on at most {MAX_AFTER} jobs")
    requires = query.get("requires", "all-completed")
    if requires not in REQUIRES:
        raise errors.bad_request("requires must be all-completed or all-resolved")
    if "requires" in query and not after:
        raise errors.bad_request("requires applies to jobs added with after")
    deadline_ms = None if deadline is None else _deadline_ms(deadline, now_ms)
    return JobOptions(after, REQUIRES[requires], deadline_ms, _priority(query), _key(query))


def _key(query: Any) -> str | None:
    key = query.get("key")
    if key is None:
        return None
    if not valid_key(key):
        raise errors.bad_request(f"key must be 1 to {MAX_CKEY} printable characters")
    return str(key)


def _priority(query: Any) -> int:
    text = query.get("priority")
    if text is None:
        return 0
    if _INTEGER.fullmatch(text) and int(text) in PRIORITIES:
        return int(text)
    first, last = PRIORITIES.start, PRIORITIES.stop - 1
    raise errors.bad_request(f"priority must be an integer from {first} to {last}")


def _deadline_ms(text: str, now_ms: int) -> int:
    """Seconds from now (a number below 10^10), epoch milliseconds, or ISO-8601."""
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None:
        if not math.isfinite(number) or number <= 0:
            raise errors.bad_request("deadline must be in the future")
        when = now_ms + int(number * 1000) if number < 1e10 else int(number)
    else:
        try:
            when = parse_when({"dt": text}, now_ms)
        except ApiError:
            raise errors.bad_request(
                "deadline must be seconds from now, epoch milliseconds or ISO-8601"
            ) from None
    if when <= now_ms:
        raise errors.bad_request("deadline must be in the future")
    if when > now_ms + MAX_DELAY_S * 1000:
        raise errors.bad_request("deadline is more than 10 years ahead")
    return when


def _idempotency_key(request: web.Request) -> str | None:
    """The add's ``Idempotency-Key`` (1 to 200 printable characters), or None."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_KEY or not key.isprintable():
        raise errors.bad_request(f"Idempotency-Key must be 1 to {MAX_KEY} printable characters")
    return key


def job_body(job: Job) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": job.id,
        "type": job.type,
        "state": job.state.value,
        # a done or blocked job's stored dt keeps it out of every claim: no next run
        "dt": None if job.state in (JobState.DONE, JobState.BLOCKED) else iso(job.dt),
        "create_dt": iso(job.create_dt),
        "done_dt": iso(job.done_dt),
        "attempts": job.attempts,
        "code": job.code,
        "exitcode": job.exitcode,
        "result": job.result,
        "payload": job.data,
        "priority": job.priority,
        "key": job.key,
        "progress": job.progress,
    }
    if job.runs is not None:  # a GET of the job: its runs and its last run's log
        body["runs"] = [_run(run) for run in job.runs]
        body["log"] = job.log
    return body


def _run(run: dict[str, object]) -> dict[str, object]:
    """A run as the API shows it: its times as ISO-8601 (stored as epoch ms)."""
    return {
        **run,
        "started": _ms_iso(run.get("started")),
        "ended": _ms_iso(run.get("ended")),
    }


def _ms_iso(ms: object) -> str | None:
    if not isinstance(ms, int):
        return None
    return iso(datetime.fromtimestamp(ms / 1000, UTC))


def job_id_of(request: web.Request) -> str:
    job_id = request.match_info["id"]
    # every id this daemon gives out is short printable ASCII; anything else (a NUL,
    # a lone surrogate from the URL's percent-decoding) would only trouble the store
    if len(job_id) > 200 or not (job_id.isascii() and job_id.isprintable()):
        raise errors.not_found("no such job")
    return job_id


async def get_job_body(services: Services, client: str, job_id: str) -> dict[str, Any]:
    try:
        return job_body(await services.jobs.get_job(client, job_id))
    except NotFound:
        raise errors.not_found("no such job (or not yet in the store)") from None


async def get_job(request: web.Request) -> web.Response:
    """The job; with ``wait=S`` (0 to 60) held until it is done or S runs out."""
    services = request.app[SERVICES]
    client = await authorize(request, services)
    job_id = job_id_of(request)
    wait = _wait_of(request)
    if not wait:
        return json_response(await get_job_body(services, client, job_id))
    now = time.monotonic()
    deadline, unseen_until = now + wait, now + min(wait, NOT_YET_S)
    unseen = Backoff(NOT_YET_FIRST_S, NOT_YET_MAX_S)
    while True:
        try:
            job = await services.jobs.get_job(client, job_id)
        except NotFound:
            # acknowledged here a moment ago, perhaps, and not yet in the store
            if not services.journal.lag.unread_lines or time.monotonic() >= unseen_until:
                raise errors.not_found("no such job (or not yet in the store)") from None
            await unseen.sleep()
            continue
        except StoreUnavailable:
            # held through a store away for less than the wait (a restart, a failover)
            left = deadline - time.monotonic()
            if left <= 0 or services.done_waits.closed:
                raise
            await asyncio.sleep(min(left, RECHECK_S))
            continue
        left = deadline - time.monotonic()
        if job.state is JobState.DONE or left <= 0 or services.done_waits.closed:
            return json_response(job_body(job))
        await services.done_waits.wait(job_id, JobType(client, job.type).stored, left)


NOT_YET_S = 5.0  # how long a held GET waits for a job id to reach the store
NOT_YET_FIRST_S = 0.02
NOT_YET_MAX_S = 0.5


def _wait_of(request: web.Request) -> float:
    text = request.query.get("wait")
    if text is None:
        return 0.0
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not math.isfinite(wait) or not 0 <= wait <= MAX_WAIT_S:
        raise errors.bad_request(f"wait must be a number of seconds from 0 to {MAX_WAIT_S:g}")
    return wait


async def cancel_job(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    try:
        job = await services.jobs.cancel_job(client, job_id_of(request))
    except NotFound:
        raise errors.not_found("no such job (or not yet in the store)") from None
    except Conflict:
        raise ApiError(
            409, "conflict", "the job is done: only a job not done can be cancelled"
        ) from None
    services.queuelog.cancelled(JobType(client, job.type).stored, job.id)
    return json_response(job_body(job))


async def list_jobs(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    query = request.query
    jobtype = query.get("type") or None
    if jobtype is not None and not valid_type(jobtype):
        raise errors.bad_name("type must match [A-Za-z0-9_.:-]{1,100}")
    state_text = query.get("state") or None
    state = None
    if state_text is not None:
        try:
            state = JobState(state_text)
        except ValueError:
            raise errors.bad_request("state must be blocked, waiting, running or done") from None
    limit_text = query.get("limit", "100")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= 1000:
        raise errors.bad_request("limit must be an integer from 1 to 1000")
    try:
        after = query.get("after") or None
        page = await services.reads.get(
            ("jobs", client, jobtype, state, limit_text, after),
            lambda: services.jobs.list_jobs(
                client, type=jobtype, state=state, limit=int(limit_text), after=after
            ),
        )
    except BadCursor:
        raise errors.bad_request("after is not a cursor this daemon gave out") from None
    return json_response({"jobs": [job_body(job) for job in page.jobs], "next": page.next})


def _stats_body(stats: TypeStats, paused: bool) -> dict[str, int | bool]:
    return {
        "waiting": stats.waiting,
        "scheduled": stats.scheduled,
        "blocked": stats.blocked,
        "running": stats.running,
        "done_ok": stats.done_ok,
        "done_failed": stats.done_failed,
        "done_error": stats.done_error,
        "paused": paused,
    }


async def _stats_read(services: Services, client: str) -> tuple[dict[str, TypeStats], Paused]:
    return await services.jobs.stats(client), await services.jobs.paused(client)


async def stats(request: web.Request) -> web.Response:
    """Counts per type, and what is paused: every type paused by the tenant is
    listed (with zero counts when it has no jobs); ``paused`` at the top is the
    operator's pause of the whole tenant, which every type's shows too."""
    services = request.app[SERVICES]
    client = await authorize(request, services)
    by_type, paused = await services.reads.get(
        ("stats", client), lambda: _stats_read(services, client)
    )
    names = sorted(by_type.keys() | paused.types)
    return json_response(
        {
            "types": {
                name: _stats_body(by_type.get(name, NO_JOBS), paused.type_paused(name))
                for name in names
            },
            "paused": paused.tenant,
        }
    )
