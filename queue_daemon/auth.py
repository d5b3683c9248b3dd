"""Bearer-token authentication against a cache of the store's tenant table.

The cache is what lets adds keep succeeding while PostgreSQL is down: it is
reloaded every few seconds and the last good copy stays in force while the
store cannot be reached. A revoked token stops working at the next reload.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets

from store.errors import StoreError
from store.protocol import Store

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "qd_"


def new_token() -> str:
    """A fresh random 256-bit token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class TokenCache:
    """Maps token hashes to clients; refreshed from the store in the background.

    An unknown token triggers one immediate reload (at most one every
    ``MISS_RELOAD_S``, shared by concurrent requests), so a tenant added a
    moment ago is recognised at once while bad tokens cannot flood the store.
    """

    MISS_RELOAD_S = 0.25

    def __init__(self, store: Store) -> None:
        self._store = store
        self._by_hash: dict[bytes, str] = {}
        self._last_reload = -1e9
        self._reloading: asyncio.Future[None] | None = None
        self.loaded = False

    async def reload(self) -> None:
        self._last_reload = asyncio.get_running_loop().time()
        self._by_hash = await self._store.tenant_tokens()
        self.loaded = True

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
        """The client that owns ``token``, or None."""
        # Lookup by SHA-256 of the token: an attacker cannot steer the digest,
        # so the lookup's timing reveals nothing about valid tokens.
        digest = hash_token(token)
        client = self._by_hash.get(digest)
        if client is not None:
            return client
        await self._reload_on_miss()
        return self._by_hash.get(digest)

    async def _reload_on_miss(self) -> None:
        if self._reloading is None:
            if asyncio.get_running_loop().time() - self._last_reload < self.MISS_RELOAD_S:
                return
            self._reloading = asyncio.ensure_future(self.reload())
        pending = self._reloading
        try:
            await asyncio.shield(pending)
        except StoreError:
            pass  # keep serving from the last good copy
        finally:
            if self._reloading is pending and pending.done():
                self._reloading = None
