"""Request bodies: read in time, within a byte limit and within the memory all
bodies being read may take.

A body is read whole before a route uses it, so the bodies in flight are
memory the daemon holds. ``BodyBudget`` bounds their bytes in all and per
tenant: a body's announced length (or, when it comes chunked, what has come so
far) is reserved before it is read; one that does not fit is refused at once,
``429`` when its tenant holds its share, ``503`` when the daemon holds all of
it, both with ``Retry-After``. Routes check the tenant's token and quotas
before they read (``jobs.add_jobs``), so a refused add costs no body.

Time: the body must keep coming (``patience`` seconds plus one for every
``MIN_BODY_RATE`` bytes received) and be whole within ``total`` seconds.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from queue_daemon.api import errors

logger = logging.getLogger(__name__)

# A body slower than this (bytes/s, on average) runs out of time once the client
# timeout has passed: a slow upload keeps going, a trickle does not.
MIN_BODY_RATE = 16 << 10
RETRY_AFTER_S = 1.0


class BodyBudget:
    """Bytes of request bodies being read: at most ``total``, ``per_tenant`` each."""

    def __init__(self, total: int, per_tenant: int) -> None:
        self.total = total
        self.per_tenant = min(per_tenant, total)
        self.used = 0
        self._by_tenant: dict[str, int] = {}

    def take(self, client: str, size: int) -> None:
        """Reserve ``size`` more bytes for ``client``, or raise the refusal."""
        held = self._by_tenant.get(client, 0)
        if held + size > self.per_tenant:
            raise errors.rate_limited(
                f"this tenant's request bodies being read would pass {self.per_tenant} bytes",
                RETRY_AFTER_S,
            )
        if self.used + size > self.total:
            raise errors.unavailable(f"the request bodies being read would pass {self.total} bytes")
        self._by_tenant[client] = held + size
        self.used += size

    def give_back(self, client: str, size: int) -> None:
        held = self._by_tenant.get(client, 0) - size
        if held > 0:
            self._by_tenant[client] = held
        else:
            self._by_tenant.pop(client, None)
        self.used -= size


async def read_body(
    request: web.Request,
    limit: int,
    patience: float,
    *,
    budget: BodyBudget | None = None,
    client: str = "",
    total: float = float("inf"),
) -> bytes:
    """The request body: at most ``limit`` bytes (else 413), in time (else 408),
    within ``budget`` for ``client`` (else 429 or 503)."""
    length = request.content_length
    if length is not None and length > limit:
        raise errors.too_large(f"request body of {length} bytes is over the limit of {limit}")
    content = request.content
    if length is not None and content.is_eof() and content.total_bytes == length:
        # the whole body came with the headers (a small add): nothing to wait for,
        # and its bytes are already held, so no budget to reserve
        return content.read_nowait()
    loop = asyncio.get_running_loop()
    began = loop.time()
    deadline = began + patience
    content = request.content
    chunks: list[bytes] = []
    size = 0
    reserved = 0
    try:
        if budget is not None and length:
            budget.take(client, length)
            reserved = length
        while True:
            try:
                async with asyncio.timeout_at(min(deadline, began + total)):
                    chunk = await content.readany()
            except TimeoutError:
                logger.debug("slow request body", extra={"action": "client_timeout"})
                # the rest of the body is read and dropped for a moment after the reply
                # (the server's lingering time) before the connection closes: closing with
                # unread bytes would reset it and could destroy the reply on its way
                raise errors.timeout(
                    f"the request body did not arrive in time ({size} bytes received)"
                ) from None
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise errors.too_large(f"request body over the limit of {limit} bytes")
            if budget is not None and size > reserved:  # chunked, or longer than announced
                budget.take(client, size - reserved)
                reserved = size
            chunks.append(chunk)
            deadline += len(chunk) / MIN_BODY_RATE
    finally:
        if budget is not None and reserved:
            budget.give_back(client, reserved)
