"""Per-tenant limits: the daemon's flags are the defaults, the store holds overrides.

An operator sets a tenant's overrides with ``queue-daemon tenant limits`` or
``POST /admin/tenants/{client}/limits``; every daemon reads them with its token
cache (every ``--token-refresh`` seconds), so a change applies everywhere
within that interval. A key the tenant has no override for follows the flag.

The limits and where they bite:

- ``running``: jobs of the tenant running at once in one daemon (scheduler).
- ``waiting``: waiting and scheduled jobs; adds beyond it get ``429``.
- ``rate`` / ``burst``: the add token bucket (``429`` / ``413``).
- ``payload``: bytes per payload line, of adds and of follow-on jobs (``413``).
- ``result``: bytes of a job's result kept; a longer one is cut.
- ``handlers``: live handlers (jobtypes with code); one more is ``409``.
- ``follow_ons``: follow-on jobs one run may add; the rest are dropped.
- ``emit``: bytes of follow-on payloads one run may add; the rest are dropped
  (contexts drop what ``ctx.emit`` adds past it, or past what the add rate
  takes now: that run is retried, ``engine.admit.followons``).
- ``blobs``: bytes of blobs the tenant holds; a put past it is ``413``.

``0`` means "no limit" for running, waiting, rate, handlers and blobs, and "none" for
follow_ons and emit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

# key -> (integral?, smallest allowed value)
_KEYS: dict[str, tuple[bool, float]] = {
    "running": (True, 0),
    "waiting": (True, 0),
    "rate": (False, 0),
    "burst": (False, 1),
    "payload": (True, 1),
    "result": (True, 0),
    "handlers": (True, 0),
    "follow_ons": (True, 0),
    "emit": (True, 0),
    "blobs": (True, 0),
}
LIMIT_KEYS = tuple(_KEYS)
MAX_LIMIT = 1 << 53  # any larger number is surely a mistake (and not exact in JSON)


class LimitsError(ValueError):
    """An override that is not a known key with a number in range."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantLimits:
    """One tenant's effective limits (0 = no limit for running, waiting, rate, handlers)."""

    running: int = 0
    waiting: int = 1_000_000
    rate: float = 100_000.0
    burst: float = 200_000.0
    payload: int = 1 << 20
    result: int = 1 << 20
    handlers: int = 1000
    follow_ons: int = 1000
    emit: int = 4 << 20
    blobs: int = 1 << 30

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_overrides(self, overrides: Mapping[str, float]) -> TenantLimits:
        # stored overrides were validated when set; ints stay ints where integral
        known: dict[str, Any] = {
            key: int(value) if _KEYS[key][0] else float(value)
            for key, value in overrides.items()
            if key in _KEYS
        }
        return replace(self, **known)


def validate_overrides(raw: object) -> dict[str, float]:
    """Overrides as given by an operator, checked: a JSON object of known keys
    whose values are numbers in range (integers where the limit counts things)."""
    if not isinstance(raw, dict):
        raise LimitsError("limits must be a JSON object")
    checked: dict[str, float] = {}
    for key, value in raw.items():
        if key not in _KEYS:
            raise LimitsError(f"unknown limit {key!r}; known: {', '.join(LIMIT_KEYS)}")
        integral, low = _KEYS[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LimitsError(f"limit {key!r} must be a number")
        if value != value or not low <= value <= MAX_LIMIT:  # NaN, or out of range
            raise LimitsError(f"limit {key!r} must be between {low:g} and {MAX_LIMIT}")
        if integral and value != int(value):
            raise LimitsError(f"limit {key!r} must be a whole number")
        checked[key] = int(value) if integral else float(value)
    return checked


class Limits:
    """The effective limits of every tenant, kept current from the store."""

    def __init__(self, defaults: TenantLimits) -> None:
        self.defaults = defaults
        self._overrides: dict[str, dict[str, float]] = {}
        self._effective: dict[str, TenantLimits] = {}
        self._listeners: list[Callable[[Limits], None]] = []

    def of(self, client: str) -> TenantLimits:
        limits = self._effective.get(client)
        return self.defaults if limits is None else limits

    def overridden(self) -> dict[str, TenantLimits]:
        """Effective limits of the tenants that have overrides."""
        return dict(self._effective)

    def on_change(self, listener: Callable[[Limits], None]) -> None:
        self._listeners.append(listener)
        listener(self)

    def update(self, overrides: Mapping[str, Mapping[str, float]]) -> None:
        """Replace every tenant's overrides (as read from the store)."""
        fresh = {client: dict(values) for client, values in overrides.items() if values}
        if fresh == self._overrides:
            return
        self._overrides = fresh
        self._effective = {
            client: self.defaults.with_overrides(values) for client, values in fresh.items()
        }
        for listener in self._listeners:
            listener(self)
