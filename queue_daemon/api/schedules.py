"""The schedule routes of docs/api.md (periodic jobs): add, list, del.

A schedule adds a job of its type with its payload at each tick of its cron
expression, in its time zone; the daemons' ticker (``engine.schedule.ticker``) adds
them. Adding a schedule again replaces it (a new version).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web
from cronsim import CronSimError

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize
from queue_daemon.api.web import SERVICES, json_response, read_body
from queue_daemon.domain.names import iso, valid_type
from queue_daemon.domain.schedules import Schedule
from queue_daemon.engine.schedule.cron import Cron, CronError, zone
from queue_daemon.engine.schedule.ticker import MAX_SCHEDULES
from queue_daemon.store.errors import LimitReached, NotFound

NEXT_SHOWN = 3  # next fire times in a listing
_FIELDS = {"type", "cron", "payload", "tz"}


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not valid_type(name):
        raise errors.bad_name("a schedule's name must match [A-Za-z0-9_.:-]{1,100}")
    return name


def _payload(value: Any, limit: int) -> str:
    """A string as it is; any other JSON value as compact JSON (as in a JSON add)."""
    if isinstance(value, str):
        if not value:
            raise errors.bad_payload("payload is empty")
        if "\n" in value or "\r" in value or "\x00" in value:
            raise errors.bad_payload(
                "a string payload cannot hold a line break or NUL (give a JSON value instead)"
            )
        text = value
    else:
        text = orjson.dumps(value).decode()
    if len(text.encode("utf-8", "surrogatepass")) > limit:
        raise errors.too_large(f"payload is over this tenant's limit of {limit} bytes")
    return text


def _fields(body: bytes) -> dict[str, Any]:
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"body is not valid JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise errors.bad_request('body must be a JSON object {"type", "cron", "payload", "tz"}')
    unknown = sorted(set(fields) - _FIELDS)
    if unknown:
        raise errors.bad_request(f"unknown fields: {', '.join(unknown)}")
    for required in ("type", "cron", "payload"):
        if required not in fields:
            raise errors.bad_request(f"{required} is required")
    for text in ("type", "cron", "tz"):
        if text in fields and not isinstance(fields[text], str):
            raise errors.bad_request(f"{text} must be a string")
    return fields


def schedule_body(schedule: Schedule, upcoming: list[datetime]) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "type": schedule.type,
        "cron": schedule.cron,
        "tz": schedule.tz,
        "payload": schedule.payload,
        "version": schedule.version,
        "created": iso(schedule.created_at),
        "next": [iso(when) for when in upcoming],
        "last_tick": iso(schedule.last_tick),
        "last_job": schedule.last_job,
    }


def _upcoming(schedule: Schedule) -> list[datetime]:
    """The schedule's next fire times: its next tick not yet added, and those after."""
    try:
        cron = Cron(schedule.cron, zone(schedule.tz))
        return [schedule.next_fire, *cron.after(schedule.next_fire, NEXT_SHOWN - 1)]
    except (CronError, CronSimError, StopIteration):
        return [schedule.next_fire]


def _bodies(schedules: list[Schedule]) -> list[dict[str, Any]]:
    return [schedule_body(s, _upcoming(s)) for s in schedules]


async def add_schedule(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    name = _name(request)
    body = await read_body(request, client, services.settings.body_limit)
    fields = _fields(body)
    jobtype = fields["type"]
    if not valid_type(jobtype):
        raise errors.bad_name("type must match [A-Za-z0-9_.:-]{1,100}")
    tz = fields.get("tz", "UTC")
    now = datetime.now(UTC)
    try:
        cron = Cron.parse(fields["cron"], tz, now=now)
        next_fire = cron.after(now)[0]
    except CronError as exc:
        raise errors.bad_request(str(exc)) from None
    payload = _payload(fields["payload"], services.limits.of(client).payload)
    version = f"v{time.time_ns():x}{secrets.token_hex(4)}"
    schedule = Schedule(
        client=client,
        name=name,
        type=jobtype,
        cron=cron.expr,
        tz=tz,
        payload=payload,
        version=version,
        created_at=now,
        next_fire=next_fire,
    )
    try:
        stored = await services.schedules.put_schedule(schedule, MAX_SCHEDULES)
    except LimitReached:
        raise errors.bad_request(
            f"this tenant has its limit of {MAX_SCHEDULES} schedules; delete one first"
        ) from None
    services.ticker.changed()
    return json_response(schedule_body(stored, _upcoming(stored)))


async def list_schedules(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    schedules = await services.schedules.list_schedules(client)
    # up to 1000 schedules' next times: off the event loop
    bodies = (
        await asyncio.to_thread(_bodies, schedules) if len(schedules) > 20 else _bodies(schedules)
    )
    return json_response({"schedules": bodies})


async def delete_schedule(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    name = _name(request)
    try:
        await services.schedules.delete_schedule(client, name)
    except NotFound:
        raise errors.not_found("no such schedule") from None
    return json_response({"deleted": name})
