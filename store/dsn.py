"""What the daemon does with a DSN before asyncpg connects with it.

The files its TLS parameters name are checked first: asyncpg opens them only
when it connects, and its error does not say which file is missing; a file
that is not there is no outage to wait out, so a daemon should not retry it
as one. A DSN that names several hosts is connected to one host at a time.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg

from queue_daemon.store.errors import StoreError
from queue_daemon.store.translate import is_unavailable

TLS_FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl")


def check_tls_files(dsn: str) -> None:
    """Raise ``StoreError`` naming the first TLS file of ``dsn`` that cannot be read."""
    try:
        query = parse_qs(urlsplit(dsn).query)
    except ValueError:
        return  # asyncpg says what is wrong with the DSN itself
    for key in TLS_FILES:
        for path in query.get(key, []):
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise StoreError(
                    f"the store's DSN names {key}={path}, which cannot be read: "
                    f"{exc.strerror or exc}"
                ) from None


def host_dsns(dsn: str) -> list[str]:
    """A URL DSN naming several hosts (``postgresql://u@db1:5432,db2:5432/db?…``) as
    one DSN per host, in order; any other DSN as it is."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return [dsn]
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if parts.scheme not in ("postgres", "postgresql") or "," not in hosts:
        return [dsn]
    netlocs = [f"{userinfo}{at}{host}" for host in hosts.split(",") if host]
    return [urlunsplit(parts._replace(netloc=netloc)) for netloc in netlocs]


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect``, but the hosts of a DSN that names several are tried one
    after another, each within the whole ``timeout``: asyncpg's own connect gives
    all of them one timeout, which a first host that does not answer (a dead
    machine drops the packets) uses up, and the next is never tried. A host that
    cannot be reached or does not fit ``target_session_attrs`` (a standby) makes
    way for the next; any other error (a wrong password) is raised at once."""
    hosts = host_dsns(dsn)
    for host in hosts[:-1]:
        try:
            return await asyncpg.connect(host, **kwargs)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
    return await asyncpg.connect(hosts[-1], **kwargs)
