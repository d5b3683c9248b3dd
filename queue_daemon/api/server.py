"""aiohttp's server, with the errors of its HTTP parser in the API's JSON error shape.

A request that aiohttp's parser rejects (oversized headers or URL, a bad
Content-Length or chunk size, garbage) never reaches the application or its
middleware: ``RequestHandler.handle_error`` answers it directly, in plain
text, and logs a traceback. Here it answers with ``{"error", "message"}`` and
logs client mistakes at debug level only.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler

logger = logging.getLogger(__name__)

_QUOTED = re.compile(r"b?'[^']*'|b?\"[^\"]*\"")  # a quoted part of the request
_KINDS = {413: "too_large", 431: "too_large", 404: "not_found", 405: "method_not_allowed"}


class _JsonErrorHandler(RequestHandler):
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
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser errors in JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp offers no hook for the handler class; swapping the class of
        # the server it built (same state, one method overridden) is the
        # smallest change that keeps everything else aiohttp's own.
        server.__class__ = _JsonErrorServer
        return server
