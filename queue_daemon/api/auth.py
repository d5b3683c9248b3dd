"""Bearer-token authentication against a cache of the store's tenant table.

The cache is what lets adds keep succeeding while PostgreSQL is down: it is
reloaded every few seconds and the last good copy stays in force while the
store cannot be reached. A revoked token, or a rotated-out one whose grace
period ended, stops working at the next reload.

Tokens are stored as HMAC-SHA256 digests keyed with a per-store secret
(``TenantStore.token_key``, created by migration 0004), so the table alone is not
enough to check guesses offline. Tokens created before that migration were
stored as plain SHA-256 (``scheme = 'sha256'``) and keep working: the lookup
tries both digests.

Operator (admin) tokens live in the same cache under the name ``ADMIN``, which
no client can have: they pass every tenant's routes and the ``/admin`` ones.
The reload also brings the tenants' limit overrides (``queue_daemon.engine.admit.limits``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from typing import TYPE_CHECKING

from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.errors import ApiError
from queue_daemon.domain.names import valid_client
from queue_daemon.engine.admit.limits import Limits
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import TenantStore

if TYPE_CHECKING:
    from queue_daemon.api.web import Services

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "qd_"
ADMIN = "*admin"  # the owner of an operator token; never a valid client name


def new_token() -> str:
    """A fresh random 256-bit token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str, key: bytes) -> bytes:
    """The stored form of ``token``: HMAC-SHA256 keyed with the store's secret."""
    return hmac.new(key, token.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()


def legacy_hash_token(token: str) -> bytes:
    """Plain SHA-256: how tokens created before migration 0004 are stored."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class TokenCache:
    """Maps token hashes to clients; refreshed from the store in the background.

    An unknown token waits for a reload that begins after its request came (at
    most one begins every ``MISS_RELOAD_S``, shared by concurrent requests), so
    a token stored a moment ago is recognised at once while bad tokens cannot
    flood the store.
    """

    MISS_RELOAD_S = 0.25

    def __init__(self, store: TenantStore, limits: Limits | None = None) -> None:
        self._store = store
        self._limits = limits
        self._by_hash: dict[bytes, str] = {}
        self._key: bytes | None = None  # read from the store at the first reload
        self._last_reload = -1e9
        self._reloading: asyncio.Future[None] | None = None
        self.loaded = False
        self.uid_slots: dict[str, int] = {}  # client -> its slot in the tenant uid range

    async def reload(self) -> None:
        self._last_reload = asyncio.get_running_loop().time()
        if self._key is None:
            self._key = await self._store.token_key()
        by_hash = await self._store.tenant_tokens()
        for digest in await self._store.admin_tokens():
            by_hash[digest] = ADMIN
        if self._limits is not None:
            self._limits.update(await self._store.tenant_limits())
        self.uid_slots = await self._store.tenant_uid_slots()
        self._by_hash = by_hash
        self.loaded = True

    async def ensure_uid_slot(self, client: str) -> None:
        """Give ``client`` a uid slot if this daemon knows none (an anonymous
        client, or a tenant added since the last reload); once per client."""
        if client not in self.uid_slots:
            slot = await self._store.ensure_uid_slot(client)
            self.uid_slots = {**self.uid_slots, client: slot}

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reload()
            except StoreError as exc:
                logger.warning(
                    "tenant cache not refreshed: %s", exc, extra={"action": "token_refresh_failed"}
                )

    async def client_for(self, token: str) -> str | None:
        """The client that owns ``token`` (``ADMIN`` for an operator token), or None."""
        # Lookup by digest in a dict rather than a constant-time compare: an
        # attacker cannot steer a keyed digest (nor, without a preimage, the
        # legacy SHA-256 one) towards a stored one, so the probe's timing says
        # nothing about valid tokens. The key is read at start (app calls
        # reload() before serving), so it is set here unless the store failed.
        arrived = asyncio.get_running_loop().time()
        if self._key is None:
            await self._reload_since(arrived)
            if self._key is None:
                return None
        digests = (hash_token(token, self._key), legacy_hash_token(token))
        client = self._lookup(digests)
        if client is not None:
            return client
        await self._reload_since(arrived)
        return self._lookup(digests)

    def _lookup(self, digests: tuple[bytes, ...]) -> str | None:
        for digest in digests:
            client = self._by_hash.get(digest)
            if client is not None:
                return client
        return None

    async def _reload_since(self, arrived: float) -> None:
        """Return once a reload that began at or after ``arrived`` is done, so a
        token stored before its request came is known; reloads begin at most one
        every ``MISS_RELOAD_S`` (a miss waits for the next one rather than getting
        a 401 from a copy read before its token was stored)."""
        loop = asyncio.get_running_loop()
        while self._last_reload < arrived:
            if self._reloading is None:
                pause = self._last_reload + self.MISS_RELOAD_S - loop.time()
                if pause > 0:
                    await asyncio.sleep(pause)
                    continue  # another miss may have begun the reload meanwhile
                self._reloading = asyncio.ensure_future(self.reload())
            pending = self._reloading
            try:
                await asyncio.shield(pending)
            except StoreError:
                return  # keep serving from the last good copy
            finally:
                if self._reloading is pending and pending.done():
                    self._reloading = None


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
