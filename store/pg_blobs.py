"""Blobs (``BlobStore``): a tenant's bytes by content address."""

from __future__ import annotations

from queue_daemon.domain.names import JobType
from queue_daemon.store import queries
from queue_daemon.store.errors import Conflict, LimitReached, NotFound
from queue_daemon.store.pg_base import Db


class BlobsPart:
    """Blobs (``BlobStore``)."""

    def __init__(self, db: Db) -> None:
        self._db = db

    async def put_blob(self, client: str, addr: str, data: bytes, max_bytes: int = 0) -> bool:
        """Keep ``data`` as ``client``'s blob ``addr`` (its digest, checked by the
        caller); True if it is new. LimitReached when the tenant would hold more
        than ``max_bytes`` (0: no limit)."""
        async with self._db.conn() as conn, conn.transaction():
            await conn.execute(queries.blobs.LOCK_CLIENT_BLOBS, client)
            if await conn.fetchval(queries.blobs.BLOB_SIZE, client, addr) is not None:
                return False
            if max_bytes:
                held: int = await conn.fetchval(queries.blobs.CLIENT_BYTES, client)
                if held + len(data) > max_bytes:
                    raise LimitReached(f"{client} holds {held} bytes of blobs")
            await conn.execute(queries.blobs.PUT_BLOB, client, addr, len(data), data)
        return True

    async def read_blob(self, client: str, addr: str) -> bytes | None:
        data: bytes | None = await self._db.fetchval(queries.blobs.READ_BLOB, client, addr)
        return data

    async def delete_blob(self, client: str, addr: str) -> None:
        """NotFound if ``client`` has no such blob; Conflict while the current
        handler of one of its types runs it (its ``module``)."""
        async with self._db.conn() as conn, conn.transaction():
            await conn.execute(queries.blobs.LOCK_CLIENT_BLOBS, client)
            user = await conn.fetchval(queries.blobs.BLOB_IN_USE, client, addr)
            if user is not None:
                raise Conflict(f"the handler of {JobType.parse(user).name} runs it")
            if await conn.fetchval(queries.blobs.DELETE_BLOB, client, addr) is None:
                raise NotFound(f"no blob {addr}")
