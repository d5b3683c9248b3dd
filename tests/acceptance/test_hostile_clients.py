"""Clients that are slow, oversized or malformed on purpose ("Bad input, everywhere").

One daemon for the module with a short client timeout (2 s), so slow clients
are cut off quickly, and small payload and handler limits, so the limits are
cheap to reach. Every test ends with the daemon still serving, and the
daemon's log never holds a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.api import Api, Handlers, Reply, assert_error
from harness.daemons import (
    DaemonFactory,
    Deployment,
    add_tenant,
    deploy,
    only_journal,
    run_cli,
)
from tests.acceptance.storecheck import duplicates, payloads, wait_all_stored

CLIENT = "hostile"
CLIENT_TIMEOUT = 2.0
PAYLOAD_LIMIT = 1000
HANDLER_LIMIT = 10_000
CLOSED_WITHIN = 60.0  # generous: the daemon closes slow clients after CLIENT_TIMEOUT
PROMPTLY = 20.0  # generous bound for a normal request while slow clients hang on


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(
        module_daemons,
        module_dsn,
        tmp_path_factory.mktemp("hostile"),
        [CLIENT],
        "--client-timeout",
        str(CLIENT_TIMEOUT),
        "--payload-limit",
        str(PAYLOAD_LIMIT),
        "--handler-limit",
        str(HANDLER_LIMIT),
    )
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
async def fresh() -> AsyncIterator[aiohttp.ClientSession]:
    """A session that never reuses a connection: the daemon closes idle ones after 2 s,
    and a request sent on a connection as it closes would fail for that reason alone."""
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
        yield s


@pytest.fixture
def api(deployment: Deployment, fresh: aiohttp.ClientSession) -> Api:
    return deployment.api(fresh, CLIENT)


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _parse_reply(raw: bytes) -> Reply | None:
    """The HTTP reply in ``raw``, None when the daemon closed without one."""
    if not raw:
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if ": " in line)}
    return Reply(status, headers.get("content-type", "").split(";")[0].strip(), body)


async def _exchange(url: str, request: bytes) -> Reply | None:
    """Send ``request`` as it is and read to the end; None if the daemon closed (or
    reset) the connection without a reply, which is how it must refuse a request
    it cannot answer in HTTP."""
    reader, writer = await asyncio.open_connection(*_address(url))
    try:
        try:
            writer.write(request)
            await writer.drain()
        except ConnectionError:
            pass  # the daemon stopped reading an oversized request: its reply may be there
        try:
            raw = await asyncio.wait_for(reader.read(), PROMPTLY)
        except ConnectionResetError:
            return None
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return _parse_reply(raw)


def _request(start: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = [start, "Host: test", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _still_serving(api: Api) -> None:
    reply = await asyncio.wait_for(api.add_raw("alive", "still here"), PROMPTLY)
    assert reply.status == 200, reply


# --- slow clients (slowloris) ---------------------------------------------------------


@dataclass
class SlowClient:
    """One connection that sends ``data`` a byte at a time, every ``every`` seconds."""

    data: bytes
    head: bytes = b""  # sent at once, before the trickle
    every: float = 0.5
    closed_after: float | None = None  # seconds from connecting until the daemon closed it
    received: bytes = b""

    async def run(self, url: str, opened: asyncio.Event, go: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection(*_address(url))
        began = time.monotonic()
        opened.set()
        await go.wait()
        writer.write(self.head)
        trickle = asyncio.create_task(self.trickle(writer))
        try:
            async with asyncio.timeout(CLOSED_WITHIN):
                await self.receive(reader)
            self.closed_after = time.monotonic() - began
        except TimeoutError:
            pass  # never closed: closed_after stays None
        finally:
            trickle.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trickle
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def receive(self, reader: asyncio.StreamReader) -> None:
        """Read until the daemon closes, keeping what came before a reset: the
        daemon resets a connection that goes on sending after it was closed."""
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                self.received += chunk

    async def trickle(self, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            for byte in self.data:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(self.every)  # the pace of the attack, not a wait for state


def _slow_head(token: str) -> bytes:
    # a header line that would take far longer than any timeout to finish
    return (
        f"POST /{CLIENT}/job/slow/add HTTP/1.1\r\nHost: test\r\n"
        f"Authorization: Bearer {token}\r\nX-Slow: "
    ).encode() + b"a" * 4000


def _slow_body(token: str) -> tuple[bytes, bytes]:
    head = (
        f"POST /{CLIENT}/job/slowbody/add HTTP/1.1\r\nHost: test\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: text/plain\r\n"
        "Content-Length: 4000\r\n\r\n"
    ).encode()
    return head, b"b" * 4000


async def test_slow_and_idle_clients_are_cut_off_and_others_are_served(
    deployment: Deployment, api: Api
) -> None:
    token = deployment.tokens[CLIENT]
    head, body = _slow_body(token)
    clients = (
        [SlowClient(_slow_head(token)) for _ in range(150)]
        + [SlowClient(b"") for _ in range(50)]  # connect and say nothing
        + [SlowClient(body, head=head) for _ in range(10)]  # whole headers, body trickles
    )
    go = asyncio.Event()
    tasks = []
    for client in clients:
        opened = asyncio.Event()
        tasks.append(asyncio.create_task(client.run(deployment.url, opened, go)))
        await opened.wait()
    go.set()
    try:
        # the slow clients hold their connections; a normal client is served all the same
        began = time.monotonic()
        [job_id] = await api.add("normal", ["served"])
        added_after = time.monotonic() - began
        assert added_after < PROMPTLY, added_after
        await asyncio.wait_for(asyncio.gather(*tasks), CLOSED_WITHIN + 10)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    never_closed = [n for n, c in enumerate(clients) if c.closed_after is None]
    assert never_closed == [], f"{len(never_closed)} slow connections were never closed"
    early = [c.closed_after for c in clients if c.closed_after is not None and c.closed_after < 1]
    assert early == [], f"connections closed well before the client timeout: {early}"
    assert all(c.received == b"" for c in clients[:200]), "a reply to an incomplete request"
    for client in clients[200:]:
        reply = _parse_reply(client.received)
        assert reply is not None, "a slow body was cut off without a reply"
        assert_error(reply, 408, "timeout")
    assert (await api.wait_job(job_id))["payload"] == "served"
    assert await api.type_stats("slow") is None, "a slow request added jobs"
    await _still_serving(api)


async def test_a_slow_body_gets_408_and_adds_nothing(deployment: Deployment, api: Api) -> None:
    head, body = _slow_body(deployment.tokens[CLIENT])
    client = SlowClient(body, every=0.2)
    reader, writer = await asyncio.open_connection(*_address(deployment.url))
    try:
        writer.write(head)
        await writer.drain()
        trickle = asyncio.create_task(client.trickle(writer))
        await asyncio.wait_for(client.receive(reader), CLOSED_WITHIN)
        trickle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await trickle
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    reply = _parse_reply(client.received)
    assert reply is not None, "closed without a reply"
    assert_error(reply, 408, "timeout")
    await api.wait_caught_up()
    assert await api.type_stats("slowbody") is None


async def test_a_slow_but_steady_body_is_accepted(deployment: Deployment, api: Api) -> None:
    """A body that takes longer than the client timeout but keeps coming is not cut off."""
    token = deployment.tokens[CLIENT]
    piece = b"steady\n" * 4096  # 28 KiB: each piece buys 1.75 s more
    pieces = 4
    head = (
        f"POST /{CLIENT}/job/steady/add HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(piece) * pieces}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(*_address(deployment.url))
    try:
        writer.write(head)
        # a piece every second: the body takes over 3 s in all, above the 2 s timeout,
        # and each piece comes seconds before the time the earlier ones bought runs out
        for n in range(pieces):
            if n:
                await asyncio.sleep(1.0)  # the pace of the upload, not a wait for state
            writer.write(piece)
            await writer.drain()
        raw = await asyncio.wait_for(reader.read(), PROMPTLY)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    reply = _parse_reply(raw)
    assert reply is not None and reply.status == 200, reply
    assert len(reply.json["ids"]) == 4096 * pieces


def test_the_open_files_soft_limit_is_raised_to_the_hard_limit(
    pg_dsn: str, daemons: DaemonFactory, data_dir: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 256)
    if hard == resource.RLIM_INFINITY or hard <= lowered:
        pytest.skip(f"no finite hard limit of open files above {lowered}: {hard}")
    # the daemon inherits a low soft limit, as from a login shell's default
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        daemon = daemons.spawn(data_dir, pg_dsn)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    daemon.wait_ready()
    limits = Path(f"/proc/{daemon.pid}/limits").read_text()
    [line] = [line for line in limits.splitlines() if line.startswith("Max open files")]
    assert line.split()[3:5] == [str(hard)] * 2, line


# --- oversized requests -----------------------------------------------------------------


def _oversized(token: str) -> dict[str, bytes]:
    auth = {"Authorization": f"Bearer {token}"}
    return {
        "one header of 100 KB": _request(
            f"GET /{CLIENT}/stats HTTP/1.1", {**auth, "X-Big": "h" * 100_000}
        ),
        "200 headers": _request(
            f"GET /{CLIENT}/stats HTTP/1.1", {**auth, **{f"X-H{n}": "v" for n in range(200)}}
        ),
        "path of 100 KB": _request(f"POST /{CLIENT}/job/{'p' * 100_000}/add HTTP/1.1", auth),
        "query of 100 KB": _request(f"GET /{CLIENT}/jobs?type={'q' * 100_000} HTTP/1.1", auth),
        "job id of 100 KB": _request(f"GET /{CLIENT}/job/{'i' * 100_000} HTTP/1.1", auth),
    }


@pytest.mark.parametrize(
    "case",
    [
        "one header of 100 KB",
        "200 headers",
        "path of 100 KB",
        "query of 100 KB",
        "job id of 100 KB",
    ],
)
async def test_an_oversized_request_gets_a_4xx_json_error_or_a_clean_close(
    deployment: Deployment, api: Api, case: str
) -> None:
    reply = await _exchange(deployment.url, _oversized(deployment.tokens[CLIENT])[case])
    if reply is not None:
        assert 400 <= reply.status < 500, reply
        body = assert_error(reply, reply.status)
        assert "ppppp" not in body["message"] and "hhhhh" not in body["message"], body
    await _still_serving(api)


# --- invalid UTF-8, NUL and control characters in the URL -----------------------------


RAW_URLS = {
    "raw 0xff in the type": b"POST /hostile/job/\xff/add HTTP/1.1",
    "raw 0xff in the query": b"POST /hostile/job/t/add?delay=\xff HTTP/1.1",
    "raw 0xff in the client": b"GET /\xff/stats HTTP/1.1",
    "raw NUL in the path": b"GET /hostile/job/a\x00b HTTP/1.1",
}


@pytest.mark.parametrize("case", RAW_URLS)
async def test_raw_bytes_in_the_request_line_get_400_json(
    deployment: Deployment, api: Api, case: str
) -> None:
    token = deployment.tokens[CLIENT]
    request = (
        RAW_URLS[case]
        + (
            f"\r\nHost: test\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: text/plain\r\nContent-Length: 1\r\n\r\nx"
        ).encode()
    )
    reply = await _exchange(deployment.url, request)
    assert reply is not None, "closed without a reply"
    assert 400 <= reply.status < 500, reply
    assert_error(reply, reply.status)
    await _still_serving(api)


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (b"Authorization: Bearer \xff\xfe", 401),
        (b"Authorization: Bearer a\x00b", 400),
        (b"Authorization: \xffBearer x", 401),
        (b"Content-Type: text/\xff", 401),
        (b"X-Other: \xff\xfe\xfd", 401),
    ],
    ids=["token", "NUL in token", "scheme", "content type", "other header"],
)
async def test_invalid_utf8_in_a_header_gets_4xx_json(
    deployment: Deployment, api: Api, header: bytes, status: int
) -> None:
    request = (
        b"POST /hostile/job/t/add HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        + header
        + b"\r\nContent-Length: 1\r\n\r\nx"
    )
    reply = await _exchange(deployment.url, request)
    assert reply is not None, "closed without a reply"
    assert_error(reply, status)
    await _still_serving(api)


@pytest.mark.parametrize(
    ("method", "path", "status", "kind"),
    [
        ("POST", "/hostile/job/%FF/add", 400, "bad_name"),
        ("POST", "/hostile/job/a%00b/add", 400, "bad_name"),
        ("POST", "/hostile/job/%C3%28/add", 400, "bad_name"),
        ("GET", "/%FF/stats", 400, "bad_name"),
        ("GET", "/hostile%00/stats", 400, "bad_name"),
        ("POST", "/hostile/job/t/add?delay=%FF", 400, "bad_request"),
        ("POST", "/hostile/job/t/add?dt=%FF%FE", 400, "bad_request"),
        ("POST", "/hostile/job/t/add?dt=%00", 400, "bad_request"),
        ("GET", "/hostile/jobs?type=%FF", 400, "bad_name"),
        ("GET", "/hostile/jobs?state=%FF", 400, "bad_request"),
        ("GET", "/hostile/jobs?after=%FF%00", 400, "bad_request"),
        ("GET", "/hostile/jobs?limit=%FF", 400, "bad_request"),
        ("GET", "/hostile/job/%FF%00", 404, "not_found"),
        ("GET", "/hostile/job/a%00", 404, "not_found"),
        ("GET", "/hostile/job/%ED%A0%80", 404, "not_found"),
        ("POST", "/hostile/job/%FF/cancel", 404, "not_found"),
        ("POST", "/hostile/job/%00/cancel", 404, "not_found"),
        ("POST", "/hostile/job/%ED%A0%80/add", 400, "bad_name"),
        ("GET", "/hostile/jobs?after=%ED%A0%80", 400, "bad_request"),
        ("GET", "/hostile/jobs?type=%ED%A0%80", 400, "bad_name"),
        ("POST", "/hostile/handler/add/%00", 400, "bad_name"),
        ("GET", "/hostile/handler/get/%FF", 400, "bad_name"),
        ("POST", "/hostile/handler/add/t?lang=%FF", 400, "bad_handler"),
    ],
)
async def test_percent_encoded_invalid_utf8_and_nul_in_the_url_are_rejected(
    deployment: Deployment, method: str, path: str, status: int, kind: str
) -> None:
    token = deployment.tokens[CLIENT]
    request = (
        f"{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: text/plain\r\n"
        "Content-Length: 5\r\n\r\necho!"
    ).encode()
    reply = await _exchange(deployment.url, request)
    assert reply is not None, "closed without a reply"
    assert_error(reply, status, kind)


# --- payloads that look like the journal's framing --------------------------------------


FRAMING_LOOKALIKES = [
    "a|b",
    "|",
    "||||",
    "|leading and trailing|",
    "#:",
    "#:EndBatch",
    "#:Batch seq=1,date=2026-01-01T00:00:00.000Z,lines=1,bytes=10,crc=00000000",
    "#:Batch seq=99999,date=2026-11-22T02:13:48.000Z,lines=2,bytes=64,crc=deadbeef",
    "660d25b91ec77-1|1700000000000|1700000000000|hostile-other|a forged journal line",
    "tab\tand \r carriage return and \x01\x1f controls",
    "unicode é 漢字 🎉 \u2028 line separator \u0085 next line",
    '{"json": "looking", "bar": "|", "hash": "#:Batch"}',
    " leading and trailing spaces ",
]


async def test_framing_lookalikes_round_trip_and_survive_kill_9(
    pg_dsn: str, daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant(CLIENT, store=pg_dsn, data_dir=data_dir, cwd=data_dir.parent)
    daemon = daemons.start(data_dir, pg_dsn)
    api = Api(session, daemon.url, CLIENT, token)
    posted: dict[str, str] = {}
    # as text lines, one request
    posted.update(zip(await api.add("look", FRAMING_LOOKALIKES), FRAMING_LOOKALIKES, strict=True))
    # as JSON strings and inside objects, including an escaped NUL (kept as the escape)
    elements: list[Any] = [
        *FRAMING_LOOKALIKES,
        {"nul": "a\u0000b", "frame": "#:Batch seq=2"},
        "\u0000",
    ]
    reply = await api.add_raw("look", json.dumps(elements), content_type="application/json")
    assert reply.status == 200, reply
    compact = [json.dumps(e, separators=(",", ":"), ensure_ascii=False) for e in elements]
    posted.update(zip(reply.json["ids"], compact, strict=True))
    for job_id, payload in posted.items():
        job = await api.wait_job(job_id)
        assert job["payload"] == payload, (job_id, job["payload"], payload)
    # and some that only the journal holds when the daemon dies (if ingestion is slower)
    late = [f"late {n} #:Batch seq={n},lines=1|x|" for n in range(50)]
    posted.update(zip(await api.add("look", late), late, strict=True))
    daemon.kill()

    check = run_cli("journal", "check", str(only_journal(data_dir)), cwd=data_dir.parent)
    assert check.returncode == 0, f"{check.stdout}\n{check.stderr}"

    daemon = daemons.start(data_dir, pg_dsn)
    await wait_all_stored(pg_dsn, posted, 30)
    assert await duplicates(pg_dsn) == []
    assert await payloads(pg_dsn, posted) == posted
    api = api.at(daemon.url)
    await api.wait_caught_up()
    jobs = await api.all_jobs(type="look")
    assert sorted(job["id"] for job in jobs) == sorted(posted), "a job lost or ingested twice"
    for job in jobs:
        assert job["payload"] == posted[job["id"]]
    check = run_cli("journal", "check", str(only_journal(data_dir)), cwd=data_dir.parent)
    assert check.returncode == 0, f"{check.stdout}\n{check.stderr}"


@pytest.mark.parametrize(
    "body",
    [b'["raw NUL \x00 in a string"]', b'["a", "\\ud800"]', b'["\\udc00"]'],
    ids=["raw NUL", "lone high surrogate", "lone low surrogate"],
)
async def test_json_payloads_that_cannot_be_stored_are_400(api: Api, body: bytes) -> None:
    reply = await api.add_raw("t", body, content_type="application/json")
    assert_error(reply, 400, "bad_payload")


# --- handler bodies ---------------------------------------------------------------------


async def _add_handler_text(api: Api, body: bytes, lang: str = "python") -> Reply:
    return await api.request(
        "POST",
        f"/{CLIENT}/handler/add/h",
        data=body,
        params={"lang": lang},
        headers={"Content-Type": "text/plain"},
    )


async def _add_handler_json(api: Api, body: bytes) -> Reply:
    return await api.request(
        "POST",
        f"/{CLIENT}/handler/add/h",
        data=body,
        headers={"Content-Type": "application/json"},
    )


async def test_handler_source_over_the_handler_limit_is_413(api: Api) -> None:
    source = b"def handler(p, ctx):\n    return 1\n" + b"#" * HANDLER_LIMIT + b"\n"
    assert_error(await _add_handler_text(api, source), 413, "too_large")
    assert_error(await _add_handler_text(api, b"echo " + b"x" * 1_000_000, "shell"), 413)
    for field in ("body", "before", "beforeEach", "afterEach"):
        fields = {"lang": "python", "body": "def handler(p, ctx):\n    return 1\n"}
        fields[field] = fields.get(field, "") + "\n#" + "x" * HANDLER_LIMIT
        reply = await _add_handler_json(api, json.dumps(fields).encode())
        assert_error(reply, 413, "too_large")
    at_limit = b"def handler(p, ctx):\n    return 1\n#"
    at_limit += b"x" * (HANDLER_LIMIT - len(at_limit))
    assert (await _add_handler_text(api, at_limit)).status == 200


@pytest.mark.parametrize(
    "source",
    [b"def handler(p, ctx):\n    return '\xff'\n", b"echo \xc3", b"\xfe\xff"],
    ids=["invalid byte", "truncated sequence", "UTF-16 BOM"],
)
async def test_handler_source_not_utf8_is_400_bad_handler(api: Api, source: bytes) -> None:
    for lang in ("python", "node", "shell", "http"):
        assert_error(await _add_handler_text(api, source, lang), 400, "bad_handler")
    as_json = b'{"lang": "python", "body": "' + source.replace(b"\n", b"\\n") + b'"}'
    assert_error(await _add_handler_json(api, as_json), 400, "bad_handler")


WRONG_FIELDS: list[dict[str, Any]] = [
    {"before": 1},
    {"before": ["x"]},
    {"beforeEach": {"a": 1}},
    {"afterEach": True},
    {"afterEach": None},
    {"then": 5},
    {"then": ["a"]},
    {"then": "a|b"},
    {"then": "x" * 101},
    {"eid": 1.5},
    {"timeout": "30"},
    {"timeout": None},
    {"timeout": [30]},
    {"timeout": 1e400},
    {"maxAttempts": "3"},
    {"maxAttempts": 3.0},
    {"maxAttempts": None},
    {"maxAttempts": 10**30},
    {"lang": ["python"]},
    {"lang": None},
    {"body": None},
    {"body": ["def handler(p, ctx): pass"]},
    {"body": "def handler(p, ctx): pass\x00"},
]


@pytest.mark.parametrize("wrong", WRONG_FIELDS, ids=lambda w: json.dumps(w)[:40])
async def test_handler_fields_of_the_wrong_type_are_400_bad_handler(
    api: Api, wrong: dict[str, Any]
) -> None:
    fields = {"lang": "python", "body": "def handler(p, ctx):\n    return 1\n", **wrong}
    reply = await Handlers(api).add_raw("h", fields)
    assert_error(reply, 400, "bad_handler")


@pytest.mark.parametrize(
    "body",
    [b"[]", b'"python"', b"null", b"{", b'{"lang": "python", "body": "x"} trailing'],
)
async def test_a_handler_json_body_that_is_not_an_object_is_400(api: Api, body: bytes) -> None:
    assert_error(await _add_handler_json(api, body), 400, "bad_handler")


# --- last: the module's daemon never logged a traceback ---------------------------------


async def test_the_daemon_logged_no_traceback(deployment: Deployment, api: Api) -> None:
    await _still_serving(api)
    log = deployment.daemon.stderr_text()
    assert "Traceback" not in log, log[-4000:]
    assert " ERROR " not in log, log[-4000:]


@pytest.mark.parametrize(
    "after",
    [
        b"X-Bad\x01Name: v",
        b"Content-Length: 1x",
        b"Transfer-Encoding: chunked, identity",
        b"Bad header line without a colon",
        b"X-Ctl: a\x7fb",
        b"\x7f",  # the bad byte ends the Authorization line itself
        b"\x01",
    ],
    ids=[
        "control char in a name",
        "bad length",
        "bad encoding",
        "no colon",
        "DEL in a value",
        "DEL in the token",
        "control char in the token",
    ],
)
async def test_a_parser_error_never_echoes_the_authorization_header(
    deployment: Deployment, api: Api, after: bytes
) -> None:
    secret = deployment.tokens[CLIENT]
    request = (
        b"POST /hostile/job/t/add HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        + f"Authorization: Bearer {secret}".encode()
        + (after if len(after) == 1 else b"\r\n" + after)
        + b"\r\nContent-Length: 1\r\n\r\nx"
    )
    reply = await _exchange(deployment.url, request)
    assert reply is not None, "closed without a reply"
    assert 400 <= reply.status < 500, reply
    assert_error(reply, reply.status)
    assert secret.encode() not in reply.body and b"Bearer" not in reply.body, reply
    await _still_serving(api)
