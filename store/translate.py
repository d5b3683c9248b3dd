"""The edge where asyncpg's exceptions become ``queue_daemon.store.errors``."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from queue_daemon.store.errors import StoreError, StoreUnavailable

# SQLSTATE classes that mean "the server is not there for us right now":
# 08 connection exception, 53 insufficient resources (too many connections),
# 57 operator intervention (admin/crash shutdown, cannot connect now).
_UNAVAILABLE_CLASSES = ("08", "53", "57")


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the server or the connection to it is gone."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        # the server answered with a certificate the DSN does not accept (another
        # name, another CA): a setting to fix, like a wrong password, not an outage
        return False
    if isinstance(exc, asyncpg.PostgresError):
        sqlstate = exc.sqlstate or ""
        return sqlstate[:2] in _UNAVAILABLE_CLASSES
    if isinstance(exc, asyncpg.InterfaceError):
        # the bare class is "connection is closed" / "pool is closing"; its
        # subclasses (DataError, ClientConfigurationError, ...) are our bugs
        return type(exc) is asyncpg.InterfaceError
    # InternalClientError: a connection whose server went away while it sat idle
    # in the pool is found in a broken protocol state; OSError: refused / reset /
    # no socket; TimeoutError: a connect or command timeout against a dead server
    return isinstance(exc, asyncpg.InternalClientError | OSError | TimeoutError)


@contextmanager
def translate() -> Iterator[None]:
    """Re-raise any asyncpg or socket error as a ``StoreError``."""
    try:
        yield
    except StoreError:
        raise
    except (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.InternalClientError,
        OSError,
        TimeoutError,
    ) as exc:
        if is_unavailable(exc):
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        raise StoreError(f"{type(exc).__name__}: {exc}") from exc
