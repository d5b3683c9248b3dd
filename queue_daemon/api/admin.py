"""Operator routes under ``/admin``: they need an operator token (``queue-daemon
admin token``), and are the only routes that name more than one tenant."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize_admin
from queue_daemon.api.web import SERVICES, Services, json_response, read_body
from queue_daemon.domain.names import iso, valid_client
from queue_daemon.engine.admit.limits import LimitsError, validate_overrides
from queue_daemon.store.errors import NotFound

LIMITS_BODY_LIMIT = 64 << 10  # a limits object is a few dozen bytes


def _limits_body(services: Services, client: str, overrides: dict[str, float]) -> dict[str, Any]:
    return {
        "client": client,
        "overrides": overrides,
        "effective": services.limits.defaults.with_overrides(overrides).as_dict(),
    }


async def list_tenants(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    await authorize_admin(request, services)
    tenants = await services.tenants.list_tenants()
    return json_response(
        {
            "tenants": [
                {
                    "client": t.client,
                    "state": "revoked" if t.revoked_at else "active",
                    "created_at": iso(t.created_at),
                    "live_tokens": t.live_tokens,
                    "grace_until": iso(t.grace_until),
                    "limits": t.limits,
                }
                for t in tenants
            ],
            "defaults": services.limits.defaults.as_dict(),
        }
    )


def client_of_path(request: web.Request) -> str:
    client = request.match_info["client"]
    if not valid_client(client):
        raise errors.bad_name("client must match [a-z0-9_]{1,40}")
    return client


async def get_limits(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    await authorize_admin(request, services)
    client = client_of_path(request)
    try:
        overrides = await services.tenants.get_tenant_limits(client)
    except NotFound:
        raise errors.not_found("no active tenant of that name") from None
    return json_response(_limits_body(services, client, overrides))


async def set_limits(request: web.Request) -> web.Response:
    """Replaces the tenant's overrides with the JSON object in the body; a key
    whose value is null goes back to the daemon's default."""
    services = request.app[SERVICES]
    await authorize_admin(request, services)
    client = client_of_path(request)
    try:
        raw = orjson.loads(await read_body(request, "*admin", LIMITS_BODY_LIMIT))
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"body is not valid JSON: {exc}") from None
    if isinstance(raw, dict):
        raw = {key: value for key, value in raw.items() if value is not None}
    try:
        overrides = validate_overrides(raw)
    except LimitsError as exc:
        raise errors.bad_request(str(exc)) from None
    try:
        stored = await services.tenants.set_tenant_limits(client, overrides)
    except NotFound:
        raise errors.not_found("no active tenant of that name") from None
    await services.tokens.reload()  # this daemon applies them at once; others at their refresh
    return json_response(_limits_body(services, client, stored))
