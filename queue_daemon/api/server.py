"""aiohttp's server, with the errors of its HTTP parser in the API's JSON error
shape, and a cap on the connections it holds.

A request that aiohttp's parser rejects (oversized headers or URL, a bad
Content-Length or chunk size, garbage) never reaches the application or its
middleware: ``RequestHandler.handle_error`` answers it directly, in plain
text, and logs a traceback. Here it answers with ``{"error", "message"}`` and
logs client mistakes at debug level only.

Every connection holds a descriptor and some memory, with or without a
request: ``ConnectionCaps`` bounds them in total (what the open-files limit
leaves once the store, the journal and the runners have theirs) and per
client address. A connection over a cap first evicts the oldest connection
(of that address, or of anyone for the total) that has no request in
progress: one idle or still sending its headers, as a connection that sends
half a request and then nothing does. When every one is busy, the new one is
answered ``503`` and closed. The log says so once per ``LOG_EVERY`` seconds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
from collections import Counter
from typing import Any, cast

import orjson
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler

logger = logging.getLogger(__name__)

_QUOTED = re.compile(r"b?'[^']*'|b?\"[^\"]*\"")  # a quoted part of the request
_KINDS = {413: "too_large", 431: "too_large", 404: "not_found", 405: "method_not_allowed"}


LOG_EVERY = 10.0  # seconds between log lines about refused connections
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class ConnectionCaps:
    """The connections a server holds, at most ``total`` and ``per_address``."""

    def __init__(self, total: int, per_address: int) -> None:
        self.total = max(1, total)
        self.per_address = max(1, per_address)
        self._open: dict[RequestHandler, str] = {}  # oldest first
        self._by_address: Counter[str] = Counter()
        self.refused = 0  # connections answered 503 at once
        self.evicted = 0  # connections closed for a newer one
        self._unlogged = 0
        self._logged_at = float("-inf")

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, handler: RequestHandler, address: str) -> bool:
        """Whether ``handler``'s new connection from ``address`` may stay (it is
        counted then), evicting an idle one where a cap is reached."""
        if self._by_address[address] >= self.per_address and not self._evict(address):
            return self._refuse(f"{self.per_address} from {address}")
        if len(self._open) >= self.total and not self._evict(None):
            return self._refuse(f"{self.total} in all")
        self._open[handler] = address
        self._by_address[address] += 1
        return True

    def release(self, handler: RequestHandler) -> None:
        address = self._open.pop(handler, None)
        if address is not None:
            self._by_address[address] -= 1
            if not self._by_address[address]:
                del self._by_address[address]

    def _evict(self, address: str | None) -> bool:
        for handler, held_by in self._open.items():
            if (address is None or held_by == address) and handler._current_request is None:
                self.release(handler)
                handler.force_close()
                self.evicted += 1
                return True
        return False

    def _refuse(self, cap: str) -> bool:
        self.refused += 1
        self._unlogged += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at >= LOG_EVERY:
            logger.warning(
                "%d connection(s) refused: the cap of %s is held by requests in progress",
                self._unlogged,
                cap,
                extra={"action": "connections_capped", "refused": self._unlogged},
            )
            self._logged_at, self._unlogged = now, 0
        return False


_OUT_OF = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def quiet_exhaustion(loop: asyncio.AbstractEventLoop) -> None:
    """Log the loop's errors of running out of descriptors or buffers (an accept
    that failed, every time it is retried) once per ``LOG_EVERY`` seconds, with
    a count, instead of a traceback each time; others as before."""
    state = {"at": float("-inf"), "unlogged": 0}

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in _OUT_OF):
            loop.default_exception_handler(context)
            return
        state["unlogged"] += 1
        if loop.time() - state["at"] >= LOG_EVERY:
            logger.error(
                "%s (%d time(s) since the last such line): %s",
                context.get("message", "out of a system resource"),
                state["unlogged"],
                exc,
                extra={"action": "resource_exhausted"},
            )
            state["at"], state["unlogged"] = loop.time(), 0

    loop.set_exception_handler(handle)


class _JsonErrorHandler(RequestHandler):
    caps: ConnectionCaps | None = None  # set on the class the server hands out

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        caps = self.caps
        if caps is None:
            return
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if not caps.admit(self, address):
            body = orjson.dumps(
                {"error": "unavailable", "message": "too many connections; try again shortly"}
            )
            cast(asyncio.Transport, transport).write(_REFUSED % (len(body), body))
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.caps is not None:
            self.caps.release(self)
        super().connection_lost(exc)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            logger.warning(
                "request failed before the application: %s",
                exc or message,
                extra={"action": "http_error", "status": status},
            )
            kind, text = "internal", "internal error"
        else:
            logger.debug("bad request: %s", exc or message, extra={"action": "http_bad_request"})
            kind = _KINDS.get(status, "bad_request")
            text = _reason(exc, message)
        if request.writer.output_size > 0:
            raise ConnectionError("the response was already started; closing the connection")
        response = web.Response(
            status=status,
            body=orjson.dumps({"error": kind, "message": text}),
            content_type="application/json",
        )
        response.force_close()
        return response


def _reason(exc: BaseException | None, message: str | None) -> str:
    if isinstance(exc, LineTooLong):
        # its own message quotes the start of the oversized line back to the client
        return "the request line or a header field is over 8190 bytes"
    text = str(getattr(exc, "message", "") or message or exc or "bad request")
    # the parser's messages quote the raw line they stopped at (":\n\n  b'…'\n  ^"),
    # which may be the request's Authorization header: keep the description only,
    # and no quoted part of the request in it
    text = text.split("\n", 1)[0].strip().rstrip(":")
    text = _QUOTED.sub("…", text)
    return text[:200] or "bad request"


class _JsonErrorServer(web.Server):
    handler_class: type[_JsonErrorHandler] = _JsonErrorHandler

    def __call__(self) -> RequestHandler:
        return self.handler_class(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser errors in JSON and are
    held within ``caps`` (none: no cap)."""

    def __init__(self, app: web.Application, *, caps: ConnectionCaps | None = None, **kwargs: Any):
        super().__init__(app, **kwargs)
        self.caps = caps

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp offers no hook for the handler class; swapping the class of
        # the server it built (same state, one method overridden) is the
        # smallest change that keeps everything else aiohttp's own.
        server.__class__ = _JsonErrorServer
        handler = type("_CappedHandler", (_JsonErrorHandler,), {"caps": self.caps})
        cast(_JsonErrorServer, server).handler_class = handler
        return server
