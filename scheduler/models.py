"""What the scheduler hands back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Pick:
    """Claim up to `limit` (>= 1) waiting jobs of `jobtype` next."""

    jobtype: str
    limit: int
