"""Follow-on jobs a handler asks for badly (``J:`` lines, ``ctx.emit``) are dropped, logged,
and leave the job's own outcome alone.

One daemon for the module with a payload limit of 1000 bytes. Each test's
handler asks for good and bad follow-on jobs in one run: only the good ones
are added, the daemon logs a warning naming the job, the queue log holds the
reason of each drop, and the job ends as the handler said.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import Api, Handlers, until, wait_done
from harness.daemons import DaemonFactory, Deployment, deploy

CLIENT = "emitter"
PAYLOAD_LIMIT = 1000


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, module_open_tmp: Path
) -> Iterator[Deployment]:
    args = ("--payload-limit", str(PAYLOAD_LIMIT), "--context-idle", "5")
    deployed = deploy(module_daemons, module_dsn, module_open_tmp, [CLIENT], *args)
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def api(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, CLIENT)


def _queue_log_lines(deployment: Deployment, job_id: str) -> list[str]:
    """The log lines the queue log holds for ``job_id``."""
    lines: list[str] = []
    for path in deployment.data_dir.glob("queue-*.log"):
        for text in path.read_text(errors="replace").splitlines():
            record = json.loads(text)
            if record.get("ev") == "log" and record.get("id") == job_id:
                lines += record["lines"]
    return lines


async def _payloads_of(api: Api, jobtype: str) -> list[str]:
    return sorted(job["payload"] for job in await api.all_jobs(type=jobtype))


async def _check_drops(
    api: Api,
    deployment: Deployment,
    job_id: str,
    *,
    kid: str,
    added: dict[str, list[str]],
    dropped: int,
    never: list[str],
) -> None:
    """``added``: every type that gets follow-on jobs, and their payloads; ``dropped``:
    how many drops the queue log holds; ``never``: types that must get no job."""
    await api.wait_caught_up()

    async def all_added() -> bool | None:
        for jobtype, payloads in added.items():
            if await _payloads_of(api, jobtype) != sorted(payloads):
                return None
        return True

    await until(all_added, 20, f"the follow-on jobs {added}")
    for jobtype in never:
        assert await api.all_jobs(type=jobtype) == [], jobtype
    assert await _payloads_of(api, kid) == sorted(added[kid]), "a bad follow-on job was added"

    async def logged() -> list[str] | None:
        lines = [
            line
            for line in _queue_log_lines(deployment, job_id)
            if line.startswith("dropped a follow-on job: ")
        ]
        return lines if len(lines) >= dropped else None

    lines = await until(logged, 20, "the queue log's record of the dropped jobs")
    assert len(lines) == dropped, lines
    warning = (
        "WARNING queue_daemon.engine.admit.followons: "
        f"dropped {dropped} follow-on job(s) of job {job_id}"
    )
    log = deployment.daemon.stderr_text()
    assert warning in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


BAD_PYTHON_EMITS = [
    ("'bad type'", "'p'"),
    ("'a|b'", "'p'"),
    ("'a/b'", "'p'"),
    ("''", "'p'"),
    ("'t' * 101", "'p'"),
    ("'py_kid'", "''"),
    ("'py_kid'", f"'x' * {PAYLOAD_LIMIT + 1}"),
    ("'py_kid'", f"'é' * {PAYLOAD_LIMIT // 2 + 1}"),
    ("'py_kid'", "'nul \\x00 inside'"),
    ("'py_kid'", "'two\\nlines'"),
]


async def test_python_ctx_emit_with_bad_types_or_payloads(api: Api, deployment: Deployment) -> None:
    calls = "".join(f"    ctx.emit({t}, {p})\n" for t, p in BAD_PYTHON_EMITS)
    body = (
        "def handler(payload, ctx):\n"
        f"{calls}"
        "    try:\n"
        "        ctx.emit(3, 'p')\n"  # a type that is no string is the caller's error
        "    except TypeError:\n"
        "        pass\n"
        "    ctx.emit('py_kid', 'fine|#:Batch seq=1')\n"
        f"    ctx.emit('py_kid', 'x' * {PAYLOAD_LIMIT})\n"
        "    ctx.emit('py_kid-with.dash:colon', 'a dash is a type character')\n"
        "    ctx.emit('py_kid', {'json': 'value'})\n"
        "    return 202, 'the job own outcome'\n"
    )
    await Handlers(api).add("py_parent", "python", body)
    [job_id] = await api.add("py_parent", ["go"])
    job = await wait_done(api, job_id)
    assert (job["code"], job["exitcode"], job["result"]) == ("ok", 202, "the job own outcome")
    await _check_drops(
        api,
        deployment,
        job_id,
        kid="py_kid",
        added={
            "py_kid": ["fine|#:Batch seq=1", "x" * PAYLOAD_LIMIT, '{"json":"value"}'],
            "py_kid-with.dash:colon": ["a dash is a type character"],
        },
        dropped=len(BAD_PYTHON_EMITS),
        never=["a", "t" * 100, "3"],
    )


SHELL_BODY = (
    "read p\n"
    "big=x; for i in 1 2 3 4 5 6 7 8 9 10; do big=$big$big; done\n"  # 1024 bytes
    "echo 'J: bad type|x'\n"
    "echo 'J: a/b|x'\n"
    "echo 'J: a,b|x'\n"
    "echo 'J: |x'\n"
    "echo 'J: sh_kid'\n"  # no '|'
    "echo 'J: sh_kid|'\n"
    "printf 'J: sh_kid|nul \\000 inside\\n'\n"
    'echo "J: sh_kid|$big"\n'
    "echo 'J: sh_kid|a|b|#:EndBatch'\n"
    "echo 'J: sh_kid-2|dash'\n"
    "echo 'S: 404 the job own outcome'\n"
)


async def test_shell_j_lines_with_bad_types_or_payloads(api: Api, deployment: Deployment) -> None:
    await Handlers(api).add("sh_parent", "shell", SHELL_BODY)
    [job_id] = await api.add("sh_parent", ["go"])
    job = await wait_done(api, job_id)
    assert (job["code"], job["exitcode"], job["result"]) == ("failed", 404, "the job own outcome")
    await _check_drops(
        api,
        deployment,
        job_id,
        kid="sh_kid",
        added={"sh_kid": ["a|b|#:EndBatch"], "sh_kid-2": ["dash"]},
        dropped=8,
        never=["a", "bad"],
    )


NODE_BODY = (
    "module.exports = async (payload, ctx) => {\n"
    "  ctx.emit('bad type', 'x');\n"
    "  ctx.emit('a|b', 'x');\n"
    "  for (const type of [3, undefined, null, ['a']]) {\n"
    "    try { ctx.emit(type, 'x'); } catch (err) { if (!(err instanceof TypeError)) throw err; }\n"
    "  }\n"
    "  ctx.emit('node_kid', '');\n"
    f"  ctx.emit('node_kid', 'x'.repeat({PAYLOAD_LIMIT + 1}));\n"
    "  ctx.emit('node_kid', 'nul \\u0000 inside');\n"
    "  console.log('J: also bad|x');\n"
    "  ctx.emit('node_kid', 'fine');\n"
    "  ctx.emit('node_kid', 'lone \\ud800 surrogate');\n"  # not UTF-8: U+FFFD, as in output
    "  return [201, 'the job own outcome ' + String.fromCharCode(0xdc00)];\n"
    "};\n"
)


async def test_node_ctx_emit_with_bad_types_or_payloads(api: Api, deployment: Deployment) -> None:
    await Handlers(api).add("node_parent", "node", NODE_BODY)
    [job_id] = await api.add("node_parent", ["go"])
    job = await wait_done(api, job_id)
    assert (job["code"], job["exitcode"]) == ("ok", 201), job
    assert job["result"] == "the job own outcome \ufffd", job
    await _check_drops(
        api,
        deployment,
        job_id,
        kid="node_kid",
        added={"node_kid": ["fine", "lone \ufffd surrogate"]},
        dropped=6,
        never=["3", "undefined", "null", "a"],
    )
