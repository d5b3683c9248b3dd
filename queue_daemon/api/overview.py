"""The dashboard: the page at ``GET /`` and the JSON it polls,
``GET /admin/overview`` (operator token: every tenant) and
``GET /{client}/overview`` (that tenant's token, or the operator's)."""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize, authorize_admin
from queue_daemon.api.web import SERVICES, json_response
from queue_daemon.domain.names import JobType, valid_client, valid_type
from queue_daemon.observe.overview import DEFAULT_LIMIT, MAX_LIMIT


@functools.cache
def page_bytes() -> bytes:
    """The page, shipped as package data: one file, inline CSS and JS, no build step."""
    return (resources.files("queue_daemon.api") / "static" / "dashboard.html").read_bytes()


async def dashboard(request: web.Request) -> web.Response:
    """``GET /``: no token needed for the page itself; it asks for one and holds
    it in the tab's sessionStorage, and every figure comes from the JSON routes."""
    return web.Response(
        body=page_bytes(),
        content_type="text/html",
        charset="utf-8",
        headers={
            # the page runs only its own inline script and talks only to this origin
            "Content-Security-Policy": (
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                "form-action 'none'; frame-ancestors 'none'"
            ),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )


def _limit(request: web.Request) -> int:
    text = request.query.get("limit", str(DEFAULT_LIMIT))
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise errors.bad_request(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(text)


def _failed_type(request: web.Request, client: str | None) -> str | None:
    """The stored type whose failures alone are listed (``?type=``; for the
    operator also ``?client=``), or None for every type's."""
    name = request.query.get("type")
    if name is None:
        if "client" in request.query:
            raise errors.bad_request("client applies with type")
        return None
    if not valid_type(name):
        raise errors.bad_name("type must match [A-Za-z0-9_.:-]{1,100}")
    if client is None:
        client = request.query.get("client", "")
        if not valid_client(client):
            raise errors.bad_request("the operator's overview names a type with its client")
    elif "client" in request.query:
        raise errors.bad_request("a tenant's overview lists only its own types: no client")
    return JobType(client, name).stored


async def admin_overview(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    await authorize_admin(request, services)
    failed = _failed_type(request, None)
    return json_response(await services.overview.body(None, _limit(request), failed_type=failed))


async def tenant_overview(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    failed = _failed_type(request, client)
    return json_response(await services.overview.body(client, _limit(request), failed_type=failed))
