"""Bearer-token authentication of a request: the token's owner, from the cache of
the store's tenant table (``api.tokens``), must own the path's client, or be an
operator."""

from __future__ import annotations

from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.errors import ApiError
from queue_daemon.api.tokens import ADMIN
from queue_daemon.api.web import Services
from queue_daemon.domain.names import valid_client


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
