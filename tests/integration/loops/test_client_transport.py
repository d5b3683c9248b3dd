"""The client's own HTTP/1.1 (client.transport) against a raw server on a real
socket that answers what each test scripts, well-formed or not: keep-alive
reuse, chunked bodies, interim replies, connections the server closed, broken
or missing responses, the in-flight limit, header injection, and the Client on
top; each on asyncio's loop and on uvloop (this directory's conftest)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from queue_daemon.client import Client, Unavailable
from queue_daemon.client import transport as transport_module
from queue_daemon.client.transport import Transport, TransportError

Answer = Callable[[bytes], bytes | None]  # a request's bytes -> the reply (None: none)


def reply(body: bytes, status: str = "200 OK", *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class RawServer:
    """Reads whole requests (headers and a Content-Length body) and writes what
    ``answer`` returns for each; counts connections and requests."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.open_now = 0
        self.most_open = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.none_open = asyncio.Event()  # set while no connection is open
        self.nth = 0  # the request being answered is the nth of its connection (from 1)

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.none_open.clear()
        self.most_open = max(self.most_open, self.open_now)
        self.writers.append(writer)
        nth = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                nth += 1
                self.nth = nth
                answer = self.answer(request)
                if answer is None:
                    writer.close()
                    return
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_now -= 1
            if not self.open_now:
                self.none_open.set()
            writer.close()

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


Serve = Callable[[Answer], Awaitable[tuple["RawServer", str]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[RawServer] = []

    async def start(answer: Answer) -> tuple[RawServer, str]:
        server = RawServer(answer)
        servers.append(server)
        return server, await server.start()

    try:
        yield start
    finally:
        for server in servers:
            await server.close()


async def test_requests_share_one_kept_alive_connection(serve: Serve) -> None:
    server, url = await serve(lambda request: reply(b'{"ok": 1}'))
    transport = Transport(url + "/prefix", read_timeout=5)
    try:
        for n in range(3):
            response = await transport.request(
                "POST", f"/t/job/a b/{n}", headers={"X-N": str(n)}, body=b"line\n"
            )
            assert (response.status, response.body) == (200, b'{"ok": 1}')
            assert response.headers["content-type"] == "application/json"
    finally:
        transport.close()
    assert server.connections == 1
    first = server.requests[0].decode()
    assert first.startswith("POST /prefix/t/job/a%20b/0 HTTP/1.1\r\n")
    assert "\r\nContent-Length: 5\r\n" in first and "\r\nX-N: 0\r\n" in first
    assert first.endswith("\r\n\r\nline\n")


async def test_a_chunked_body_is_read_whole(serve: Serve) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4\r\n{"a"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n'
    )
    _, url = await serve(lambda request: chunked)
    transport = Transport(url, read_timeout=5)
    try:
        response = await transport.request("GET", "/x", headers={}, params={"wait": "1"})
        again = await transport.request("GET", "/x", headers={})
    finally:
        transport.close()
    assert response.body == again.body == b'{"a": 1}'


@pytest.mark.parametrize("why", ["Connection: close", "idle past its time"])
async def test_a_connection_is_not_used_again(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    if why == "idle past its time":
        monkeypatch.setattr(transport_module, "IDLE_S", 0.0)
    headers = (why,) if why.startswith("Connection") else ()
    server, url = await serve(lambda request: reply(b"{}", "200 OK", *headers))
    transport = Transport(url, read_timeout=5)
    try:
        for _ in range(3):
            assert (await transport.request("GET", "/x", headers={})).status == 200
    finally:
        transport.close()
    assert server.connections == 3


async def test_a_request_is_sent_once_more_and_only_on_a_new_connection(serve: Serve) -> None:
    def answer(request: bytes) -> bytes | None:
        # every connection is closed unanswered at its second request
        return reply(b"{}") if server.nth == 1 else None

    server, url = await serve(answer)
    transport = Transport(url, read_timeout=5)
    try:
        # three connections kept idle, each of which the server will close
        await asyncio.gather(*(transport.request("GET", "/keep", headers={}) for _ in range(3)))
        assert len(transport._idle) == 3
        assert (await transport.request("GET", "/once", headers={})).status == 200
        with pytest.raises(TransportError, match="lost"):
            await transport.request("POST", "/add", headers={}, body=b"a\n")
    finally:
        transport.close()
    paths = [r.split(b" ")[1] for r in server.requests]
    assert paths.count(b"/once") == 2  # a kept connection, then a new one
    assert paths.count(b"/add") == 1


async def test_a_request_with_a_body_that_failed_does_not_keep_its_connection(
    serve: Serve,
) -> None:
    answers = iter([reply(b'{"error": "too_large"}', "413 Too Large"), reply(b"{}")])
    server, url = await serve(lambda request: next(answers))
    transport = Transport(url, read_timeout=5)
    try:
        assert (await transport.request("PUT", "/blob", headers={}, body=b"x")).status == 413
        assert (await transport.request("GET", "/x", headers={})).status == 200
    finally:
        transport.close()
    assert server.connections == 2  # (over TLS an unsent tail of the body would not show)


async def test_an_idle_connection_closed_by_the_server_is_replaced(serve: Serve) -> None:
    server, url = await serve(lambda request: reply(b"{}"))
    transport = Transport(url, read_timeout=5)
    try:
        await transport.request("GET", "/x", headers={})
        for writer in server.writers:  # the server's keep-alive timeout passes
            writer.close()
        async with asyncio.timeout(5):
            await server.none_open.wait()
            while not transport._idle[0].lost:  # noqa: ASYNC110 (the client's side reads the end)
                await asyncio.sleep(0.01)
        assert (await transport.request("GET", "/x", headers={})).status == 200
    finally:
        transport.close()
    assert server.connections == 2


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda request: None, "connection was lost"),
        (lambda request: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "no response within"),
        (lambda request: b"SMTP ready\r\n\r\n", "not HTTP"),
    ],
)
async def test_a_missing_or_broken_response_is_a_transport_error(
    serve: Serve, answer: Answer, message: str
) -> None:
    _, url = await serve(answer)
    transport = Transport(url, read_timeout=0.5)
    try:
        with pytest.raises(TransportError, match=message):
            await transport.request("POST", "/x", headers={}, body=b"{}")
        assert not transport._idle  # the broken connection is not kept
    finally:
        transport.close()


async def test_nothing_listening_is_a_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    transport = Transport(f"http://127.0.0.1:{port}", read_timeout=1)
    with pytest.raises(TransportError, match="cannot connect"):
        await transport.request("GET", "/x", headers={})


async def test_requests_beyond_the_limit_wait_their_turn(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport_module, "LIMIT", 2)
    server, url = await serve(lambda request: reply(b"{}"))
    transport = Transport(url, read_timeout=5)
    try:
        replies = await asyncio.gather(
            *(transport.request("GET", f"/{n}", headers={}) for n in range(10))
        )
    finally:
        transport.close()
    assert [r.status for r in replies] == [200] * 10
    assert server.most_open <= 2


async def test_close_ends_the_connections(serve: Serve) -> None:
    server, url = await serve(lambda request: reply(b"{}"))
    transport = Transport(url, read_timeout=5)
    await transport.request("GET", "/x", headers={})
    transport.close()
    async with asyncio.timeout(5):
        await server.none_open.wait()
    with pytest.raises(TransportError, match="closed"):
        await transport.request("GET", "/x", headers={})


async def test_a_connection_that_gets_bytes_nobody_asked_for_is_dropped(serve: Serve) -> None:
    server, url = await serve(lambda request: reply(b'{"ok": 1}'))
    transport = Transport(url, read_timeout=5)
    try:
        await transport.request("GET", "/x", headers={})
        (idle,) = transport._idle
        # the start of a reply on the idle connection: a later reply would end up in its body
        server.writers[0].write(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{")
        async with asyncio.timeout(5):
            while not idle.lost:  # noqa: ASYNC110 (the client's side reads it)
                await asyncio.sleep(0.01)
        response = await transport.request("GET", "/x", headers={})
    finally:
        transport.close()
    assert response.body == b'{"ok": 1}'
    assert server.connections == 2


async def test_interim_replies_are_passed_over(serve: Serve) -> None:
    final = reply(b'{"id": "A"}')
    _, url = await serve(lambda request: b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + final)
    transport = Transport(url, read_timeout=5)
    try:
        first = await transport.request("GET", "/a", headers={})
        second = await transport.request("GET", "/b", headers={})
    finally:
        transport.close()
    assert (first.status, first.body) == (second.status, second.body) == (200, b'{"id": "A"}')


async def test_a_reply_to_nothing_in_the_same_chunk_drops_the_connection(serve: Serve) -> None:
    answers = iter([reply(b"A1") + b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nEV", reply(b"B2")])
    server, url = await serve(lambda request: next(answers))
    transport = Transport(url, read_timeout=5)
    try:
        assert (await transport.request("GET", "/a", headers={})).body == b"A1"
        assert (await transport.request("GET", "/b", headers={})).body == b"B2"
    finally:
        transport.close()
    assert server.connections == 2


async def test_a_reply_before_the_whole_body_went_out_drops_the_connection() -> None:
    done = asyncio.Event()

    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the body is never read
        writer.write(reply(b'{"error": "too_large"}', "413 Too Large"))
        await writer.drain()
        await done.wait()
        writer.close()

    server = await asyncio.start_server(early, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = Transport(f"http://127.0.0.1:{port}", read_timeout=5)
    try:
        response = await transport.request("PUT", "/blob", headers={}, body=b"x" * (16 << 20))
        assert response.status == 413
        assert not transport._idle  # its unsent tail would go before the next request
    finally:
        transport.close()
        done.set()
        server.close()
        await server.wait_closed()


async def test_an_idempotent_request_is_sent_again_when_a_kept_connection_was_closed(
    serve: Serve,
) -> None:
    def answer(request: bytes) -> bytes | None:
        # the second request of a connection finds it closed (a server's idle timeout)
        return reply(b"{}") if request.startswith(b"GET /first") else None

    server, url = await serve(answer)
    transport = Transport(url, read_timeout=5)
    try:
        await transport.request("GET", "/first", headers={})
        with pytest.raises(TransportError, match="lost"):  # not an add's to repeat
            await transport.request("POST", "/add", headers={}, body=b"a\n")
        await transport.request("GET", "/first", headers={})
        with pytest.raises(TransportError, match="lost"):  # lost on a new connection too
            await transport.request("GET", "/again", headers={})
    finally:
        transport.close()
    assert [r.split(b" ")[1] for r in server.requests] == [
        b"/first",
        b"/add",
        b"/first",
        b"/again",
        b"/again",
    ]


async def test_headers_go_as_utf8_and_bad_ones_are_refused(serve: Serve) -> None:
    server, url = await serve(lambda request: reply(b"{}"))
    transport = Transport(url, read_timeout=5)
    try:
        await transport.request("POST", "/x", headers={"Idempotency-Key": "clé ✓"})
        for method, headers in [
            ("GET", {"X": "a\x00b"}),
            ("GET", {"X": "a\rb"}),
            ("GET", {"Bad Name": "x"}),
            ("GET", {"Content-Length": "0"}),
            ("GET", {"Host": "elsewhere"}),
            ("GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\nGET", {}),
            ("HEAD", {}),
            ("head", {}),
        ]:
            with pytest.raises(ValueError):
                await transport.request(method, "/x", headers=headers)
    finally:
        transport.close()
    assert len(server.requests) == 1
    assert "\r\nIdempotency-Key: clé ✓\r\n" in server.requests[0].decode()


def test_an_url_that_is_not_http_is_refused() -> None:
    for url in ("ftp://host/x", "localhost:8080", "http://", "http://host:99999"):
        with pytest.raises(ValueError, match="not an http"):
            Transport(url, read_timeout=1)
    with pytest.raises(ValueError, match="credentials"):
        Transport("http://user:secret@host", read_timeout=1)


def test_the_host_header_names_the_host_as_sent() -> None:
    for url, host in [
        ("http://bücher.example:8080/q", "Host: xn--bcher-kva.example:8080"),
        ("http://[::1]:8080", "Host: [::1]:8080"),
        ("https://queue.internal", "Host: queue.internal"),
    ]:
        assert Transport(url, read_timeout=1)._host_header == host + "\r\n"


async def test_the_client_over_it(serve: Serve) -> None:
    answers = iter(
        [
            reply(b'{"ids": ["j1"]}'),
            reply(
                b'{"error": "rate_limited", "message": "slow"}', "429 Too Many", "Retry-After: 0"
            ),
            reply(b'{"ids": ["j2"]}'),
            None,  # the connection is lost: an add without a key is not sent again
        ]
    )
    server, url = await serve(lambda request: next(answers))
    async with Client(url, "t", "tok", retry_for=5) as q:
        assert await q.add("resize", "a") == ["j1"]
        assert await q.add("resize", "b", priority=3) == ["j2"]  # after the 429
        with pytest.raises(Unavailable):
            await q.add("resize", "c")
        with pytest.raises(ValueError, match="line break"):
            await q.add("resize", "d", idempotency_key="k\r\nX-Injected: 1")
    first = server.requests[0].decode()
    assert first.startswith("POST /t/job/resize/add HTTP/1.1\r\n")
    assert "\r\nAuthorization: Bearer tok\r\n" in first
    assert "\r\nContent-Type: text/plain\r\n" in first
    assert server.requests[2].decode().startswith("POST /t/job/resize/add?priority=3 HTTP/1.1")
    assert len(server.requests) == 4  # the bad key never reached the server
