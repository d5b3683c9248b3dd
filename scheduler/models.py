"""What the scheduler hands back, and how a stored jobtype names its tenant."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Pick:
    """Claim up to `limit` (>= 1) waiting jobs of `jobtype` next."""

    jobtype: str
    limit: int


def tenant_of(jobtype: str) -> str:
    """The client part of a stored `client-type` name (clients never contain `-`)."""
    return jobtype.partition("-")[0]
