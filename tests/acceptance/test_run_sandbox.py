"""Handlers are walled off (docs/architecture.md invariant 5, "Runners" sandbox).

A handler sees none of the daemon's environment, runs in its own directory as
an unprivileged user, and is held by time, memory and process limits: a
runaway job ends with an error code while another tenant's jobs, posted at
the same moment, complete promptly and the daemon stays healthy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.api import Api, Handlers, wait_all_done, wait_done
from harness.daemons import DaemonFactory, Deployment, deploy

CLIENT = "boxed"
BYSTANDER = "bystander"
SECRET = "qd-test-secret-5f1e2d"
TOKEN = "secret-token-9a8b7c"
DAEMON_ENV = {"QUEUE_DAEMON_TEST_SECRET": SECRET, "SECRET_TOKEN": TOKEN}

SIMPLE = "def handler(payload, ctx):\n    return 'fine ' + payload\n"


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, module_open_tmp: Path
) -> Iterator[Deployment]:
    deployed = deploy(
        module_daemons,
        module_dsn,
        module_open_tmp,
        [CLIENT, BYSTANDER],
        "--lease",
        "10",
        "--context-idle",
        "5",
        env=DAEMON_ENV,
    )
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def api(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, CLIENT)


@pytest.fixture
def bystander(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, BYSTANDER)


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


SIMPLE_NODE = "module.exports = (payload, ctx) => 'fine ' + payload;\n"


async def bystander_jobs(
    bystander: Api, jobtype: str, count: int = 10, node: bool = False
) -> list[str]:
    """Simple jobs of another tenant, python and shell (and node), posted while a
    runaway runs."""
    await Handlers(bystander).add(f"{jobtype}-py", "python", SIMPLE)
    await Handlers(bystander).add(f"{jobtype}-sh", "shell", 'read p; echo "S: 200 fine $p"')
    ids = await bystander.add(f"{jobtype}-py", [str(n) for n in range(count)])
    ids += await bystander.add(f"{jobtype}-sh", [str(n) for n in range(count)])
    if node:
        await Handlers(bystander).add(f"{jobtype}-js", "node", SIMPLE_NODE, maxAttempts=1)
        ids += await bystander.add(f"{jobtype}-js", [str(n) for n in range(count)])
    return ids


async def assert_prompt(bystander: Api, ids: list[str], within: float = 10) -> dict[str, Any]:
    jobs = await wait_all_done(bystander, ids, within=within)
    bad = [j for j in jobs.values() if j["code"] != "ok" or not j["result"].startswith("fine")]
    assert not bad, f"{bad}"
    return jobs


ENV_HANDLER = (
    "import json, os\n"
    "\n"
    "def handler(payload, ctx):\n"
    "    try:\n"
    "        with open(f'/proc/{os.getppid()}/environ', 'rb') as f:\n"
    "            parent = f.read().decode('latin-1')\n"
    "    except OSError as exc:\n"
    "        parent = type(exc).__name__\n"
    "    return {'env': dict(os.environ), 'cwd': os.getcwd(), 'uid': os.getuid(),\n"
    "            'parent_environ': parent}\n"
)


async def test_a_handler_sees_none_of_the_daemons_environment(
    api: Api, bystander: Api, deployment: Deployment
) -> None:
    await Handlers(api).add("env", "python", ENV_HANDLER)
    await Handlers(bystander).add("env", "python", ENV_HANDLER)
    [job_id] = await api.add("env", ["x"])
    [other_id] = await bystander.add("env", ["y"])
    job = await wait_done(api, job_id)
    assert (job["code"], job["exitcode"]) == ("ok", 200), f"{job}"
    text = job["result"]
    seen = json.loads(text)
    env: dict[str, str] = seen["env"]
    for secret in (SECRET, TOKEN, deployment.dsn, *deployment.tokens.values()):
        assert secret not in text, f"the handler saw {secret!r}: {env}"
    assert not [k for k in env if k.startswith("QUEUE") or k == "SECRET_TOKEN"], env
    assert "PYTHONPATH" not in env, env  # set for the daemon by the test harness

    cwd = Path(seen["cwd"])
    daemon_cwd = deployment.daemon.stderr_path.parent  # the harness starts daemons there
    assert cwd not in (daemon_cwd, Path(os.getcwd()), deployment.cwd, deployment.data_dir), cwd
    other = await wait_done(bystander, other_id)
    assert other["code"] == "ok", f"{other}"
    assert Path(json.loads(other["result"])["cwd"]) != cwd, "two tenants share a directory"
    if os.geteuid() == 0:
        assert seen["uid"] != 0, "a handler runs as root"
        # nor can it read the daemon's environment through /proc: refused, or (in
        # a PID namespace of its own) its parent is bubblewrap's, as scrubbed as it
        parent = seen["parent_environ"]
        if parent != "PermissionError":
            keys = {item.split("=", 1)[0] for item in parent.split("\0") if item}
            assert keys <= set(env), parent[:300]


async def test_an_endless_job_times_out_while_other_tenants_run(api: Api, bystander: Api) -> None:
    handlers = Handlers(api)
    await handlers.add(
        "spin-py",
        "python",
        "def handler(payload, ctx):\n    while True:\n        pass\n",
        timeout=1,
        maxAttempts=2,
    )
    await handlers.add("spin-sh", "shell", "while :; do :; done", timeout=1, maxAttempts=2)
    spinning = [*await api.add("spin-py", ["x"]), *await api.add("spin-sh", ["y"])]
    others = await bystander_jobs(bystander, "during-spin")
    other_jobs = await assert_prompt(bystander, others)
    jobs = await wait_all_done(api, spinning, within=20)
    for job in jobs.values():
        assert (job["code"], job["exitcode"], job["attempts"]) == ("error", 504, 2), f"{job}"
        assert "timed out" in job["result"], f"{job}"
    last_other = max(when(j["done_dt"]) for j in other_jobs.values())
    assert last_other < min(when(j["done_dt"]) for j in jobs.values()), (
        "another tenant's jobs waited for the endless ones"
    )
    assert (await api.healthz()).status == 200


# 8 GiB, touched: without a memory limit this would succeed (and the test fail)
HOGS = {
    "python": (
        "def handler(payload, ctx):\n"
        "    chunks = [b'x' * (256 << 20) for _ in range(32)]\n"
        "    return f'allocated {len(chunks)} chunks'\n"
    ),
    "node": (
        "module.exports = (payload, ctx) => {\n"
        "  const chunks = [];\n"
        "  for (let i = 0; i < 32; i++) chunks.push(Buffer.alloc(256 << 20, 1));\n"
        "  return `allocated ${chunks.length} chunks`;\n"
        "};\n"
    ),
}


@pytest.mark.parametrize("lang", ["python", "node"])
async def test_a_memory_hog_is_contained(api: Api, bystander: Api, lang: str) -> None:
    await Handlers(api).add(f"hog-{lang}", lang, HOGS[lang], maxAttempts=1, timeout=30)
    [hog] = await api.add(f"hog-{lang}", ["8GiB"])
    others = await bystander_jobs(bystander, f"during-hog-{lang}")
    await assert_prompt(bystander, others)
    job = await wait_done(api, hog, within=40)
    assert job["code"] == "error" and job["exitcode"] >= 500, f"{job}"
    assert (await api.healthz()).status == 200
    # the tenant's next job runs normally
    await Handlers(api).add(f"after-hog-{lang}", "python", SIMPLE)
    [after] = await api.add(f"after-hog-{lang}", ["z"])
    assert (await wait_done(api, after))["result"] == "fine z"


FORK_BOMB = (
    "import os, time\n"
    "\n"
    "def handler(payload, ctx):\n"
    "    forked = 0\n"
    "    try:\n"
    "        while forked < 2000:  # bounded, so the machine survives even without limits\n"
    "            if os.fork() == 0:\n"
    "                time.sleep(5)\n"
    "                os._exit(0)\n"
    "            forked += 1\n"
    "    except OSError as exc:\n"
    "        return 500, f'fork failed after {forked}: {exc}'\n"
    "    return f'forked {forked}'\n"
)


async def test_a_fork_bomb_is_contained(api: Api, bystander: Api) -> None:
    await Handlers(api).add("bomb", "python", FORK_BOMB, maxAttempts=1, timeout=10)
    [bomb] = await api.add("bomb", ["boom"])
    job = await wait_done(api, bomb, within=30)
    assert job["code"] == "error" and job["exitcode"] >= 500, f"{job}"
    # its children live on for 5 s: another tenant's jobs, posted now, must not starve
    # (node too: a node context starts about a dozen threads)
    others = await bystander_jobs(bystander, "during-bomb", node=True)
    await assert_prompt(bystander, others)
    assert (await api.healthz()).status == 200
