"""The pull-worker routes of docs/api.md: claim, renew, complete and hand back
jobs of pulled types (one job, or up to 1,000 in one request), and the
registry of workers (the tenant's, and the operator's view of every tenant's
workers and every daemon)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize, authorize_admin
from queue_daemon.api.errors import ApiError
from queue_daemon.api.jobs import get_job_body, job_id_of
from queue_daemon.api.web import SERVICES, jobtype_of, json_response, read_body
from queue_daemon.domain.names import JobType, iso, valid_type
from queue_daemon.domain.views import WorkerSeen
from queue_daemon.engine.pull.pulls import (
    CANCELLED,
    MAX_ITEMS,
    NOT_FOUND,
    Completion,
    FollowOnsNotWritten,
    NotPulled,
)
from queue_daemon.journal import JournalError
from queue_daemon.runners.output import emit_problem

MAX_WAIT_S = 60.0
MAX_EXITCODE = 999
SMALL_BODY = 64 << 10  # a claim, or a renew or hand-back of one job


def _fields(body: bytes) -> dict[str, Any]:
    try:
        fields = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"body is not valid JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise errors.bad_request("the body must be a JSON object")
    return fields


async def _body(request: web.Request, client: str, limit: int) -> dict[str, Any]:
    return _fields(await read_body(request, client, limit))


def _worker(fields: dict[str, Any]) -> str:
    worker = fields.get("worker")
    if not isinstance(worker, str) or not valid_type(worker):
        raise errors.bad_request("worker must be a name matching [A-Za-z0-9_.:-]{1,100}")
    return worker


def _number(fields: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = fields.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise errors.bad_request(f"{name} must be a number from {low:g} to {high:g}")
    return float(value)


def _token(value: Any) -> bool:
    """Whether ``value`` could be an id or claim this daemon gave out: short
    printable ASCII (anything else would only trouble the store)."""
    return (
        isinstance(value, str) and 0 < len(value) <= 200 and value.isascii() and value.isprintable()
    )


def _claim_of(item: dict[str, Any]) -> str:
    claim = item.get("claim")
    if not _token(claim):
        raise errors.bad_request("claim must be the token the claim returned")
    return str(claim)


def _item_id(item: dict[str, Any]) -> str:
    job_id = item.get("id")
    if not _token(job_id):
        raise errors.bad_request("each item needs the id of a job, as the claim returned it")
    return str(job_id)


def _text(value: Any, name: str) -> str | None:
    """A result or payload: a string as it is, any other JSON value as compact JSON."""
    if value is None:
        return None
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    if "\x00" in text:
        raise errors.bad_request(f"{name} contains a NUL character")
    return text


def _completion(item: Any, payload_limit: int) -> Completion:
    if not isinstance(item, dict):
        raise errors.bad_request("each result must be a JSON object")
    code = item.get("exitcode", 200)
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= MAX_EXITCODE:
        raise errors.bad_request(f"exitcode must be an integer from 0 to {MAX_EXITCODE}")
    jobs = item.get("jobs") or []
    if not isinstance(jobs, list):
        raise errors.bad_request("jobs must be a list of {type, payload} objects")
    follow: list[tuple[str, str]] = []
    for n, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise errors.bad_request(f"jobs[{n}] must be a {{type, payload}} object")
        name, payload = job.get("type"), _text(job.get("payload"), f"jobs[{n}].payload")
        problem = emit_problem(name, payload, payload_limit)
        if problem is not None:
            raise errors.bad_request(f"jobs[{n}]: {problem}")
        follow.append((str(name), str(payload)))
    return Completion(
        id=_item_id(item),
        claim=_claim_of(item),
        exitcode=code,
        result=_text(item.get("result"), "result"),
        jobs=follow,
    )


def _items(fields: dict[str, Any], name: str) -> list[Any]:
    items = fields.get(name)
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ITEMS:
        raise errors.bad_request(f"{name} must be a list of 1 to {MAX_ITEMS} items")
    return items


def _pairs(items: list[Any]) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        if not isinstance(item, dict):
            raise errors.bad_request("each item must be an object {id, claim}")
        pairs.append((_item_id(item), _claim_of(item)))
    if len({job_id for job_id, _ in pairs}) < len(pairs):
        raise errors.bad_request("a job appears twice in one request")
    return pairs


def _status(job_id: str, ok: bool, gone: dict[str, str], **extra: Any) -> dict[str, Any]:
    if ok:
        return {"id": job_id, "status": 200, **extra}
    why = gone.get(job_id)
    if why == NOT_FOUND:
        return {"id": job_id, "status": 404, "error": "not_found", "message": "no such job"}
    if why == CANCELLED:
        return {
            "id": job_id,
            "status": 409,
            "error": "conflict",
            "reason": "cancelled",
            "message": "the job was cancelled: stop it, its outcome is not taken",
        }
    return {"id": job_id, "status": 409, "error": "conflict", "message": _NOT_HELD}


_NOT_HELD = (
    "this claim no longer holds the job (its lease ran out and it was claimed again,"
    " it was cancelled, or it is done)"
)


def _one(result: dict[str, Any]) -> None:
    """Raise the error of a single-job route's only item."""
    if result["status"] != 200:
        raise ApiError(
            result["status"], result["error"], result["message"], reason=result.get("reason")
        )


# --- routes -------------------------------------------------------------------


async def claim(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    jobtype = JobType(client, jobtype_of(request))
    fields = await _body(request, client, SMALL_BODY)
    worker = _worker(fields)
    limit = _number(fields, "limit", 1, 1, MAX_ITEMS)
    if limit != int(limit):
        raise errors.bad_request(f"limit must be an integer from 1 to {MAX_ITEMS}")
    wait = _number(fields, "wait", 0, 0, MAX_WAIT_S)
    try:
        token, lease, jobs = await services.pulls.claim(
            jobtype,
            worker=worker,
            limit=int(limit),
            wait=wait,
            gone=lambda: request.transport is None or request.transport.is_closing(),
        )
    except NotPulled as exc:
        raise errors.conflict(str(exc)) from None
    # a claim's jobs share their lease's end (one statement's now()): written once
    until = {when: iso(when) for when in {job.lease_until for job in jobs}}
    return json_response(
        {
            "jobs": [
                {
                    "id": job.id,
                    "type": jobtype.name,
                    "payload": job.data,
                    "attempts": job.attempts,
                    "key": job.key,
                    "traceparent": job.trace,
                    "lease_until": until[job.lease_until],
                    "lease_s": lease,
                    "claim": token,
                }
                for job in jobs
            ]
        }
    )


async def _renew(
    request: web.Request, client: str, fields: dict[str, Any], pairs: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    services = request.app[SERVICES]
    reports = _reports(fields, pairs, one="id" in request.match_info)
    held, gone = await services.pulls.renew(client, _worker(fields), pairs, reports)
    return [
        _status(job_id, job_id in held, gone, lease_until=iso(held.get(job_id)))
        for job_id, _ in pairs
    ]


def _reports(
    fields: dict[str, Any], pairs: list[tuple[str, str]], *, one: bool
) -> dict[str, tuple[float, str]]:
    """The ``progress`` of a renew (``one``: the path's job) or of its ``claims``
    (docs/workers.md): job id -> (fraction, message); checked before anything
    is renewed."""
    items = [{**fields, "id": pairs[0][0]}] if one else _items(fields, "claims")
    reports: dict[str, tuple[float, str]] = {}
    for item in items:
        report = item.get("progress") if isinstance(item, dict) else None
        if report is None:
            continue
        if not isinstance(report, dict):
            raise errors.bad_request("progress must be an object {fraction, message}")
        fraction, message = report.get("fraction"), report.get("message", "")
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0 <= fraction <= 1
        ):
            raise errors.bad_request("progress.fraction must be a number from 0 to 1")
        if not isinstance(message, str):
            raise errors.bad_request("progress.message must be a string")
        reports[_item_id(item)] = (float(fraction), message)
    return reports


Act = Callable[
    [web.Request, str, dict[str, Any], list[tuple[str, str]]], Awaitable[list[dict[str, Any]]]
]


async def _on_claims(request: web.Request, act: Act, *, one: bool) -> list[dict[str, Any]]:
    """``act`` on the claim of the path's job (``one``), or on the body's ``claims``."""
    services = request.app[SERVICES]
    client = await authorize(request, services)
    if one:
        job_id = job_id_of(request)
        fields = await _body(request, client, SMALL_BODY)
        return await act(request, client, fields, [(job_id, _claim_of(fields))])
    fields = await _body(request, client, services.settings.body_limit)
    return await act(request, client, fields, _pairs(_items(fields, "claims")))


async def renew_one(request: web.Request) -> web.Response:
    [result] = await _on_claims(request, _renew, one=True)
    _one(result)
    return json_response({"lease_until": result["lease_until"]})


async def renew_many(request: web.Request) -> web.Response:
    return json_response({"results": await _on_claims(request, _renew, one=False)})


async def _complete(
    request: web.Request, client: str, worker: str, completions: list[Completion]
) -> list[dict[str, Any]]:
    services = request.app[SERVICES]
    if len({c.id for c in completions}) < len(completions):
        raise errors.bad_request("a job appears twice in one request")
    try:
        applied, gone = await services.pulls.complete(client, worker, completions)
    except (FollowOnsNotWritten, JournalError):
        raise errors.unavailable(
            "the journal cannot take the follow-on jobs; nothing was changed"
        ) from None
    return [_status(c.id, c.id in applied, gone) for c in completions]


async def complete_one(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    job_id = job_id_of(request)
    fields = await _body(request, client, services.settings.body_limit)
    payload_limit = services.limits.of(client).payload
    completion = _completion({**fields, "id": job_id}, payload_limit)
    _one((await _complete(request, client, _worker(fields), [completion]))[0])
    return json_response(await get_job_body(services, client, job_id))


async def complete_many(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    fields = await _body(request, client, services.settings.body_limit)
    worker = _worker(fields)
    payload_limit = services.limits.of(client).payload
    completions = [_completion(item, payload_limit) for item in _items(fields, "results")]
    return json_response({"results": await _complete(request, client, worker, completions)})


async def _hand_back(
    request: web.Request, client: str, fields: dict[str, Any], pairs: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    services = request.app[SERVICES]
    back, gone = await services.pulls.hand_back(client, _worker(fields), pairs)
    return [_status(job_id, job_id in back, gone) for job_id, _ in pairs]


async def release_one(request: web.Request) -> web.Response:
    [result] = await _on_claims(request, _hand_back, one=True)
    _one(result)
    return json_response({"id": result["id"], "status": 200})


async def release_many(request: web.Request) -> web.Response:
    return json_response({"results": await _on_claims(request, _hand_back, one=False)})


def _worker_body(seen: WorkerSeen, *, tenant: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"tenant": seen.client} if tenant else {}
    body.update(
        name=seen.name,
        first_seen=iso(seen.first_seen),
        last_seen=iso(seen.last_seen),
        live=seen.live,
        holding=seen.holding,
        done_ok=seen.done_ok,
        done_failed=seen.done_failed,
        done_error=seen.done_error,
        done_retry=seen.done_retry,
    )
    return body


async def workers(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    seen = await services.reads.get(("workers", client), lambda: services.dashboard.workers(client))
    return json_response({"workers": [_worker_body(w) for w in seen]})


async def admin_workers(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    await authorize_admin(request, services)
    seen = await services.dashboard.workers(None)
    daemons = await services.pulled.daemons()
    return json_response(
        {
            "workers": [_worker_body(w, tenant=True) for w in seen],
            "daemons": [
                {
                    "sysid": d.sysid,
                    "host": d.host,
                    "state": d.state,
                    "lease_until": iso(d.expires),
                    "released_at": iso(d.released_at),
                    "running": d.running,
                }
                for d in daemons
            ],
        }
    )
