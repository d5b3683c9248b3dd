"""The interface the daemon depends on; ``store.pg.PgStore`` implements it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from store.models import Job, JobPage, JobState, NewJob, Tenant, TypeStats


class Store(Protocol):
    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless a trivial query succeeds."""

    # jobs
    async def add_jobs(self, jobs: Sequence[NewJob]) -> int:
        """Insert jobs, idempotent by id; return how many rows were new."""

    async def get_job(self, client: str, job_id: str) -> Job:
        """Raise NotFound when absent or owned by another client."""

    async def list_jobs(
        self,
        client: str,
        *,
        type: str | None = None,
        state: JobState | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage: ...

    async def stats(self, client: str) -> dict[str, TypeStats]:
        """Counts per type (without the client prefix)."""

    async def cancel_job(self, client: str, job_id: str) -> Job:
        """Waiting -> done/failed/499. NotFound, or Conflict when running or done."""

    # tenants
    async def add_tenant(self, client: str, token_hash: bytes) -> None:
        """Create, or re-activate with a new token hash if revoked. Conflict if active."""

    async def list_tenants(self) -> list[Tenant]: ...

    async def tenant_tokens(self) -> dict[bytes, str]:
        """token_hash -> client for every active tenant."""

    async def revoke_tenant(self, client: str) -> None:
        """NotFound if no such active tenant."""

    # sysids
    async def reserve_sysid(
        self,
        sysid: str | None,
        *,
        holder: str,
        host: str,
        data_dir: str,
        lease: float,
        takeover: bool = False,
    ) -> str:
        """Lease ``sysid`` (or a new unique one when None) for ``lease`` seconds.

        Raise SysidTaken when another holder's lease is live, unless ``takeover``
        and the row's host and data_dir equal ours (the caller proved by a file
        lock that the previous holder on this machine is dead).
        """

    async def renew_sysid(self, sysid: str, *, holder: str, lease: float) -> None:
        """Extend the lease; SysidTaken if someone else holds it now."""

    async def release_sysid(self, sysid: str, *, holder: str) -> None: ...
