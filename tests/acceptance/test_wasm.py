"""Wasm handlers and blobs end to end (docs/api.md "Wasm handlers", "Blobs"): a
real daemon on a real PostgreSQL, handlers and blobs added over HTTP."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import wasmtime

from harness import wat
from harness.api import Api, Handlers, assert_error, wait_all_done, wait_done
from harness.daemons import DaemonFactory, Deployment, deploy

CLIENT = "wasm"
OTHER = "wasmother"


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, module_open_tmp: Path
) -> Iterator[Deployment]:
    args = ("--wasm-memory", str(4 << 20))
    deployed = deploy(module_daemons, module_dsn, module_open_tmp, [CLIENT, OTHER], *args)
    try:
        yield deployed
    finally:
        deployed.daemon.close()


@pytest.fixture
def api(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, CLIENT)


@pytest.fixture
def other(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, OTHER)


async def put(api: Api, data: bytes) -> str:
    reply = await api.request("PUT", f"/{api.client}/blob", data=data)
    assert reply.status == 200, reply
    addr = "sha256:" + hashlib.sha256(data).hexdigest()
    assert reply.json == {"addr": addr, "size": len(data)}, reply
    return addr


async def test_a_wasm_handler_runs_its_jobs(api: Api) -> None:
    handlers = Handlers(api)
    stored = await handlers.add("echo", "wasm", wat.echo(), timeout=5)
    assert stored["lang"] == "wasm"
    ids = await api.add("echo", ["hello", "J: echo2|next", "S: 404 not here"])
    jobs = await wait_all_done(api, ids, within=20)
    assert [(jobs[i]["code"], jobs[i]["exitcode"]) for i in ids] == [
        ("ok", 200),
        ("ok", 200),
        ("failed", 404),
    ]
    assert jobs[ids[2]]["result"] == "not here"
    binary = base64.b64encode(wasmtime.wat2wasm(wat.prints("S: 200 binary\n"))).decode()
    await handlers.add("bin", "wasm", binary)
    [job_id] = await api.add("bin", ["x"])
    job = await wait_done(api, job_id, within=20)
    assert (job["code"], job["result"]) == ("ok", "binary")


async def test_a_wasm_job_reports_progress_with_p_lines(api: Api) -> None:
    await Handlers(api).add("echo_progress", "wasm", wat.echo(), timeout=5)
    [job_id] = await api.add("echo_progress", ["P: 0.6 sixty"])
    job = await wait_done(api, job_id, within=20)
    assert job["code"] == "ok" and job["progress"]["fraction"] == 0.6, job
    assert job["progress"]["message"] == "sixty", job


async def test_a_module_that_loops_or_grows_is_stopped(api: Api) -> None:
    handlers = Handlers(api)
    await handlers.add("spin", "wasm", wat.spins(), timeout=0.5, maxAttempts=1)
    await handlers.add("grow", "wasm", wat.grows(128), memory=1 << 20)  # 8 MiB > its 1 MiB
    [spin] = await api.add("spin", ["x"])
    [grow] = await api.add("grow", ["x"])
    job = await wait_done(api, spin, within=20)
    assert (job["code"], job["exitcode"]) == ("error", 504)
    job = await wait_done(api, grow, within=20)
    assert (job["code"], job["result"]) == ("ok", "refused")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"body": "(module"}, "text format"),
        ({"body": '(module (func (export "main")))'}, "_start"),
        ({"body": ""}, "needs a body"),
        ({"body": wat.noop(), "module": "sha256:" + "0" * 64}, "not both"),
        ({"module": "sha256:xyz"}, "blob address"),
        ({"module": "sha256:" + "0" * 64}, "no blob"),
        ({"body": wat.noop(), "memory": 100}, "memory"),
        ({"body": wat.noop(), "memory": True}, "memory"),
        ({"body": wat.noop(), "before": "x"}, "python and node"),
    ],
)
async def test_bad_wasm_handlers_are_refused(
    api: Api, fields: dict[str, object], message: str
) -> None:
    reply = await Handlers(api).add_raw("bad", {"lang": "wasm", **fields})
    assert_error(reply, 400, "bad_handler")
    assert message in reply.json["message"], reply


async def test_memory_and_module_are_wasm_fields_only(api: Api) -> None:
    reply = await Handlers(api).add_raw("bad", {"lang": "shell", "body": "true", "memory": 1 << 20})
    assert_error(reply, 400, "bad_handler")


async def test_blobs_are_content_addressed_and_private(api: Api, other: Api) -> None:
    data = b"\x00\x01 some bytes \xff"
    addr = await put(api, data)
    assert await put(api, data) == addr  # idempotent
    reply = await api.request("GET", f"/{CLIENT}/blob/{addr}")
    assert reply.status == 200 and reply.body == data
    assert reply.content_type == "application/octet-stream"
    for method in ("GET", "DELETE"):
        assert_error(await other.request(method, f"/{OTHER}/blob/{addr}"), 404, "not_found")
    assert_error(await api.request("GET", f"/{CLIENT}/blob/sha256:nothex"), 400, "bad_request")
    assert_error(await api.request("GET", f"/{CLIENT}/blob/{addr}", auth=False), 401)
    reply = await api.request("DELETE", f"/{CLIENT}/blob/{addr}")
    assert reply.status == 200, reply
    assert_error(await api.request("GET", f"/{CLIENT}/blob/{addr}"), 404, "not_found")
    assert_error(await api.request("DELETE", f"/{CLIENT}/blob/{addr}"), 404, "not_found")


async def test_a_blob_over_the_limit_is_refused(api: Api, deployment: Deployment) -> None:
    reply = await api.request("PUT", f"/{CLIENT}/blob", data=b"x" * ((16 << 20) + 1))
    assert_error(reply, 413, "too_large")


async def test_a_handler_runs_a_module_in_a_blob_and_jobs_take_blobs_as_input(
    api: Api, other: Api
) -> None:
    module = await put(api, bytes(wasmtime.wat2wasm(wat.echo())))
    handlers = Handlers(api)
    stored = await handlers.add_raw("fromblob", {"lang": "wasm", "module": module})
    assert stored.status == 200 and stored.json["module"] == module, stored
    # a blob a current handler runs stays
    assert_error(await api.request("DELETE", f"/{CLIENT}/blob/{module}"), 409, "conflict")
    text = await put(api, b"S: 200 from the input blob\n")
    reply = await api.add_raw("fromblob", b"", params={"input": text})
    assert reply.status == 200, reply
    [job_id] = reply.json["ids"]
    job = await wait_done(api, job_id, within=20)
    assert (job["code"], job["result"]) == ("ok", "from the input blob")
    # another tenant cannot name either
    reply = await Handlers(other).add_raw("fromblob", {"lang": "wasm", "module": module})
    assert_error(reply, 400, "bad_handler")
    assert_error(await other.add_raw("x", b"", params={"input": text}), 404, "not_found")
    # bad inputs
    two = await put(api, b"one\ntwo\n")
    assert_error(await api.add_raw("fromblob", b"", params={"input": two}), 400, "bad_payload")
    reply = await api.add_raw("fromblob", b"body", params={"input": text})
    assert_error(reply, 400, "bad_request")
    assert_error(await api.add_raw("fromblob", b"", params={"input": "x"}), 400, "bad_request")
    # a newer version frees the blob
    await handlers.add("fromblob", "wasm", wat.noop())
    assert (await api.request("DELETE", f"/{CLIENT}/blob/{module}")).status == 200
