"""The store's exceptions: asyncpg errors never leave the package."""


class StoreError(Exception):
    """Base of every error the store raises."""


class StoreUnavailable(StoreError):
    """PostgreSQL cannot be reached (down, restarting, connection lost)."""


class NotFound(StoreError):
    """No such row for this tenant (absent and not-owned look the same)."""


class Conflict(StoreError):
    """The row exists but is in a state that forbids the operation."""


class SysidTaken(StoreError):
    """The sysid is leased by another live daemon."""


class BadCursor(StoreError):
    """A paging cursor that the store did not produce."""


class LimitReached(StoreError):
    """A tenant's limit forbids the operation (e.g. its number of handlers)."""
