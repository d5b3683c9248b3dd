"""The blob routes of docs/api.md: a tenant's bytes by content address.

``PUT /{client}/blob`` keeps the body (at most ``BLOB_LIMIT`` bytes) and
answers its address, ``sha256:<hex>`` of the bytes; putting the same bytes
again answers the same. ``GET`` and ``DELETE /{client}/blob/{addr}`` read and
remove it; another tenant's address is ``404``. A tenant holds at most its
``blobs`` limit of bytes (``413`` past it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import weakref
from collections.abc import AsyncIterator

from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize
from queue_daemon.api.web import SERVICES, json_response, read_body
from queue_daemon.store.errors import Conflict, LimitReached, NotFound

BLOB_LIMIT = 16 << 20  # bytes of one blob
ADDR_RE = re.compile(r"sha256:[0-9a-f]{64}")
# Blobs read whole into the daemon at once (a GET, an add of one, a wasm
# handler's module being checked): at most this many, so at most this many
# times BLOB_LIMIT bytes; the others wait their turn.
READS_AT_ONCE = 4
_reads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


@contextlib.asynccontextmanager
async def blob_read() -> AsyncIterator[None]:
    """Hold one of the daemon's turns to hold a whole blob in memory."""
    loop = asyncio.get_running_loop()
    turns = _reads.get(loop)
    if turns is None:
        turns = _reads[loop] = asyncio.Semaphore(READS_AT_ONCE)
    async with turns:
        yield


def address(value: str) -> str:
    """``value`` if it is a blob address, else ApiError 400."""
    if ADDR_RE.fullmatch(value) is None:
        raise errors.bad_request("a blob address is sha256: and 64 lowercase hex digits")
    return value


async def put_blob(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    data = await read_body(request, client, BLOB_LIMIT)
    addr = "sha256:" + hashlib.sha256(data).hexdigest()
    limit = services.limits.of(client).blobs
    try:
        await services.blobs.put_blob(client, addr, data, max_bytes=limit)
    except LimitReached:
        raise errors.too_large(
            f"this tenant's blobs would be over its limit of {limit} bytes; delete some first"
        ) from None
    return json_response({"addr": addr, "size": len(data)})


async def get_blob(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    addr = address(request.match_info["addr"])
    async with blob_read():
        data = await services.blobs.read_blob(client, addr)
        if data is None:
            raise errors.not_found("no such blob")
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data)  # sent before the turn is given back
        await response.write_eof()
    return response


async def delete_blob(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    addr = address(request.match_info["addr"])
    try:
        await services.blobs.delete_blob(client, addr)
    except NotFound:
        raise errors.not_found("no such blob") from None
    except Conflict as exc:
        raise errors.conflict(f"{exc}: put another handler first") from None
    return json_response({"addr": addr, "deleted": True})
