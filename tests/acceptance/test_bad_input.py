"""Every bad input docs/api.md lists gets its status and the JSON error shape, and adds nothing.

One daemon for the module, started with small limits (payload 1000 bytes, body
100000 bytes) so the limits are cheap to reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import Api, Reply, assert_error
from harness.daemons import DaemonFactory, Deployment, deploy, run_cli

PAYLOAD_LIMIT = 1000
BODY_LIMIT = 100_000


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(
        module_daemons,
        module_dsn,
        tmp_path_factory.mktemp("bad"),
        ["bad"],
        "--payload-limit",
        str(PAYLOAD_LIMIT),
        "--body-limit",
        str(BODY_LIMIT),
    )
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def api(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "bad")


@pytest.mark.parametrize("client", ["Bad", "ba-d", "b" * 41, "b.c", "b%20c"])
async def test_bad_client_name_is_400_bad_name(api: Api, client: str) -> None:
    # the token is valid for "bad": the name is wrong before any question of ownership
    assert_error(await api.as_(client, api.token).add_raw("t", "x"), 400, "bad_name")
    assert_error(await api.as_(client, api.token).stats(), 400, "bad_name")


@pytest.mark.parametrize("jobtype", ["a%7Cb", "a%20b", "a,b", "t" * 101, "%C3%A9"])
async def test_bad_type_is_400_bad_name(api: Api, jobtype: str) -> None:
    assert_error(await api.add_raw(jobtype, "x"), 400, "bad_name")


async def test_longest_names_are_fine(api: Api) -> None:
    assert (await api.add_raw("T" * 100, "x")).status == 200
    assert (await api.add_raw("a.b:c-d_E9", "x")).status == 200


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("empty first line", b"\nabc\n", "text/plain"),
    ("empty middle line", b"a\n\nb\n", "text/plain"),
    ("empty last line", b"a\nb\n\n", "text/plain"),
    ("empty CRLF line", b"a\r\n\r\nb", "text/plain"),
    ("only a newline", b"\n", "text/plain"),
    ("empty body", b"", "text/plain"),
    ("invalid UTF-8", b"ok\n\xff\xfe\n", "text/plain"),
    ("truncated UTF-8", b"ok\n\xc3", "text/plain"),
    ("NUL byte", b"a\x00b\n", "text/plain"),
    ("bad JSON", b'[{"a": 1}', "application/json"),
    ("JSON trailing comma", b"[1,]", "application/json"),
    ("JSON not an array", b'{"a": 1}', "application/json"),
    ("JSON scalar", b"3", "application/json"),
    ("empty JSON array", b"[]", "application/json"),
    ("empty JSON body", b"", "application/json"),
    ("JSON invalid UTF-8", b'["\xff"]', "application/json"),
]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [pytest.param(body, ct, id=name) for name, body, ct in BAD_BODIES],
)
async def test_bad_payload_is_400(api: Api, body: bytes, content_type: str) -> None:
    assert_error(await api.add_raw("t", body, content_type=content_type), 400, "bad_payload")


TOO_LARGE: list[tuple[str, bytes, str]] = [
    ("ascii line", b"ok\n" + b"x" * (PAYLOAD_LIMIT + 1) + b"\nok\n", "text/plain"),
    ("multibyte line", "é".encode() * (PAYLOAD_LIMIT // 2 + 1), "text/plain"),
    ("JSON element", b'["ok", "' + b"x" * (PAYLOAD_LIMIT - 1) + b'"]', "application/json"),
    ("body", (b"y" * 500 + b"\n") * (BODY_LIMIT // 500 + 1), "text/plain"),
]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [pytest.param(body, ct, id=name) for name, body, ct in TOO_LARGE],
)
async def test_over_a_limit_is_413_too_large(api: Api, body: bytes, content_type: str) -> None:
    assert_error(await api.add_raw("t", body, content_type=content_type), 413, "too_large")


async def test_json_body_over_the_body_limit_is_413(api: Api) -> None:
    body = b"[" + b",".join([b'"' + b"z" * 500 + b'"'] * (BODY_LIMIT // 500 + 1)) + b"]"
    assert_error(await api.add_raw("t", body, content_type="application/json"), 413, "too_large")


async def test_payload_at_the_limit_is_accepted(api: Api) -> None:
    line = "x" * PAYLOAD_LIMIT
    multibyte = "é" * (PAYLOAD_LIMIT // 2)
    reply = await api.add_raw("fits", f"{line}\n{multibyte}\n")
    assert reply.status == 200, reply
    for job_id in reply.json["ids"]:
        await api.wait_job(job_id)
    whole_body = ("b" * (PAYLOAD_LIMIT - 1) + "\n") * (BODY_LIMIT // PAYLOAD_LIMIT)
    assert len(whole_body) == BODY_LIMIT
    reply = await api.add_raw("fits", whole_body)
    assert reply.status == 200, f"a body of exactly the body limit: {reply}"


@pytest.mark.parametrize(
    "params",
    [
        {"delay": "-1"},
        {"delay": "abc"},
        {"delay": "nan"},
        {"delay": "inf"},
        {"delay": ""},
        {"delay": "1e400"},
        {"dt": "tomorrow"},
        {"dt": "2024-13-45T00:00:00Z"},
        {"dt": ""},
        {"dt": "99999999999999999999"},
        {"delay": "1", "dt": "2030-01-01T00:00:00Z"},
    ],
    ids=lambda p: "&".join(f"{k}={v}" for k, v in p.items()),
)
async def test_bad_delay_or_dt_is_400(api: Api, params: dict[str, str]) -> None:
    assert_error(await api.add_raw("t", "x\n", params=params), 400)


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "abc"},
        {"limit": "-1"},
        {"state": "bogus"},
        {"type": "a|b"},
        {"after": "not-a-cursor"},
        {"after": "Zm9v"},
    ],
    ids=lambda p: "&".join(f"{k}={v}" for k, v in p.items()),
)
async def test_bad_list_query_is_400(api: Api, params: dict[str, str]) -> None:
    assert_error(await api.jobs(**params), 400)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nosuch"),
        ("GET", "/bad/nosuch"),
        ("POST", "/bad/job/t/remove"),
        ("GET", "/bad/job/t/add/more"),
        ("GET", "/bad/handlerz"),
    ],
)
async def test_unknown_route_is_404_json(api: Api, method: str, path: str) -> None:
    assert_error(await api.request(method, path), 404)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/bad/job/t/add"),
        ("PUT", "/bad/job/t/add"),
        ("DELETE", "/bad/stats"),
        ("POST", "/bad/jobs"),
        ("POST", "/healthz"),
    ],
)
async def test_wrong_method_is_405_json(api: Api, method: str, path: str) -> None:
    assert_error(await api.request(method, path), 405)


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        pytest.param(b"g1\ng2\ng3\n\n", "text/plain", 400, id="empty line"),
        pytest.param(b"g1\n\ng2\ng3", "text/plain", 400, id="empty line inside"),
        pytest.param(b"g1\ng2\ng3\n\xff", "text/plain", 400, id="invalid UTF-8 at the end"),
        pytest.param(b"g1\ng2\n" + b"x" * 1001, "text/plain", 413, id="one payload too large"),
    ],
)
async def test_a_rejected_request_adds_nothing(
    api: Api, body: bytes, content_type: str, status: int
) -> None:
    jobtype = f"aon-{uuid.uuid4().hex[:12]}"  # this test's alone
    assert (await api.add_raw(jobtype, body, content_type=content_type)).status == status
    # a job added after the rejected one, and a journal with nothing left to ingest:
    # whatever the rejected request could have written is in the store by then
    [sentinel] = await api.add(jobtype, ["sentinel"])
    await api.wait_job(sentinel)
    await api.wait_caught_up()
    assert [job["id"] for job in await api.all_jobs(type=jobtype)] == [sentinel]
    stats = await api.type_stats(jobtype)
    assert stats is not None and sum(stats.values()) == 1, stats


def test_no_auth_is_refused_on_a_public_address(deployment: Deployment, tmp_path: Path) -> None:
    done = run_cli(
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--no-auth",
        "--store",
        deployment.dsn,
        "--data-dir",
        str(tmp_path / "data"),
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode != 0, done
    assert "listening on" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{done.stderr}"
    assert "no-auth" in lines[0], lines
    assert "Traceback" not in done.stderr


async def test_no_auth_on_loopback_needs_no_token(
    pg_dsn: str, daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    daemon = daemons.start(data_dir, pg_dsn, "--no-auth", "--host", "127.0.0.1")
    anonymous = Api(session, daemon.url, "anyone", None)
    ids = await anonymous.add("t", ["x", "y"])
    job = await anonymous.wait_job(ids[0])
    assert job["state"] == "waiting"
    assert (await anonymous.stats()).status == 200
    assert (await anonymous.jobs()).status == 200
    assert_error(await anonymous.as_("Any-one", None).add_raw("t", "x"), 400, "bad_name")


async def test_no_auth_is_off_unless_the_environment_turns_it_on(
    pg_dsn: str, daemons: DaemonFactory, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """QUEUE_DAEMON_NO_AUTH=false (or no, off, 0, empty) must keep tokens required."""
    values = ["false", "False", "FALSE", "no", "off", "0", ""]
    started = {
        value: daemons.spawn(tmp_path / f"data{n}", pg_dsn, env={"QUEUE_DAEMON_NO_AUTH": value})
        for n, value in enumerate(values)
    }
    anonymous_is = {}
    for value, daemon in started.items():
        await asyncio.to_thread(daemon.wait_ready)
        anonymous_is[value] = (await Api(session, daemon.url, "anyone", None).stats()).status
    assert anonymous_is == dict.fromkeys(values, 401)


def test_the_daemon_logged_no_traceback(deployment: Deployment) -> None:
    log = deployment.daemon.stderr_text()
    assert "Traceback" not in log, log[-3000:]


# --- requests that aiohttp's HTTP parser rejects, and clients that hang up ------------------
# A daemon of their own: these log at the protocol level and must not blur the
# log checks of the module's main daemon.


@pytest.fixture(scope="module")
def raw_deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(module_daemons, module_dsn, tmp_path_factory.mktemp("raw"), ["raw"])
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


async def _raw_exchange(url: str, request: bytes, *, hang_up: bool = False) -> Reply | None:
    """Send bytes as they are; return the parsed reply (None after ``hang_up``)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        if hang_up:
            return None
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    content_type = headers.get("Content-Type", "").split(";")[0].strip()
    return Reply(status, content_type, body)


def _request(start: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = [start, "Host: test", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


MALFORMED: dict[str, tuple[str, dict[str, str], bytes]] = {
    "header over 8 KiB": ("GET /raw/stats HTTP/1.1", {"X-Big": "a" * 9000}, b""),
    "URL over 8 KiB": (f"GET /raw/job/{'a' * 9000} HTTP/1.1", {}, b""),
    "bad Content-Length": ("POST /raw/job/t/add HTTP/1.1", {"Content-Length": "abc"}, b""),
    "bad chunk size": (
        "POST /raw/job/t/add HTTP/1.1",
        {"Transfer-Encoding": "chunked"},
        b"zz\r\nabc\r\n0\r\n\r\n",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
async def test_a_request_the_http_parser_rejects_gets_the_json_error_shape(
    raw_deployment: Deployment, case: str
) -> None:
    start, headers, body = MALFORMED[case]
    headers = {"Authorization": f"Bearer {raw_deployment.tokens['raw']}", **headers}
    reply = await _raw_exchange(raw_deployment.url, _request(start, headers, body))
    assert reply is not None
    assert_error(reply, 400)


async def test_a_body_cut_short_by_the_client_adds_nothing_and_is_no_error(
    raw_deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    api = raw_deployment.api(session, "raw")
    headers = {
        "Authorization": f"Bearer {raw_deployment.tokens['raw']}",
        "Content-Type": "text/plain",
        "Content-Length": "1000",
    }
    cut = _request("POST /raw/job/cut/add HTTP/1.1", headers, b"c1\nc2\nc3\n")
    await _raw_exchange(raw_deployment.url, cut, hang_up=True)
    [sentinel] = await api.add("cut", ["sentinel"])
    await api.wait_job(sentinel)
    await api.wait_caught_up()
    assert [job["id"] for job in await api.all_jobs(type="cut")] == [sentinel]
    log = raw_deployment.daemon.stderr_text()
    assert "queue_daemon" not in "".join(line for line in log.splitlines() if " ERROR " in line), (
        f"a client hanging up is logged as a daemon error:\n{log[-3000:]}"
    )
