"""HTTP handlers: the payload POSTed to the body URL, status → exitcode, body → result."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp import web

from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult
from queue_daemon.runners.pool import RunnerPool, RunnerSettings
from queue_daemon.runners.sandbox.addresses import parse_networks


@pytest.fixture
async def pool(work_root: Path) -> AsyncIterator[RunnerPool]:
    # the test servers listen on loopback, which http handlers may reach only when allowed
    settings = RunnerSettings(work_root=work_root, result_limit=1000, http_allow=LOOPBACK)
    pool = RunnerPool(settings)
    yield pool
    await pool.close()


@pytest.fixture
async def strict(work_root: Path) -> AsyncIterator[RunnerPool]:
    """A pool with the default address policy: public addresses only."""
    pool = RunnerPool(RunnerSettings(work_root=work_root))
    yield pool
    await pool.close()


async def echo(request: web.Request) -> web.Response:
    body = await request.text()
    meta = f"{request.headers['X-Job-Id']} {request.headers['X-Job-Attempt']} "
    return web.Response(text=meta + request.headers["X-Job-Type"] + " " + body)


async def status(request: web.Request) -> web.Response:
    return web.Response(status=int(request.match_info["code"]), text="status body")


async def slow(request: web.Request) -> web.Response:
    await asyncio.sleep(5)
    return web.Response(text="late")


async def big(request: web.Request) -> web.Response:
    return web.Response(text="b" * 100_000)


LOOPBACK = parse_networks("127.0.0.1/32")


async def redirect(request: web.Request) -> web.Response:
    raise web.HTTPTemporaryRedirect(request.query["to"])


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/redirect", redirect)
    app.router.add_post("/echo", echo)
    app.router.add_post("/status/{code}", status)
    app.router.add_post("/slow", slow)
    app.router.add_post("/big", big)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def run(pool: RunnerPool, url: str, *payloads: str, limit: float = 10) -> list[JobResult]:
    spec = HandlerSpec(
        version="v", client="acme", type="hook", lang="http", body=url, timeout=limit
    )
    jobs = [JobInput(id=f"id-{i}", payload=p, attempt=2) for i, p in enumerate(payloads)]
    return await pool.run_batch(spec, jobs)


async def test_post_and_result(pool: RunnerPool, server: str) -> None:
    results = await run(pool, server + "/echo", "hello", '{"ünï": "code"}')
    assert [(r.exitcode, r.result) for r in results] == [
        (200, "id-0 2 hook hello"),
        (200, 'id-1 2 hook {"ünï": "code"}'),
    ]


@pytest.mark.parametrize("code", [200, 201, 404, 429, 500, 503, 302])
async def test_status_is_the_exitcode(pool: RunnerPool, server: str, code: int) -> None:
    (result,) = await run(pool, f"{server}/status/{code}", "x")
    if code == 302:  # a redirect without Location: not a handler answer
        assert result.exitcode == 302
    else:
        assert (result.exitcode, result.result) == (code, "status body")


async def test_result_is_bounded(pool: RunnerPool, server: str) -> None:
    (result,) = await run(pool, server + "/big", "x")
    assert result.exitcode == 200 and result.result == "b" * 1000


async def test_connection_refused_is_502(pool: RunnerPool) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (result,) = await run(pool, f"http://127.0.0.1:{port}/", "x")
    assert result.exitcode == 502
    assert result.result is not None and result.result.startswith("request failed: ")


async def test_timeout_is_504(pool: RunnerPool, server: str) -> None:
    (result,) = await run(pool, server + "/slow", "x", limit=0.3)
    assert (result.exitcode, result.result) == (504, "timed out after 0.3s")


async def test_only_http_urls(pool: RunnerPool) -> None:
    (result,) = await run(pool, "file:///etc/passwd", "x")
    assert result.exitcode == 500 and "only http and https" in str(result.result)


async def test_loopback_is_refused_by_default(strict: RunnerPool, server: str) -> None:
    (result,) = await run(strict, server + "/echo", "x")
    assert (result.exitcode, result.result) == (
        403,
        "refused: 127.0.0.1 is a loopback address (allow it with --http-allow)",
    )


async def test_localhost_name_is_refused(strict: RunnerPool, server: str) -> None:
    port = server.rsplit(":", 1)[1]
    (result,) = await run(strict, f"http://localhost:{port}/echo", "x")
    assert result.exitcode == 403, result
    assert str(result.result).startswith("refused: localhost resolves to ")
    assert "is a loopback address" in str(result.result)


async def test_ipv4_in_ipv6_loopback_is_refused(strict: RunnerPool, server: str) -> None:
    port = server.rsplit(":", 1)[1]
    (result,) = await run(strict, f"http://[::ffff:127.0.0.1]:{port}/echo", "x")
    assert result.exitcode == 403, result


async def test_metadata_address_is_refused(strict: RunnerPool) -> None:
    (result,) = await run(strict, "http://169.254.169.254/latest/meta-data/", "x", limit=30)
    assert (result.exitcode, result.result) == (
        403,
        "refused: 169.254.169.254 is a link-local address (allow it with --http-allow)",
    )


@pytest.mark.parametrize("url", ["http://10.1.2.3/", "http://192.168.0.1/", "http://[fd00::1]/"])
async def test_private_addresses_are_refused(strict: RunnerPool, url: str) -> None:
    (result,) = await run(strict, url, "x", limit=30)
    assert result.exitcode == 403 and "is a private address" in str(result.result), result


async def test_allowed_range_is_reached(pool: RunnerPool, server: str) -> None:
    (result,) = await run(pool, server + "/echo", "x")
    assert (result.exitcode, result.result) == (200, "id-0 2 hook x")


async def test_redirect_to_a_refused_address_is_refused(pool: RunnerPool, server: str) -> None:
    # 127.0.0.1 is allowed, 127.0.0.2 is not: the second hop must not be connected to
    port = server.rsplit(":", 1)[1]
    to = quote(f"http://127.0.0.2:{port}/echo", safe="")
    (result,) = await run(pool, f"{server}/redirect?to={to}", "x")
    assert (result.exitcode, result.result) == (
        403,
        "refused: 127.0.0.2 is a loopback address (allow it with --http-allow)",
    )
    to = quote(server + "/echo", safe="")  # an allowed hop is followed
    (result,) = await run(pool, f"{server}/redirect?to={to}", "x")
    assert (result.exitcode, result.result) == (200, "id-0 2 hook x")
