"""The blob routes of docs/api.md: a tenant's bytes by content address.

``PUT /{client}/blob`` keeps the body (at most ``BLOB_LIMIT`` bytes) and
answers its address, ``sha256:<hex>`` of the bytes; putting the same bytes
again answers the same. ``GET`` and ``DELETE /{client}/blob/{addr}`` read and
remove it; another tenant's address is ``404``. A tenant holds at most its
``blobs`` limit of bytes (``413`` past it).
"""

from __future__ import annotations

import hashlib
import re

from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize
from queue_daemon.api.web import SERVICES, json_response, read_body
from queue_daemon.store.errors import Conflict, LimitReached, NotFound

BLOB_LIMIT = 16 << 20  # bytes of one blob
ADDR_RE = re.compile(r"sha256:[0-9a-f]{64}")


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


async def get_blob(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    addr = address(request.match_info["addr"])
    data = await services.blobs.read_blob(client, addr)
    if data is None:
        raise errors.not_found("no such blob")
    return web.Response(body=data, content_type="application/octet-stream")


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
