"""Tenants and their stored handler versions."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenant:
    client: str
    token_hash: bytes  # of its newest token
    created_at: datetime
    revoked_at: datetime | None
    live_tokens: int = 0  # tokens that work now (0 once revoked; 2 during a rotation's grace)
    grace_until: datetime | None = None  # the soonest end of a live token's grace period
    limits: dict[str, float] = field(default_factory=dict)  # overrides of the daemon defaults


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerRecord:
    """A stored handler version. ``data`` holds the JSON fields of docs/api.md."""

    id: str  # version id, unique
    type: str  # stored jobtype, "client-type"
    dt: datetime
    data: dict[str, object]  # lang, body, before, beforeEach, afterEach, eid, timeout, then, ...
