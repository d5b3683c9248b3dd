"""Pausing (docs/api.md, "Pause and resume"): a tenant pauses its types, the
operator a whole tenant. Adds are still taken; the jobs wait; no daemon runs
them and no worker claims them until resumed. Stored, so a pause outlives the
daemons that heard of it."""

from __future__ import annotations

from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.admin import client_of_path
from queue_daemon.api.auth import authorize, authorize_admin
from queue_daemon.api.web import SERVICES, jobtype_of, json_response
from queue_daemon.domain.names import JobType
from queue_daemon.store.errors import LimitReached, NotFound

MAX_PAUSED_TYPES = 1000  # a tenant's paused types at once (each is a stored row)


async def _type(request: web.Request, paused: bool) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    jobtype = jobtype_of(request)
    try:
        await services.jobs.pause_type(
            client, JobType(client, jobtype).stored, paused=paused, most=MAX_PAUSED_TYPES
        )
    except LimitReached:
        raise errors.conflict(
            f"this tenant has {MAX_PAUSED_TYPES} paused types already; resume one first"
        ) from None
    return json_response({"type": jobtype, "paused": paused})


async def pause_type(request: web.Request) -> web.Response:
    return await _type(request, True)


async def resume_type(request: web.Request) -> web.Response:
    return await _type(request, False)


async def _tenant(request: web.Request, paused: bool) -> web.Response:
    services = request.app[SERVICES]
    await authorize_admin(request, services)
    client = client_of_path(request)
    try:
        # under --no-auth every name is a tenant, stored or not
        await services.jobs.pause_tenant(client, paused=paused, known=not services.settings.no_auth)
    except NotFound:
        raise errors.not_found("no active tenant of that name") from None
    return json_response({"client": client, "paused": paused})


async def pause_tenant(request: web.Request) -> web.Response:
    return await _tenant(request, True)


async def resume_tenant(request: web.Request) -> web.Response:
    return await _tenant(request, False)
