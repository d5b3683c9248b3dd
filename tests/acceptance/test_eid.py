"""Handlers that name the same ``eid`` share warm contexts (docs/api.md, "eid"):
a job of one type runs in the process another type of the same tenant and eid
warmed, with what that one's ``before`` left in ``shared`` (python) or on
``globalThis`` (node); another tenant's handler with the same eid never shares;
a new version of one of them retires the contexts that loaded it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import aiohttp
import pytest

from harness.api import Api, Handlers, wait_done
from harness.daemons import DaemonFactory, Deployment, deploy, reachable_dir

# each says which process it ran in by a mark of that process (its pid inside a
# PID namespace of its own is the same in every context)
PY_LOADER = (
    "import os, sys\n"
    "MARK = sys.__dict__.setdefault('mark', os.urandom(8).hex())\n"
    "def handler(payload, ctx):\n    return f'{MARK} {shared.get(\"model\")}'\n"
)
PY_BEFORE = "shared['model'] = 'loaded once'"
NODE_LOADER = (
    "globalThis.mark ??= require('node:crypto').randomBytes(8).toString('hex');\n"
    "module.exports = (payload, ctx) => `${globalThis.mark} ${globalThis.model || 'None'}`;"
)
NODE_BEFORE = "globalThis.model = 'loaded once';"


@pytest.fixture
def deployment(daemons: DaemonFactory, pg_dsn: str) -> Iterator[Deployment]:
    root = reachable_dir("qd-eid-")
    deployed = deploy(daemons, pg_dsn, root, ["t", "u"])
    try:
        yield deployed
    finally:
        deployed.daemon.close()
        shutil.rmtree(root, ignore_errors=True)


async def _run(api: Api, jobtype: str) -> tuple[str, str]:
    [job_id] = await api.add(jobtype, ["x"])
    job = await wait_done(api, job_id, within=60)
    assert job["code"] == "ok", job
    pid, _, model = job["result"].partition(" ")
    return pid, model


@pytest.mark.parametrize(
    ("lang", "body", "before"),
    [("python", PY_LOADER, PY_BEFORE), ("node", NODE_LOADER, NODE_BEFORE)],
)
async def test_handlers_of_one_eid_share_a_warm_context(
    deployment: Deployment, session: aiohttp.ClientSession, lang: str, body: str, before: str
) -> None:
    t, u = deployment.api(session, "t"), deployment.api(session, "u")
    await Handlers(t).add("a", lang, body, before=before, eid="model")
    await Handlers(t).add("b", lang, body, eid="model")
    await Handlers(t).add("c", lang, body)  # no eid: a context of its own
    await Handlers(u).add("b", lang, body, eid="model")
    pid_a, model_a = await _run(t, "a")
    assert model_a == "loaded once"
    pid_b, model_b = await _run(t, "b")
    assert (pid_b, model_b) == (pid_a, "loaded once")  # warmed by a, a's before's state
    pid_c, model_c = await _run(t, "c")
    assert pid_c != pid_a and model_c == "None"
    pid_u, model_u = await _run(u, "b")  # another tenant, the same eid: never shared
    assert pid_u != pid_a and model_u == "None"
    # a new version of a retires the contexts that loaded it: b starts afresh too
    await Handlers(t).add("a", lang, body, before=before, eid="model")
    pid_b2, model_b2 = await _run(t, "b")
    assert pid_b2 != pid_a and model_b2 == "None"
    pid_a2, model_a2 = await _run(t, "a")
    assert (pid_a2, model_a2) == (pid_b2, "loaded once")


async def test_a_handler_that_fails_to_load_fails_its_own_jobs(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    t = deployment.api(session, "t")
    await Handlers(t).add("good", "python", PY_LOADER, eid="e")
    await Handlers(t).add("bad", "python", PY_LOADER, before="raise ValueError('no')", eid="e")
    first, _ = await _run(t, "good")
    [job_id] = await t.add("bad", ["x"])
    job = await wait_done(t, job_id, within=60)
    assert job["code"] == "error" and "before failed" in job["result"], job
    again, _ = await _run(t, "good")  # its own jobs run on, in a context started anew
    assert again and again != first
