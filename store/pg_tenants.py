"""Tenants, their tokens and limits, and operator tokens (``TenantStore``)."""

from __future__ import annotations

import logging

import asyncpg
import orjson

from queue_daemon.domain.tenants import Tenant
from queue_daemon.store import queries
from queue_daemon.store.errors import Conflict, NotFound, StoreError
from queue_daemon.store.pg_base import Db

logger = logging.getLogger(__name__)


class TenantsPart:
    """Tenants, their tokens and limits, and operator tokens (``TenantStore``)."""

    def __init__(self, db: Db) -> None:
        self._db = db

    # --- tenants ----------------------------------------------------------

    async def add_tenant(self, client: str, token_hash: bytes) -> None:
        try:
            async with self._db.conn() as conn, conn.transaction():
                if await conn.fetchrow(queries.tenants.ADD_TENANT, client) is None:
                    raise Conflict(f"tenant {client!r} exists")
                await conn.execute(queries.tenants.ADD_UID_SLOT, client)
                await conn.execute(queries.tenants.DELETE_TENANT_TOKENS, client)
                await conn.execute(queries.tenants.INSERT_TENANT_TOKEN, client, token_hash)
        except StoreError as exc:
            if isinstance(exc.__cause__, asyncpg.UniqueViolationError):
                raise Conflict("token hash already in use") from exc
            raise

    async def rotate_tenant(self, client: str, new_hash: bytes, grace: float) -> None:
        """Give ``client`` the token ``new_hash``; its current token stays live
        for ``grace`` seconds more, and any older one ends now (at most two live
        tokens). NotFound if no such active tenant."""
        try:
            async with self._db.conn() as conn, conn.transaction():
                row = await conn.fetchrow(queries.tenants.LOCK_TENANT, client)
                if row is None or row["revoked_at"] is not None:
                    raise NotFound(f"no active tenant {client!r}")
                await conn.execute(queries.tenants.ROTATE_DROP_OLD, client)
                await conn.execute(queries.tenants.ROTATE_EXPIRE_CURRENT, client, float(grace))
                await conn.execute(queries.tenants.INSERT_TENANT_TOKEN, client, new_hash)
        except StoreError as exc:
            if isinstance(exc.__cause__, asyncpg.UniqueViolationError):
                raise Conflict("token hash already in use") from exc
            raise

    async def list_tenants(self) -> list[Tenant]:
        rows = await self._db.fetch(queries.tenants.LIST_TENANTS)
        return [
            Tenant(
                client=row["client"],
                token_hash=bytes(row["token_hash"]),
                created_at=row["created_at"],
                revoked_at=row["revoked_at"],
                live_tokens=row["live_tokens"],
                grace_until=row["grace_until"],
                limits=orjson.loads(row["limits"]),
            )
            for row in rows
        ]

    async def revoke_tenant(self, client: str) -> None:
        if await self._db.fetchrow(queries.tenants.REVOKE_TENANT, client) is None:
            raise NotFound(f"no active tenant {client!r}")

    async def tenant_tokens(self) -> dict[bytes, str]:
        """token_hash -> client for every live token (database clock)."""
        rows = await self._db.fetch(queries.tenants.TENANT_TOKENS)
        return {bytes(row["token_hash"]): row["client"] for row in rows}

    async def tenant_uid_slots(self) -> dict[str, int]:
        """client -> its slot in the range of tenant uids (unique, never reused)."""
        rows = await self._db.fetch(queries.tenants.TENANT_UID_SLOTS)
        return {row["client"]: row["slot"] for row in rows}

    async def ensure_uid_slot(self, client: str) -> int:
        """``client``'s uid slot, given now if it has none."""
        row = await self._db.fetchrow(queries.tenants.ENSURE_UID_SLOT, client)
        assert row is not None
        return int(row["slot"])

    async def tenant_limits(self) -> dict[str, dict[str, float]]:
        """client -> its limit overrides, for active tenants that have any."""
        rows = await self._db.fetch(queries.tenants.TENANT_LIMITS)
        return {row["client"]: orjson.loads(row["limits"]) for row in rows}

    async def get_tenant_limits(self, client: str) -> dict[str, float]:
        """NotFound if no such active tenant."""
        row = await self._db.fetchrow(queries.tenants.GET_TENANT_LIMITS, client)
        if row is None:
            raise NotFound(f"no active tenant {client!r}")
        limits: dict[str, float] = orjson.loads(row["limits"])
        return limits

    async def set_tenant_limits(self, client: str, limits: dict[str, float]) -> dict[str, float]:
        """Replace ``client``'s overrides; NotFound if no such active tenant."""
        row = await self._db.fetchrow(
            queries.tenants.SET_TENANT_LIMITS, client, orjson.dumps(limits).decode()
        )
        if row is None:
            raise NotFound(f"no active tenant {client!r}")
        stored: dict[str, float] = orjson.loads(row["limits"])
        return stored

    async def count_waiting(self, client: str) -> int:
        """``client``'s waiting, scheduled and blocked jobs, from the state counts."""
        async with self._db.conn() as conn:
            count: int = await conn.fetchval(
                queries.counts.COUNT_WAITING, f"{client}-", f"{client}."
            )
        return count

    async def new_admin_token(self, token_hash: bytes, grace: float) -> None:
        """Make ``token_hash`` the current operator token; the previous one stays
        live for ``grace`` seconds, older ones end now."""
        async with self._db.conn() as conn, conn.transaction():
            await conn.execute(queries.tenants.LOCK_ADMIN_TOKENS)
            await conn.execute(queries.tenants.ADMIN_DROP_OLD)
            await conn.execute(queries.tenants.ADMIN_EXPIRE_CURRENT, float(grace))
            await conn.execute(queries.tenants.INSERT_ADMIN_TOKEN, token_hash)

    async def revoke_admin_tokens(self) -> int:
        """End every operator token; how many there were."""
        async with self._db.conn() as conn:
            status: str = await conn.execute(queries.tenants.REVOKE_ADMIN_TOKENS)
        return int(status.split()[-1])

    async def admin_tokens(self) -> set[bytes]:
        """Digests of the live operator tokens (database clock)."""
        rows = await self._db.fetch(queries.tenants.ADMIN_TOKENS)
        return {bytes(row["token_hash"]) for row in rows}

    async def token_key(self) -> bytes:
        """The per-store HMAC key for token hashes (created by migration 0004)."""
        async with self._db.conn() as conn:
            value = await conn.fetchval(queries.tenants.TOKEN_KEY)
        if value is None:
            raise StoreError("the store has no token key; is migration 0004 applied?")
        return bytes(value)
