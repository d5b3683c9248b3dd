"""Tenants, their tokens, uid slots and limits, and operator tokens (``TenantStore``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from queue_daemon.domain.tenants import Tenant
from queue_daemon.store.errors import Conflict, NotFound
from tests.fakes.store.tables import Tables, client_of


@dataclass(slots=True)
class TenantRow:
    created_at: datetime
    revoked_at: datetime | None = None
    limits: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Token:
    owner: str  # a client, or "" for an operator token
    hash: bytes
    created: int  # insertion order: the newest token is the current one
    expires_at: datetime | None = None

    def live(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now


class Tenants(Tables):
    def __init__(self) -> None:
        super().__init__()
        self.tenants: dict[str, TenantRow] = {}
        self.tokens: list[Token] = []  # tenant_tokens
        self.admin: list[Token] = []  # admin_tokens
        self.uid_slots: dict[str, int] = {}
        self._slots = itertools.count(0)
        self._made = itertools.count()

    def _active(self, client: str) -> TenantRow:
        row = self.tenants.get(client)
        if row is None or row.revoked_at is not None:
            raise NotFound(f"no active tenant {client!r}")
        return row

    def _give_token(self, kept: list[Token], client: str, token_hash: bytes) -> None:
        """Replace the tenant tokens with ``kept`` and the new one (one transaction)."""
        if any(t.hash == token_hash for t in kept):
            raise Conflict("token hash already in use")
        self.tokens = [*kept, Token(client, token_hash, next(self._made))]

    async def add_tenant(self, client: str, token_hash: bytes) -> None:
        self._call("add_tenant")
        row = self.tenants.get(client)
        if row is not None and row.revoked_at is None:
            raise Conflict(f"tenant {client!r} exists")
        self._give_token([t for t in self.tokens if t.owner != client], client, token_hash)
        if row is None:
            self.tenants[client] = TenantRow(self.now())
        else:
            row.created_at, row.revoked_at = self.now(), None
        self.uid_slots.setdefault(client, next(self._slots))

    async def pause_tenant(self, client: str, *, paused: bool, known: bool = True) -> None:
        self._call("pause_tenant")
        if not paused:
            self.pauses.discard(client)
            return
        if known:
            self._active(client)
        self.pauses.add(client)

    async def rotate_tenant(self, client: str, new_hash: bytes, grace: float) -> None:
        self._call("rotate_tenant")
        self._active(client)
        kept = [t for t in self.tokens if t.owner != client or t.expires_at is None]
        self._give_token(kept, client, new_hash)
        for token in self.tokens[:-1]:
            if token.owner == client and token.expires_at is None:
                token.expires_at = self.now() + timedelta(seconds=grace)

    async def list_tenants(self) -> list[Tenant]:
        self._call("list_tenants")
        now = self.now()
        listed = []
        for client, row in sorted(self.tenants.items()):
            mine = sorted((t for t in self.tokens if t.owner == client), key=lambda t: t.created)
            live = [t for t in mine if row.revoked_at is None and t.live(now)]
            ends = [t.expires_at for t in live if t.expires_at is not None]
            listed.append(
                Tenant(
                    client=client,
                    token_hash=mine[-1].hash if mine else b"",
                    created_at=row.created_at,
                    revoked_at=row.revoked_at,
                    live_tokens=len(live),
                    grace_until=min(ends, default=None),
                    limits=dict(row.limits),
                )
            )
        return listed

    async def revoke_tenant(self, client: str) -> None:
        self._call("revoke_tenant")
        row = self._active(client)
        now = row.revoked_at = self.now()
        for token in self.tokens:
            if token.owner == client and token.live(now):
                token.expires_at = now

    async def tenant_tokens(self) -> dict[bytes, str]:
        self._call("tenant_tokens")
        now = self.now()
        return {
            t.hash: t.owner
            for t in self.tokens
            if t.live(now) and self.tenants[t.owner].revoked_at is None
        }

    async def tenant_uid_slots(self) -> dict[str, int]:
        self._call("tenant_uid_slots")
        return dict(self.uid_slots)

    async def ensure_uid_slot(self, client: str) -> int:
        self._call("ensure_uid_slot")
        if client not in self.uid_slots:
            self.uid_slots[client] = next(self._slots)
        return self.uid_slots[client]

    async def tenant_limits(self) -> dict[str, dict[str, float]]:
        self._call("tenant_limits")
        return {
            c: dict(row.limits)
            for c, row in self.tenants.items()
            if row.revoked_at is None and row.limits
        }

    async def get_tenant_limits(self, client: str) -> dict[str, float]:
        self._call("get_tenant_limits")
        return dict(self._active(client).limits)

    async def set_tenant_limits(self, client: str, limits: dict[str, float]) -> dict[str, float]:
        self._call("set_tenant_limits")
        row = self._active(client)
        row.limits = dict(limits)
        return dict(limits)

    async def count_waiting(self, client: str) -> int:
        self._call("count_waiting")
        return sum(1 for r in self.rows.values() if r.lock == "" and client_of(r.type) == client)

    async def new_admin_token(self, token_hash: bytes, grace: float) -> None:
        self._call("new_admin_token")
        self.admin = [t for t in self.admin if t.expires_at is None]
        for token in self.admin:
            token.expires_at = self.now() + timedelta(seconds=grace)
        self.admin.append(Token("", token_hash, next(self._made)))

    async def revoke_admin_tokens(self) -> int:
        self._call("revoke_admin_tokens")
        count, self.admin = len(self.admin), []
        return count

    async def admin_tokens(self) -> set[bytes]:
        self._call("admin_tokens")
        now = self.now()
        return {t.hash for t in self.admin if t.live(now)}

    async def token_key(self) -> bytes:
        self._call("token_key")
        return self.secret
