"""The store's ports for what a tenant owns besides its jobs: the tenant itself
(tokens, limits, uids), its handlers and its schedules; and the admin tokens.
Re-exported by ``queue_daemon.store.ports``, which lists every port and who uses it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from queue_daemon.domain.schedules import DueSchedule, Schedule, TickAdded
from queue_daemon.domain.tenants import HandlerRecord, Tenant


class TenantStore(Protocol):
    async def add_tenant(self, client: str, token_hash: bytes) -> None:
        """Create, or re-activate with a new token hash if revoked. Conflict if active."""

    async def list_tenants(self) -> list[Tenant]: ...

    async def rotate_tenant(self, client: str, new_hash: bytes, grace: float) -> None:
        """New current token; the previous one stays live for ``grace`` seconds,
        older ones end now. NotFound if no such active tenant."""

    async def tenant_tokens(self) -> dict[bytes, str]:
        """token_hash -> client for every live token: its tenant is active and
        its grace (if any) has not ended by the database clock."""

    async def tenant_uid_slots(self) -> dict[str, int]:
        """client -> its slot in the range of tenant uids (unique, never reused)."""

    async def ensure_uid_slot(self, client: str) -> int:
        """``client``'s uid slot, given now if it has none."""

    async def tenant_limits(self) -> dict[str, dict[str, float]]:
        """client -> its limit overrides, for active tenants that have any."""
        ...

    async def get_tenant_limits(self, client: str) -> dict[str, float]:
        """NotFound if no such active tenant."""
        ...

    async def set_tenant_limits(self, client: str, limits: dict[str, float]) -> dict[str, float]:
        """Replace ``client``'s overrides; NotFound if no such active tenant."""
        ...

    async def count_waiting(self, client: str) -> int:
        """``client``'s waiting, scheduled and blocked jobs (lock '')."""
        ...

    async def new_admin_token(self, token_hash: bytes, grace: float) -> None:
        """New current operator token; the previous one stays live for ``grace`` s."""
        ...

    async def revoke_admin_tokens(self) -> int:
        """End every operator token; how many there were."""
        ...

    async def admin_tokens(self) -> set[bytes]:
        """Digests of the live operator tokens."""
        ...

    async def token_key(self) -> bytes:
        """The per-store secret key of the keyed token hash."""

    async def revoke_tenant(self, client: str) -> None:
        """NotFound if no such active tenant."""


class BlobStore(Protocol):
    async def put_blob(self, client: str, addr: str, data: bytes, max_bytes: int = 0) -> bool:
        """Keep ``client``'s blob ``addr``; True if new. LimitReached past ``max_bytes``."""

    async def read_blob(self, client: str, addr: str) -> bytes | None:
        """The bytes of ``client``'s blob ``addr``; None if it has none."""

    async def delete_blob(self, client: str, addr: str) -> None:
        """NotFound if none; Conflict while a current handler's ``module`` names it."""


class HandlerLookup(Protocol):
    async def get_handler(self, type: str) -> HandlerRecord:
        """The newest version; NotFound if none (or deleted)."""


class HandlerStore(HandlerLookup, Protocol):
    async def put_handler(
        self, type: str, data: dict[str, object], max_handlers: int | None = None
    ) -> HandlerRecord:
        """Store a new version of the handler of ``type`` (client-type) and notify.
        LimitReached if ``type`` has no live handler and its tenant already has
        ``max_handlers``; NotFound if ``data`` names a ``module`` blob the tenant
        does not hold (checked under the lock of its blob deletes)."""

    async def delete_handler(self, type: str) -> None:
        """NotFound if none; notify."""

    async def count_handlers(self, client: str) -> int: ...


class ScheduleStore(Protocol):
    async def put_schedule(self, schedule: Schedule, max_schedules: int) -> Schedule:
        """Add or replace ``schedule`` (a new version: a hold on it is dropped).
        LimitReached if it is new and its tenant already has ``max_schedules``."""

    async def list_schedules(self, client: str) -> list[Schedule]: ...

    async def delete_schedule(self, client: str, name: str) -> None:
        """NotFound if none."""

    async def claim_schedules(self, *, sysid: str, limit: int, hold: float) -> list[DueSchedule]:
        """Take up to ``limit`` due schedules no other daemon holds, for ``hold``
        seconds (then any daemon may take them over)."""

    async def next_schedule_due(self) -> float | None:
        """Seconds until a schedule is due (<= 0: now), None when there are none."""

    async def record_ticks(self, ticks: Sequence[TickAdded], *, sysid: str) -> None:
        """Record added ticks and each schedule's next; only rows ``sysid`` still
        holds in the version the tick was added for."""

    async def defer_ticks(
        self, schedules: Sequence[DueSchedule], *, sysid: str, delay: float
    ) -> None:
        """Give back schedules whose tick could not be added now; they are due again
        (the same tick) in ``delay`` seconds."""
