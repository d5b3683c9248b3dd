"""The client's HTTP/1.1: keep-alive connections of its own, responses parsed by
httptools (llhttp, the parser of Node.js).

A request is written in one ``write()`` as it is built, and its response is
read by a protocol that parses each chunk as it comes: on an idle client the
first byte reaches the server about 0.25 ms sooner after the call than through
an aiohttp session (docs/client.md). It does what the client needs and no
more: http and https, a JSON or bytes body, ``Content-Length`` or chunked
responses (not a body that ends with the connection), no redirects, no
proxies, no cookies. At most ``LIMIT`` requests are in flight at once
(aiohttp's default); the rest wait their turn.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Mapping
from typing import cast
from urllib.parse import quote, urlencode, urlsplit

import httptools

LIMIT = 100  # requests in flight at once (and connections open)
IDLE_KEPT = 32  # idle keep-alive connections kept
IDLE_S = 20.0  # an idle connection is not used after this long (the daemon closes them at 30 s)
CONNECT_S = 10.0  # seconds a connection (and its TLS handshake) may take
SAFE_PATH = "/:@!$&'()*+,;=-._~%"  # characters a path keeps as they are
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a method or a header name (RFC 9110)
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # not in a header value
FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection"})  # the client's
IDEMPOTENT = frozenset({"GET", "PUT", "DELETE", "OPTIONS"})


class TransportError(Exception):
    """The request failed on the way: no connection, a timeout, a connection lost
    before the whole response, or a response that is not HTTP."""


class NotSent(TransportError):
    """The connection was closed before any byte of the request was written."""


class Response:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers  # names in lower case
        self.body = body


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its response parsed as
    it arrives."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        # (uvloop's transports are not asyncio.Transport subclasses)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self.reusable = False  # after a whole response that lets it be kept
        self.lost = False
        self.answered = False  # a byte of a reply came for the request in flight
        self.idle_since = 0.0

    # asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # nothing asked: not a reply to anything of ours
            self.close()
            return
        self.answered = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(TransportError(f"the response is not HTTP/1.1 as asked: {exc!r}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        self._fail(TransportError(f"the connection was lost: {exc or 'closed by the server'}"))

    # httptools
    def on_message_begin(self) -> None:
        self.reusable = False  # until this one is whole
        self._headers, self._body = {}, []

    def on_header(self, name: bytes, value: bytes) -> None:
        # (httptools joins a name or a value that came in two chunks)
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        earlier = self._headers.get(key)
        self._headers[key] = text if earlier is None else f"{earlier}, {text}"

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            return  # an interim reply (100 Continue, 103 Early Hints): the final one follows
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():  # a reply to nothing of ours
            self.close()
            return
        # kept only once the whole request went out, too (a server may answer early)
        assert self._transport is not None
        self.reusable = (
            self._parser.should_keep_alive()
            and not self.lost
            and self._transport.get_write_buffer_size() == 0
        )
        waiter.set_result(Response(status, self._headers, b"".join(self._body)))

    # ours
    def send(self, request: bytes) -> asyncio.Future[Response]:
        assert self._transport is not None
        self.reusable = self.answered = False
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        if self.closing:
            self._fail(NotSent("the connection was closed before the request"))
        else:
            self._transport.write(request)
        return waiter

    @property
    def closing(self) -> bool:
        return self.lost or self._transport is None or self._transport.is_closing()

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.reusable = False
        if self._transport is not None:
            self._transport.close()


class Transport:
    """Requests to one server (``base``: ``http://host:port/prefix``)."""

    def __init__(self, base: str, read_timeout: float) -> None:
        try:
            parts = urlsplit(base)
            port = parts.port
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http or https URL: {base!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError("credentials in the URL are not sent: give the token instead")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port if port is not None else (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        try:
            host = self._host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"not a host name: {self._host!r}") from None
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        self._host_header = f"Host: {host}{'' if port is None else f':{port}'}\r\n"
        self._read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._slots = asyncio.Semaphore(LIMIT)
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Response:
        """``method`` on ``path`` (below the base URL's own path); TransportError
        when no whole response came back, ValueError for a request that cannot
        be sent as it is (a header with a line break, say). A request that a
        kept connection could not take (closed before it was written), or an
        idempotent one that it lost before any byte of its reply (the server
        closed it meanwhile), is sent once more on a new connection."""
        head = self._head(method, path, headers, params, len(body) if body is not None else None)
        request = head if body is None else head + body
        async with self._slots:
            fresh = False
            while True:
                connection, kept = await self._connection(fresh=fresh)
                try:
                    async with asyncio.timeout(self._read_timeout):
                        response = await connection.send(request)
                    if body and response.status >= 400:
                        # perhaps answered before the whole body went out (its tail
                        # may still wait below TLS, where no buffer size shows it)
                        connection.close()
                    return response
                except TimeoutError:
                    connection.close()
                    raise TransportError(f"no response within {self._read_timeout:g} s") from None
                except TransportError as exc:
                    connection.close()
                    again = isinstance(exc, NotSent) or (
                        method in IDEMPOTENT and not connection.answered
                    )
                    if fresh or not kept or not again:
                        raise
                    fresh = True
                except BaseException:
                    connection.close()
                    raise
                finally:
                    self._put_back(connection)

    def _head(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None,
        length: int | None,
    ) -> bytes:
        if not TOKEN.fullmatch(method) or method.upper() in ("HEAD", "CONNECT"):
            raise ValueError(f"not a method this client sends: {method!r}")
        target = quote(self._prefix + path, safe=SAFE_PATH)
        if params:
            target += "?" + urlencode(params)
        lines = [f"{method} {target} HTTP/1.1\r\n", self._host_header]
        for name, value in headers.items():
            if not TOKEN.fullmatch(name) or name.lower() in FRAMING:
                raise ValueError(f"not a header this client sends: {name!r}")
            if CONTROL.search(value):
                raise ValueError(f"header {name!r} holds a line break or a control character")
            lines.append(f"{name}: {value}\r\n")
        if length is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {length or 0}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode()

    async def _connection(self, *, fresh: bool = False) -> tuple[_Connection, bool]:
        """A connection, and whether it was kept from an earlier request;
        ``fresh``: a new one."""
        while self._idle and not fresh:
            connection = self._idle.pop()
            if connection.reusable and not connection.closing:
                if time.monotonic() - connection.idle_since < IDLE_S:
                    return connection, True
                self._forget(connection)
                self._forget_older(connection.idle_since)
                continue
            self._forget(connection)
        if self._closed:
            raise TransportError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(CONNECT_S):
                _, connection = await loop.create_connection(
                    _Connection, self._host, self._port, ssl=self._ssl
                )
        except TimeoutError:
            raise TransportError(f"no connection within {CONNECT_S:g} s") from None
        except OSError as exc:
            raise TransportError(f"cannot connect: {exc}") from None
        self._open.add(connection)
        return connection, False

    def _put_back(self, connection: _Connection) -> None:
        if connection.reusable and not self._closed and len(self._idle) < IDLE_KEPT:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            self._forget(connection)

    def _forget_older(self, than: float) -> None:
        """Close the idle connections idle since before ``than`` (the oldest come first)."""
        while self._idle and self._idle[0].idle_since <= than:
            self._forget(self._idle.pop(0))

    def _forget(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)

    def close(self) -> None:
        """Close every connection (those in use fail their request)."""
        self._closed = True
        self._idle.clear()
        for connection in list(self._open):
            self._forget(connection)
