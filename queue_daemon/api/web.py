"""The web toolkit every route module shares: the services they reach, the JSON
replies, the one error middleware, and the parsing of names, times and payload
lines (bodies: ``api.bodies``).

Every error leaves through ``error_middleware`` as the JSON error shape; no
route builds an error reply itself.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from queue_daemon.api import bodies, errors
from queue_daemon.api.bodies import BodyBudget
from queue_daemon.api.errors import ApiError
from queue_daemon.api.reads import CoalescedReads
from queue_daemon.api.tokens import TokenCache
from queue_daemon.domain.names import valid_type
from queue_daemon.engine.admit.adds import (
    AddRefused,
    Adds,
    BadDependencies,
    NeverFits,
    NotJournaled,
    OverRate,
    OverWaiting,
)
from queue_daemon.engine.admit.limits import Limits
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.engine.pull.holds import DoneWaits
from queue_daemon.engine.pull.pulls import Pulls
from queue_daemon.engine.schedule.ticker import Ticker
from queue_daemon.engine.sysid import Identity
from queue_daemon.journal import Journal
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.overview import Overview
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.observe.tracing import Tracing
from queue_daemon.settings import Settings
from queue_daemon.store.errors import StoreError, StoreUnavailable
from queue_daemon.store.ports import (
    BlobStore,
    Dashboard,
    HandlerStore,
    JobQueries,
    PulledJobs,
    ScheduleStore,
    TenantStore,
)

logger = logging.getLogger(__name__)

MAX_DELAY_S = 10 * 365 * 24 * 3600  # ten years ahead is the furthest a job can be scheduled


@dataclass(frozen=True, slots=True, kw_only=True)
class Services:
    """What the handlers reach: built and owned by ``queue_daemon.app``. The store
    only through the ports the routes use."""

    settings: Settings
    adds: Adds  # the add route's use case: quotas, ids, options, the intake
    jobs: JobQueries  # a tenant's jobs: get, cancel, list, stats, delete
    tenants: TenantStore  # tenants and their limits (admin routes)
    handler_store: HandlerStore  # handlers stored (the handler routes)
    schedules: ScheduleStore
    blobs: BlobStore  # a tenant's bytes by content address
    pulled: PulledJobs  # the daemons pulled jobs may be on
    dashboard: Dashboard  # the tenants' workers seen
    ping: Callable[[], Awaitable[None]]  # the store's health
    journal: Journal
    tokens: TokenCache
    ingester: Ingester
    queuelog: QueueLog
    handlers: HandlerCache
    limits: Limits
    overview: Overview
    sysid: str
    identity: Identity  # the sysid's lease health
    metrics: Metrics
    bodies: BodyBudget  # bytes of request bodies being read
    reads: CoalescedReads[Any]  # the tenants' repeatable reads of the store
    pulls: Pulls  # jobs of pulled types, claimed by the tenants' workers
    done_waits: DoneWaits  # GETs held until their job is done
    ticker: Ticker  # adds the schedules' ticks (periodic jobs)
    tracing: Tracing = field(default_factory=Tracing.off)  # spans of adds (--otlp-endpoint)


SERVICES = web.AppKey("services", Services)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def error_response(exc: ApiError) -> web.Response:
    body = {"error": exc.kind, "message": exc.message}
    if exc.reason is not None:
        body["reason"] = exc.reason
    response = json_response(body, status=exc.status, headers=exc.headers)
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
    except AddRefused as exc:
        return error_response(refusal(exc))
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


def refusal(exc: AddRefused) -> ApiError:
    """The API's error for an add the engine refused (``engine.admit.adds``)."""
    match exc:
        case OverRate() | OverWaiting():
            return errors.rate_limited(exc.message, exc.retry_after)
        case NeverFits():
            return errors.too_large(exc.message)
        case BadDependencies():
            return errors.bad_request(exc.message)
        case NotJournaled():
            return errors.unavailable(exc.message)
    return errors.bad_request(exc.message)


def jobtype_of(request: web.Request) -> str:
    name = request.match_info["type"]
    if not valid_type(name):
        raise errors.bad_name("type must match [A-Za-z0-9_.:-]{1,100}")
    return name


def parse_when(query: Any, now_ms: int) -> int:
    """Eligibility time in epoch ms from ``delay`` or ``dt`` (docs/api.md), default now."""
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


async def read_body(request: web.Request, client: str, limit: int) -> bytes:
    """``client``'s request body, within ``limit`` bytes, the daemon's body budget
    and its time (``api.bodies``)."""
    services = request.app[SERVICES]
    settings = services.settings
    return await bodies.read_body(
        request,
        limit,
        settings.client_timeout,
        budget=services.bodies,
        client=client,
        total=settings.body_timeout,
    )
