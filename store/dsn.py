"""What can be checked of a DSN before connecting: the files its TLS parameters name.

asyncpg opens them only when it connects, and its error does not say which
file is missing; a file that is not there is no outage to wait out, so a
daemon should not retry it as one.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from queue_daemon.store.errors import StoreError

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
