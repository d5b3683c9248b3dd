"""The tenant HTTP API of API.md, on aiohttp.

Every error leaves through ``error_middleware`` as the JSON error shape; no
handler builds an error reply itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from journal import Journal, JournalError
from queue_daemon import errors
from queue_daemon.auth import ADMIN, TokenCache
from queue_daemon.errors import ApiError
from queue_daemon.handlers import HandlerCache
from queue_daemon.ids import IdGenerator
from queue_daemon.ingester import Ingester
from queue_daemon.limits import Limits
from queue_daemon.metrics import Metrics
from queue_daemon.names import valid_client, valid_type
from queue_daemon.overview import Overview
from queue_daemon.queuelog import QueueLog
from queue_daemon.quotas import RateLimiter, WaitingLimiter
from queue_daemon.settings import Settings
from queue_daemon.sysid import Identity
from store.errors import BadCursor, Conflict, NotFound, StoreError, StoreUnavailable
from store.models import Job, JobState, TypeStats
from store.protocol import Store

logger = logging.getLogger(__name__)

MAX_DELAY_S = 10 * 365 * 24 * 3600  # ten years ahead is the furthest a job can be scheduled
# A body slower than this (bytes/s, on average) runs out of time once the client
# timeout has passed: a slow upload keeps going, a trickle does not.
MIN_BODY_RATE = 16 << 10


@dataclass(slots=True, kw_only=True)
class Services:
    """What the handlers reach: built and owned by ``queue_daemon.app``."""

    settings: Settings
    store: Store
    journal: Journal
    ids: IdGenerator
    tokens: TokenCache
    ingester: Ingester
    queuelog: QueueLog
    handlers: HandlerCache
    rates: RateLimiter
    waiting: WaitingLimiter
    limits: Limits
    overview: Overview
    sysid: str
    identity: Identity  # the sysid's lease health
    metrics: Metrics


SERVICES = web.AppKey("services", Services)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def error_response(exc: ApiError) -> web.Response:
    response = json_response(
        {"error": exc.kind, "message": exc.message}, status=exc.status, headers=exc.headers
    )
    if exc.close:
        response.force_close()
    return response


_HTTP_KINDS = {
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
}


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = _HTTP_KINDS.get(exc.status, "bad_request" if exc.status < 500 else "internal")
        message = exc.reason if exc.status != 413 else "request body over the body limit"
        return error_response(ApiError(exc.status, kind, message))
    except ConnectionResetError:
        # the client hung up (e.g. mid-body): nothing was accepted, nothing to report
        logger.debug("client went away", extra={"action": "client_reset"})
        return error_response(ApiError(400, "bad_request", "the connection was reset"))
    except StoreUnavailable:
        return error_response(errors.unavailable("the store cannot be reached; try again"))
    except StoreError as exc:
        logger.exception("store error", extra={"action": "store_error"})
        return error_response(ApiError(500, "internal", f"store error: {type(exc).__name__}"))
    except Exception:
        logger.exception("unhandled error", extra={"action": "internal_error"})
        return error_response(ApiError(500, "internal", "internal error"))


async def _token_owner(request: web.Request, services: Services) -> str:
    """The client (or ``ADMIN``) owning the request's bearer token; 401 without one."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(
            401, "unauthorized", "missing bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
    owner = await services.tokens.client_for(token.strip())
    if owner is None:
        raise ApiError(401, "unauthorized", "invalid token", headers={"WWW-Authenticate": "Bearer"})
    return owner


async def authorize(request: web.Request, services: Services) -> str:
    """Return the path's client after checking the bearer token owns it (an
    operator token owns every client)."""
    client = request.match_info["client"]
    if not valid_client(client):
        raise errors.bad_name("client must match [a-z0-9_]{1,40}")
    if services.settings.no_auth:
        return client
    owner = await _token_owner(request, services)
    if owner != client and owner != ADMIN:
        raise ApiError(403, "forbidden", "this token does not belong to this client")
    return client


async def authorize_admin(request: web.Request, services: Services) -> None:
    """Operator routes: an admin token, or any request under ``--no-auth``."""
    if services.settings.no_auth:
        return
    if await _token_owner(request, services) != ADMIN:
        raise ApiError(403, "forbidden", "this route needs an operator token")


def jobtype_of(request: web.Request) -> str:
    name = request.match_info["type"]
    if not valid_type(name):
        raise errors.bad_name("type must match [A-Za-z0-9_.:-]{1,100}")
    return name


def parse_when(query: Any, now_ms: int) -> int:
    """Eligibility time in epoch ms from ``delay`` or ``dt`` (API.md), default now."""
    delay = query.get("delay")
    dt = query.get("dt")
    if delay is not None and dt is not None:
        raise errors.bad_request("give delay or dt, not both")
    if delay is not None:
        try:
            seconds = float(delay)
        except ValueError:
            raise errors.bad_request("delay must be a number of seconds") from None
        if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DELAY_S:
            raise errors.bad_request("delay must be between 0 and 10 years in seconds")
        return now_ms + int(seconds * 1000)
    if dt is not None:
        when = _parse_dt(dt)
        if when > now_ms + MAX_DELAY_S * 1000:
            raise errors.bad_request("dt is more than 10 years ahead")
        return max(when, 0)
    return now_ms


def _parse_dt(value: str) -> int:
    if value.isdigit() and len(value) <= 16:
        return int(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace(" ", "+"))
    except ValueError:
        raise errors.bad_request("dt must be ISO-8601 or epoch milliseconds") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


# Integers of 19 digits or more may not fit orjson's 64-bit integers (it would
# turn them into floats): such bodies go through the standard library's parser.
_LONG_DIGITS = re.compile(rb"\d{19}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_lines(body: bytes) -> list[str]:
    """Each element of a JSON array body, as compact JSON."""
    try:
        if _LONG_DIGITS.search(body) is None:
            items = orjson.loads(body)
        else:
            items = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise errors.bad_payload(f"body is not valid JSON: {exc}") from None
    if not isinstance(items, list):
        raise errors.bad_payload("a JSON body must be an array, one element per job")
    if not items:
        raise errors.bad_payload("the array is empty")
    try:
        lines = [orjson.dumps(item).decode() for item in items]
    except orjson.JSONEncodeError:
        # only the standard parser lets these through (huge integers, lone surrogates)
        try:
            lines = [
                json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode().decode()
                for item in items
            ]
        except (ValueError, RecursionError) as exc:
            raise errors.bad_payload(f"body cannot be stored as JSON: {exc}") from None
    return lines


def split_payloads(body: bytes, content_type: str, payload_limit: int) -> list[str]:
    """The request body as payload lines, or an ApiError; all or nothing."""
    if content_type == "application/json":
        lines = _json_lines(body)
    else:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise errors.bad_payload(f"body is not valid UTF-8 at byte {exc.start}") from None
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        if text.endswith("\n"):
            text = text[:-1]
        lines = text.split("\n")
        if "" in lines:
            raise errors.bad_payload(f"line {lines.index('') + 1} is empty")
        if "\x00" in text:
            raise errors.bad_payload("payloads cannot contain NUL characters")
    if len(body) > payload_limit:
        for number, line in enumerate(lines, 1):
            if len(line) * 4 > payload_limit and len(line.encode()) > payload_limit:
                raise errors.too_large(f"payload on line {number} is over {payload_limit} bytes")
    return lines


async def read_body(request: web.Request, limit: int, patience: float) -> bytes:
    """The request body: at most ``limit`` bytes (else 413), in time (else 408).

    aiohttp bounds neither how long a body may take nor the pauses inside it,
    so a client sending a byte now and then would hold its request open for
    ever. The whole body must arrive within ``patience`` seconds plus one
    second per ``MIN_BODY_RATE`` bytes received.
    """
    length = request.content_length
    if length is not None and length > limit:
        raise errors.too_large(f"request body of {length} bytes is over the limit of {limit}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    content = request.content
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                chunk = await content.readany()
        except TimeoutError:
            logger.debug("slow request body", extra={"action": "client_timeout"})
            # the rest of the body is read and dropped for a moment after the reply
            # (the server's lingering time) before the connection closes: closing with
            # unread bytes would reset it and could destroy the reply on its way
            raise errors.timeout(
                f"the request body did not arrive in time ({size} bytes received)"
            ) from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise errors.too_large(f"request body over the limit of {limit} bytes")
        chunks.append(chunk)
        deadline += len(chunk) / MIN_BODY_RATE


async def add_jobs(request: web.Request) -> web.Response:
    began = time.perf_counter()
    services = request.app[SERVICES]
    client = await authorize(request, services)
    jobtype = jobtype_of(request)
    now_ms = time.time_ns() // 1_000_000
    dt_ms = parse_when(request.query, now_ms)
    settings = services.settings
    body = await read_body(request, settings.body_limit, settings.client_timeout)
    limits = services.limits.of(client)
    lines = split_payloads(body, request.content_type, limits.payload)
    wait = services.rates.take(client, len(lines), limits.rate, limits.burst)
    if wait:
        if math.isinf(wait):
            raise errors.too_large(
                f"{len(lines)} jobs in one request is over this tenant's burst of {limits.burst:g}"
            )
        raise errors.rate_limited(f"over this tenant's add rate of {limits.rate:g} jobs/s", wait)
    if await services.waiting.take(client, len(lines), limits.waiting):
        if len(lines) > limits.waiting:
            raise errors.too_large(
                f"{len(lines)} jobs in one request is over this tenant's waiting limit of "
                f"{limits.waiting}"
            )
        raise errors.rate_limited(
            f"this tenant has its limit of {limits.waiting} waiting jobs",
            services.waiting.RETRY_AFTER_S,
        )
    ids = services.ids.next_ids(len(lines))
    stored_type = f"{client}-{jobtype}"
    try:
        await services.journal.write(stored_type, ids, lines, create_ms=now_ms, dt_ms=dt_ms)
    except JournalError as exc:
        logger.error("journal write failed: %s", exc, extra={"action": "journal_write_failed"})
        raise errors.unavailable("the journal cannot be written; nothing was accepted") from None
    services.queuelog.added(stored_type, ids, lines, now_ms, dt_ms)
    metrics = services.metrics
    metrics.added(client, jobtype, len(ids))  # once per request, whatever its size
    metrics.add_took(time.perf_counter() - began)
    return json_response({"ids": ids})


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def job_body(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "type": job.type,
        "state": job.state.value,
        "dt": _iso(job.dt),
        "create_dt": _iso(job.create_dt),
        "done_dt": _iso(job.done_dt),
        "attempts": job.attempts,
        "code": job.code,
        "exitcode": job.exitcode,
        "result": job.result,
        "payload": job.data,
    }


def _job_id(request: web.Request) -> str:
    job_id = request.match_info["id"]
    # every id this daemon gives out is short printable ASCII; anything else (a NUL,
    # a lone surrogate from the URL's percent-decoding) would only trouble the store
    if len(job_id) > 200 or not (job_id.isascii() and job_id.isprintable()):
        raise errors.not_found("no such job")
    return job_id


async def get_job(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    try:
        job = await services.store.get_job(client, _job_id(request))
    except NotFound:
        raise errors.not_found("no such job (or not yet in the store)") from None
    return json_response(job_body(job))


async def cancel_job(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    try:
        job = await services.store.cancel_job(client, _job_id(request))
    except NotFound:
        raise errors.not_found("no such job (or not yet in the store)") from None
    except Conflict:
        raise ApiError(409, "conflict", "only a waiting job can be cancelled") from None
    services.queuelog.cancelled(f"{client}-{job.type}", job.id)
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
            raise errors.bad_request("state must be waiting, running or done") from None
    limit_text = query.get("limit", "100")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= 1000:
        raise errors.bad_request("limit must be an integer from 1 to 1000")
    try:
        page = await services.store.list_jobs(
            client,
            type=jobtype,
            state=state,
            limit=int(limit_text),
            after=query.get("after") or None,
        )
    except BadCursor:
        raise errors.bad_request("after is not a cursor this daemon gave out") from None
    return json_response({"jobs": [job_body(job) for job in page.jobs], "next": page.next})


def _stats_body(stats: TypeStats) -> dict[str, int]:
    return {
        "waiting": stats.waiting,
        "scheduled": stats.scheduled,
        "running": stats.running,
        "done_ok": stats.done_ok,
        "done_failed": stats.done_failed,
        "done_error": stats.done_error,
    }


async def stats(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    by_type = await services.store.stats(client)
    return json_response({"types": {name: _stats_body(s) for name, s in sorted(by_type.items())}})
