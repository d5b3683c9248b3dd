"""Tenant and operator tokens: their stored forms, and the cache of the store's
tenant table that every request's token is checked against (``api.auth``).

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
import contextlib
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable

from queue_daemon.engine.admit.limits import Limits
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import TenantStore

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

    One reload at a time, periodic or not: a request whose token is unknown
    waits for the reload in flight, if any (its copy may hold the token), and,
    when the token is still unknown, for a copy read by a reload that began
    after the request came, so a token stored before its request is always
    recognised. Such reloads begin at most one every ``MISS_RELOAD_S`` (after
    the last one began), shared by every request waiting, so bad tokens cannot
    flood the store. Reloads are ordered by number, not by the loop's clock
    (uvloop's reads the same for a millisecond).
    """

    MISS_RELOAD_S = 0.25

    def __init__(self, store: TenantStore, limits: Limits | None = None) -> None:
        self._store = store
        self._limits = limits
        self._by_hash: dict[bytes, str] = {}
        self._key: bytes | None = None  # read from the store at the first reload
        self._began = 0  # reloads begun
        self._began_at = -1e9  # loop time the last one began
        self._copy = 0  # the number of the reload whose copy is in force (0: none)
        self._reloading: asyncio.Future[None] | None = None  # the reload in flight
        self.loaded = False
        self.uid_slots: dict[str, int] = {}  # client -> its slot in the tenant uid range

    async def reload(self) -> None:
        """Read a fresh copy: one whose reload began after this call (joined by
        the callers that come meanwhile). StoreError when it cannot be read."""
        await self._read_after(self._began, paced=False, found=_never)

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                # the reload in flight, if one is, else a new one: a miss can join it
                await asyncio.shield(self._current())
            except StoreError as exc:
                logger.warning(
                    "tenant cache not refreshed: %s", exc, extra={"action": "token_refresh_failed"}
                )

    async def ensure_uid_slot(self, client: str) -> None:
        """Give ``client`` a uid slot if this daemon knows none (an anonymous
        client, or a tenant added since the last reload); once per client."""
        if client not in self.uid_slots:
            slot = await self._store.ensure_uid_slot(client)
            self.uid_slots = {**self.uid_slots, client: slot}

    async def client_for(self, token: str) -> str | None:
        """The client that owns ``token`` (``ADMIN`` for an operator token), or None."""
        # Lookup by digest in a dict rather than a constant-time compare: an
        # attacker cannot steer a keyed digest (nor, without a preimage, the
        # legacy SHA-256 one) towards a stored one, so the probe's timing says
        # nothing about valid tokens. The key is read at start (app calls
        # reload() before serving), so it is set here unless the store failed.
        seen = self._began  # reloads begun before this request came
        client = self._lookup(token)
        if client is not None:
            return client
        with contextlib.suppress(StoreError):  # then the last good copy stands
            await self._read_after(seen, paced=True, found=lambda: self._lookup(token) is not None)
        return self._lookup(token)

    def _lookup(self, token: str) -> str | None:
        key = self._key
        if key is None:
            return None
        by_hash = self._by_hash
        client = by_hash.get(hash_token(token, key))
        if client is None:
            client = by_hash.get(legacy_hash_token(token))
        return client

    async def _read_after(self, seen: int, *, paced: bool, found: Callable[[], bool]) -> None:
        """Return once the copy in force was read by a reload that began after
        ``seen`` reloads had, or once ``found()`` after a reload ended. Reloads
        in flight are joined; ``paced``: new ones begin at most one every
        ``MISS_RELOAD_S``. StoreError when the reload waited for fails."""
        loop = asyncio.get_running_loop()
        while self._copy <= seen:
            if self._reloading is None and paced:
                pause = self._began_at + self.MISS_RELOAD_S - loop.time()
                if pause > 0:
                    await asyncio.sleep(pause)  # a reload may begin or end meanwhile
                    if found():
                        return
                    continue
            await asyncio.shield(self._current())
            if found():
                return

    def _current(self) -> asyncio.Future[None]:
        """The reload in flight, or a new one."""
        if self._reloading is None:
            self._began += 1
            self._began_at = asyncio.get_running_loop().time()
            task = asyncio.ensure_future(self._read(self._began))
            self._reloading = task
            task.add_done_callback(self._reloaded)
        return self._reloading

    def _reloaded(self, task: asyncio.Future[None]) -> None:
        if self._reloading is task:
            self._reloading = None
        if not task.cancelled():
            task.exception()  # seen: its waiters may all have gone

    async def _read(self, number: int) -> None:
        if self._key is None:
            self._key = await self._store.token_key()
        by_hash = await self._store.tenant_tokens()
        for digest in await self._store.admin_tokens():
            by_hash[digest] = ADMIN
        if self._limits is not None:
            self._limits.update(await self._store.tenant_limits())
        self.uid_slots = await self._store.tenant_uid_slots()
        self._by_hash = by_hash
        self._copy = number
        self.loaded = True


def _never() -> bool:
    return False
