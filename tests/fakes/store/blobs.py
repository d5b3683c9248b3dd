"""Blobs (``BlobStore``) in memory."""

from __future__ import annotations

from queue_daemon.domain.names import JobType
from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.store.errors import Conflict, LimitReached, NotFound
from tests.fakes.store.handlers import Handlers
from tests.fakes.store.tables import client_of


class Blobs(Handlers):
    def __init__(self) -> None:
        super().__init__()
        self.blobs: dict[tuple[str, str], bytes] = {}

    async def put_handler(
        self, type: str, data: dict[str, object], max_handlers: int | None = None
    ) -> HandlerRecord:
        module = data.get("module")
        if module and (client_of(type), module) not in self.blobs:
            self._call("put_handler")
            raise NotFound(f"no blob {module}")
        return await super().put_handler(type, data, max_handlers)

    async def put_blob(self, client: str, addr: str, data: bytes, max_bytes: int = 0) -> bool:
        self._call("put_blob")
        if (client, addr) in self.blobs:
            return False
        held = sum(len(d) for (c, _), d in self.blobs.items() if c == client)
        if max_bytes and held + len(data) > max_bytes:
            raise LimitReached(f"{client} holds {held} bytes of blobs")
        self.blobs[(client, addr)] = bytes(data)
        return True

    async def read_blob(self, client: str, addr: str) -> bytes | None:
        self._call("read_blob")
        return self.blobs.get((client, addr))

    async def delete_blob(self, client: str, addr: str) -> None:
        self._call("delete_blob")
        for type, record in self.handlers.items():
            if client_of(type) == client and record.data.get("module") == addr:
                raise Conflict(f"the handler of {JobType.parse(type).name} runs it")
        if self.blobs.pop((client, addr), None) is None:
            raise NotFound(f"no blob {addr}")
