"""Running jobs end to end (docs/api.md "Handlers", "Languages", "Output lines", "Exit codes").

One real daemon on a real PostgreSQL for the module; handlers are added over
HTTP, jobs posted and polled until done, as a tenant does. Each test uses its
own jobtypes, so tests sharing the daemon never see each other's jobs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from harness.api import (
    Api,
    Handlers,
    add_json,
    assert_error,
    until,
    wait_all_done,
    wait_done,
)
from harness.daemons import DaemonFactory, Deployment, deploy
from tests.acceptance.storecheck import payloads

CLIENT = "run"
OTHER = "othertenant"  # a real second tenant: forged output lines must never reach it

# Each handler reads a payload "CODE text" and ends the job with that exitcode and result.
STATUS_HANDLERS = {
    "python": (
        "def handler(payload, ctx):\n"
        "    code, _, text = payload.partition(' ')\n"
        "    return int(code), text\n"
    ),
    "node": (
        "module.exports = (payload, ctx) => {\n"
        "  const i = payload.indexOf(' ');\n"
        "  return [Number(payload.slice(0, i)), payload.slice(i + 1)];\n"
        "};\n"
    ),
    "shell": 'read code text; echo "S: $code $text"',
    "http": "",  # the test's own server, filled in by the test
}

# payload -> (code, exitcode, attempts, result) with maxAttempts 2
EXIT_CLASSES = {
    "200 fine": ("ok", 200, 1, "fine"),
    "201 made": ("ok", 201, 1, "made"),
    "404 nope": ("failed", 404, 1, "nope"),
    "422 bad input": ("failed", 422, 1, "bad input"),
    "503 down": ("error", 503, 2, "down"),
    "102 later": ("retry", 102, 2, "later"),
}


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, module_open_tmp: Path
) -> Iterator[Deployment]:
    # idle contexts close after 5 s: each test finds few of the earlier tests' contexts
    # the test endpoint listens on loopback, refused to http handlers unless allowed
    args = ("--lease", "10", "--context-idle", "5", "--http-allow", "127.0.0.1")
    deployed = deploy(module_daemons, module_dsn, module_open_tmp, [CLIENT, OTHER], *args)
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def api(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, CLIENT)


@pytest.fixture
def handlers(api: Api) -> Handlers:
    return Handlers(api)


@pytest.fixture
async def endpoint() -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 for http handlers: POST /status with "CODE text"
    answers with that status and text; it is this test's, in this test's loop."""

    async def status(request: web.Request) -> web.Response:
        code, _, text = (await request.text()).partition(" ")
        return web.Response(status=int(code), text=text)

    app = web.Application()
    app.router.add_post("/status", status)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/status"
    finally:
        await runner.cleanup()


def check(job: dict[str, Any], code: str, exitcode: int, attempts: int, result: str) -> None:
    shown = f"{job}"  # the whole job, not pytest's shortened repr
    assert job["state"] == "done", shown
    assert (job["code"], job["exitcode"], job["result"]) == (code, exitcode, result), shown
    assert job["attempts"] == attempts, shown
    assert job["done_dt"] is not None, shown


async def results_of(api: Api, jobtype: str, count: int, within: float = 20.0) -> list[str]:
    """Wait until ``count`` jobs of ``jobtype`` are done; return their results."""

    async def probe() -> list[str] | None:
        jobs = await api.all_jobs(type=jobtype, state="done")
        return [j["result"] for j in jobs] if len(jobs) >= count else None

    return await until(probe, within, f"{count} done jobs of type {jobtype}", interval=0.1)


# --- languages and exit codes ------------------------------------------------------


@pytest.mark.parametrize("lang", ["python", "node", "shell", "http"])
async def test_each_exit_code_class_in_each_language(
    api: Api, handlers: Handlers, endpoint: str, lang: str
) -> None:
    body = endpoint if lang == "http" else STATUS_HANDLERS[lang]
    stored = await handlers.add(f"codes-{lang}", lang, body, maxAttempts=2, timeout=10)
    assert stored["lang"] == lang and stored["body"] == body, stored
    assert stored["type"] == f"codes-{lang}", stored
    # an HTTP reply cannot carry a final 1xx status
    cases = {p: e for p, e in EXIT_CLASSES.items() if not (lang == "http" and p[0] == "1")}
    ids = await api.add(f"codes-{lang}", list(cases))
    # 1xx and 5xx: after the first run the job waits for its retry (~1 s) with one attempt
    retried = [i for i, e in zip(ids, cases.values(), strict=True) if e[2] == 2]
    between = await asyncio.gather(*(waiting_for_retry(api, i) for i in retried))
    for job, payload in zip(between, [p for p, e in cases.items() if e[2] == 2], strict=True):
        code, exitcode, _, result = cases[payload]
        assert (job["code"], job["exitcode"], job["result"]) == (code, exitcode, result), f"{job}"
    jobs = await wait_all_done(api, ids, within=30)
    for job_id, expected in zip(ids, cases.values(), strict=True):
        job = jobs[job_id]
        assert job["type"] == f"codes-{lang}", job
        check(job, *expected)


async def waiting_for_retry(api: Api, job_id: str) -> dict[str, Any]:
    """The job as seen between its first and second run."""

    async def probe() -> dict[str, Any] | None:
        reply = await api.get_job(job_id)
        if reply.status != 200:
            return None
        job: dict[str, Any] = reply.json
        assert job["state"] != "done" or job["attempts"] >= 2, f"done after one run: {job}"
        return job if job["state"] == "waiting" and job["attempts"] == 1 else None

    return await until(probe, 10, f"job {job_id} waiting for its retry", interval=0.05)


async def test_text_form_with_lang_adds_a_handler(api: Api, handlers: Handlers) -> None:
    source = "def handler(payload, ctx):\n    return payload[::-1]\n"
    reply = await handlers.add_text("text-python", source, "python")
    assert reply.status == 200, reply
    stored = reply.json
    assert (stored["lang"], stored["body"], stored["type"]) == ("python", source, "text-python")
    assert isinstance(stored["id"], str) and stored["id"]
    reply = await handlers.add_text("text-shell", 'read p; echo "S: 200 shell:$p"', "shell")
    assert reply.status == 200, reply

    [py] = await api.add("text-python", ["abc"])
    [sh] = await api.add("text-shell", ["xyz"])
    check(await wait_done(api, py), "ok", 200, 1, "cba")
    check(await wait_done(api, sh), "ok", 200, 1, "shell:xyz")


async def test_return_values_of_python_and_node(api: Api, handlers: Handlers) -> None:
    await handlers.add(
        "shapes-python",
        "python",
        "def handler(payload, ctx):\n"
        "    return {'none': None, 'int': 202, 'str': 'text', 'pair': (203, 'paired'),\n"
        "            'obj': {'a': [1, 2]}}[payload]\n",
    )
    await handlers.add(
        "shapes-node",
        "node",
        "module.exports = async (payload, ctx) => ({none: undefined, int: 202, str: 'text',\n"
        "  pair: [203, 'paired'], obj: {a: [1, 2]}})[payload];\n",
    )
    expected = {
        "none": (200, None),
        "int": (202, None),
        "str": (200, "text"),
        "pair": (203, "paired"),
        "obj": (200, '{"a":[1,2]}'),
    }
    for lang in ("python", "node"):
        ids = await api.add(f"shapes-{lang}", list(expected))
        jobs = await wait_all_done(api, ids)
        for job_id, (payload, (exitcode, result)) in zip(ids, expected.items(), strict=True):
            job = jobs[job_id]
            assert (job["code"], job["exitcode"], job["result"]) == ("ok", exitcode, result), (
                lang,
                payload,
                job,
            )


async def test_an_exception_is_a_500_error_with_its_message(api: Api, handlers: Handlers) -> None:
    await handlers.add(
        "raises-python",
        "python",
        "def handler(payload, ctx):\n    raise ValueError('boom ' + payload)\n",
        maxAttempts=1,
    )
    await handlers.add(
        "raises-node",
        "node",
        "module.exports = async (payload) => { throw new Error('kaboom ' + payload); };\n",
        maxAttempts=1,
    )
    [py] = await api.add("raises-python", ["42"])
    [js] = await api.add("raises-node", ["7"])
    job = await wait_done(api, py)
    assert (job["code"], job["exitcode"], job["attempts"]) == ("error", 500, 1), job
    assert "ValueError" in job["result"] and "boom 42" in job["result"], job
    job = await wait_done(api, js)
    assert (job["code"], job["exitcode"], job["attempts"]) == ("error", 500, 1), job
    assert "kaboom 7" in job["result"], job


async def test_an_exception_is_retried_until_max_attempts(api: Api, handlers: Handlers) -> None:
    await handlers.add(
        "flaky",
        "python",
        "def handler(payload, ctx):\n"
        "    if ctx.attempt < 2:\n"
        "        raise RuntimeError(f'attempt {ctx.attempt}')\n"
        "    return f'ok on attempt {ctx.attempt}'\n",
        maxAttempts=3,
    )
    [job_id] = await api.add("flaky", ["x"])
    check(await wait_done(api, job_id), "ok", 200, 2, "ok on attempt 2")


# --- follow-on jobs -------------------------------------------------------------------


async def test_output_lines_and_emit_add_follow_on_jobs(
    api: Api, handlers: Handlers, deployment: Deployment
) -> None:
    await handlers.add("kid", "python", "def handler(payload, ctx):\n    return 'kid:' + payload\n")
    await handlers.add(
        "fan-python",
        "python",
        "def handler(payload, ctx):\n"
        "    print(f'J: kid|py-print-{payload}')\n"
        "    print('a log line, not a job')\n"
        "    ctx.emit('kid', f'py-emit-{payload}')\n"
        "    ctx.emit('orphan', {'n': payload})\n"
        "    return 'fanned'\n",
    )
    await handlers.add(
        "fan-node",
        "node",
        "module.exports = async (payload, ctx) => {\n"
        "  console.log('J: kid|node-print-' + payload);\n"
        "  ctx.emit('kid', 'node-emit-' + payload);\n"
        "  return 'fanned';\n"
        "};\n",
    )
    await handlers.add("fan-shell", "shell", 'read p; echo "J: kid|sh-print-$p"; echo log')
    parents = [
        *await api.add("fan-python", ["a"]),
        *await api.add("fan-node", ["b"]),
        *await api.add("fan-shell", ["c"]),
    ]
    done = await wait_all_done(api, parents)
    assert [done[p]["result"] for p in parents[:2]] == ["fanned", "fanned"], done
    assert done[parents[2]]["code"] == "ok", done

    kids = await results_of(api, "kid", 5)
    assert sorted(kids) == sorted(
        f"kid:{p}" for p in ("py-print-a", "py-emit-a", "node-print-b", "node-emit-b", "sh-print-c")
    )
    # a type without a handler gets its follow-on job too; it waits
    orphans = await until(
        lambda: _jobs_or_none(api, "orphan"), 10, "the orphan follow-on job", interval=0.1
    )
    assert len(orphans) == 1, orphans
    assert orphans[0]["state"] == "waiting", orphans
    stored = await payloads(deployment.dsn, [orphans[0]["id"]])
    assert stored == {orphans[0]["id"]: '{"n":"a"}'}


async def _jobs_or_none(api: Api, jobtype: str) -> list[dict[str, Any]] | None:
    return await api.all_jobs(type=jobtype) or None


async def test_a_forged_output_line_stays_in_the_jobs_own_tenant(
    api: Api, handlers: Handlers, deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    other = deployment.api(session, OTHER)
    await Handlers(other).add("x", "python", "def handler(payload, ctx):\n    return 'pwned'\n")
    await handlers.add(
        "forger",
        "python",
        "def handler(payload, ctx):\n"
        f"    print('J: {OTHER}-x|p')\n"
        f"    ctx.emit('{OTHER}-y', 'q')\n"
        "    return 'forged'\n",
    )
    [job_id] = await api.add("forger", ["go"])
    check(await wait_done(api, job_id), "ok", 200, 1, "forged")
    await api.wait_caught_up()

    mine = await until(
        lambda: _jobs_or_none(api, f"{OTHER}-x"), 10, "the forged job in its own tenant"
    )
    assert [j["type"] for j in mine] == [f"{OTHER}-x"], mine
    assert await payloads(deployment.dsn, [mine[0]["id"]]) == {mine[0]["id"]: "p"}
    assert len(await api.all_jobs(type=f"{OTHER}-y")) == 1

    assert await other.all_jobs() == []
    reply = await other.stats()
    assert reply.status == 200, reply
    assert reply.json["types"] == {}, reply
    conn = await asyncpg.connect(deployment.dsn)
    try:
        rows = await conn.fetch("SELECT type FROM all_jobs WHERE type LIKE $1", f"{OTHER}-%")
    finally:
        await conn.close()
    assert rows == [], "a forged line reached another tenant's jobs"


async def test_then_chains_an_ok_result_into_a_job_of_that_type(
    api: Api, handlers: Handlers
) -> None:
    await handlers.add(
        "first",
        "python",
        "def handler(payload, ctx):\n"
        "    if payload == 'bad':\n"
        "        return 404, 'no'\n"
        "    return 'R-' + payload\n",
        then="second",
    )
    await handlers.add(
        "second", "python", "def handler(payload, ctx):\n    return 'second got ' + payload\n"
    )
    ids = await api.add("first", ["a", "b", "bad"])
    jobs = await wait_all_done(api, ids)
    assert [jobs[i]["code"] for i in ids] == ["ok", "ok", "failed"], jobs
    assert sorted(await results_of(api, "second", 2)) == ["second got R-a", "second got R-b"]
    await api.wait_caught_up()
    assert len(await api.all_jobs(type="second")) == 2, "a failed job must not chain"


# --- contexts ---------------------------------------------------------------------------


async def test_before_runs_once_per_context(api: Api, handlers: Handlers) -> None:
    await handlers.add(
        "counted",
        "python",
        "def handler(payload, ctx):\n    return f'{PID}:{BEFORE_RUNS}'\n",
        before=(
            "import os\nBEFORE_RUNS = globals().get('BEFORE_RUNS', 0) + 1\n"
            "PID = os.urandom(8).hex()\n"  # the context's mark (its pid is the same in each)
        ),
    )
    served: dict[str, int] = {}  # "pid:before-runs" -> jobs that context served
    for batch in range(2):
        # 20 jobs in one request, once as text lines and once as a JSON array
        if batch == 0:
            ids = await api.add("counted", [f"{batch}-{n}" for n in range(20)])
        else:
            ids = await add_json(api, "counted", [{"n": n} for n in range(20)])
        jobs = await wait_all_done(api, ids)
        assert all(jobs[i]["code"] == "ok" for i in ids), jobs
        for i in ids:
            served[jobs[i]["result"]] = served.get(jobs[i]["result"], 0) + 1
    # `before` ran exactly once in every context, and contexts were reused:
    # 40 jobs ran in a few warm processes (the daemon starts a few single-job
    # batches of a new type side by side while it learns their run time)
    assert all(result.split(":")[1] == "1" for result in served), served
    assert len({result.split(":")[0] for result in served}) == len(served), served
    # (how many contexts run side by side is the worker's timing: four learning
    # batches, then learnt batches that may overlap them; never one per job)
    assert len(served) <= 8 and max(served.values()) >= 10, served


async def test_a_replaced_handler_runs_jobs_picked_up_afterwards(
    api: Api, handlers: Handlers
) -> None:
    v1 = await handlers.add(
        "versioned",
        "python",
        "import time\n\ndef handler(payload, ctx):\n    time.sleep(0.02)\n    return 'v1'\n",
    )
    early = await api.add("versioned", [str(n) for n in range(40)])
    v2 = await handlers.add("versioned", "python", "def handler(payload, ctx):\n    return 'v2'\n")
    assert v2["id"] != v1["id"], (v1, v2)
    reply = await handlers.get("versioned")
    assert reply.status == 200 and reply.json["id"] == v2["id"], reply
    late = await api.add("versioned", [str(n) for n in range(10)])
    jobs = await wait_all_done(api, early + late)
    assert {jobs[i]["result"] for i in early} <= {"v1", "v2"}, jobs
    assert [jobs[i]["result"] for i in late] == ["v2"] * 10, [jobs[i] for i in late]
    assert all(j["code"] == "ok" for j in jobs.values()), jobs


async def test_node_handlers_of_many_types_run_side_by_side(api: Api, handlers: Handlers) -> None:
    # a node context has about a dozen threads; eight of them at once must still start
    types = [f"side-{n}" for n in range(8)]
    for name in types:
        await handlers.add(
            name,
            "node",
            "module.exports = async (payload, ctx) => {\n"
            "  await new Promise((done) => setTimeout(done, 1000));\n"
            "  return ctx.type + ':' + payload;\n"
            "};\n",
            maxAttempts=1,
        )
    ids = [(await api.add(name, ["p"]))[0] for name in types]
    jobs = await wait_all_done(api, ids, within=20)
    assert [jobs[i]["result"] for i in ids] == [f"{name}:p" for name in types], (
        f"{[jobs[i] for i in ids]}"
    )


# --- handler routes -------------------------------------------------------------------


async def test_syntax_errors_are_bad_handler_with_the_line(handlers: Handlers) -> None:
    reply = await handlers.add_raw(
        "broken",
        {"lang": "python", "body": "def handler(payload, ctx):\n    x = 1\n    return (\n"},
    )
    body = assert_error(reply, 400, "bad_handler")
    assert "line 3" in body["message"], body
    reply = await handlers.add_raw(
        "broken",
        {"lang": "node", "body": "module.exports = (p) => {\n  const a = 1;\n  return p +;\n};\n"},
    )
    body = assert_error(reply, 400, "bad_handler")
    assert "line 3" in body["message"], body
    reply = await handlers.add_raw(
        "broken",
        {"lang": "python", "body": "def handler(p, ctx):\n    pass\n", "before": "x = (\n"},
    )
    body = assert_error(reply, 400, "bad_handler")
    assert "before" in body["message"] and "line 1" in body["message"], body
    reply = await handlers.add_text("broken", "def handler(p, ctx)\n    pass\n", "python")
    body = assert_error(reply, 400, "bad_handler")
    assert "line 1" in body["message"], body
    # nothing was stored
    assert_error(await handlers.get("broken"), 404)


async def test_unknown_or_missing_lang_is_bad_handler(handlers: Handlers) -> None:
    assert_error(await handlers.add_raw("t", {"lang": "cobol", "body": "x"}), 400, "bad_handler")
    assert_error(await handlers.add_raw("t", {"body": "x"}), 400, "bad_handler")
    assert_error(await handlers.add_text("t", "echo hi", "cobol"), 400, "bad_handler")
    assert_error(await handlers.add_text("t", "echo hi", ""), 400, "bad_handler")
    assert_error(await handlers.get("t"), 404)


async def test_get_returns_the_stored_handler_and_del_removes_it(handlers: Handlers) -> None:
    body = "def handler(payload, ctx):\n    return payload\n"
    stored = await handlers.add("kept", "python", body, timeout=7, then="elsewhere")
    reply = await handlers.get("kept")
    assert reply.status == 200, reply
    got = reply.json
    assert got["id"] == stored["id"], (stored, got)
    assert (got["lang"], got["body"], got["type"], got["timeout"], got["then"]) == (
        "python",
        body,
        "kept",
        7,
        "elsewhere",
    )
    reply = await handlers.delete("kept")
    assert reply.status == 200, reply
    assert_error(await handlers.get("kept"), 404)
    assert_error(await handlers.delete("kept"), 404)


async def test_jobs_without_a_handler_wait_and_run_once_one_is_added(
    api: Api, handlers: Handlers
) -> None:
    ids = await api.add("later", ["1", "2"])
    for job_id in ids:
        await api.wait_job(job_id)
    # the daemon has seen them (claimed and put them back, or left them); still waiting
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        for job_id in ids:
            job = (await api.get_job(job_id)).json
            assert job["state"] in ("waiting", "running"), job
            assert job["code"] in (None, "retry"), job
            assert job["exitcode"] in (None, 503), job
        await asyncio.sleep(0.25)
    added = time.monotonic()
    await handlers.add(
        "later", "python", "def handler(payload, ctx):\n    return 'ran ' + payload\n"
    )
    # "once a handler is added": promptly, not after some back-off chosen while it had none
    jobs = await wait_all_done(api, ids, within=10)
    assert sorted(j["result"] for j in jobs.values()) == ["ran 1", "ran 2"], jobs
    assert all(j["code"] == "ok" for j in jobs.values()), jobs
    assert time.monotonic() - added < 12
