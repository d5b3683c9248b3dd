"""DSNs of one PostgreSQL server's databases."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointed at another database of the same server."""
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))
