"""A job's log excerpt (docs/api.md): GET of a job whose last run did not end ok
shows the last lines that run printed, bounded, as text (never markup); an ok
run, or one that printed nothing, none. What a handler wrote never stops its
release (a NUL is stored as U+FFFD)."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from harness.api import Api, Handlers, wait_all_done
from harness.daemons import DaemonFactory, Deployment, deploy

NOISY = (
    "def handler(p, ctx):\n"
    "    for n in range(30):\n"
    "        print(f'line {n} <b>{p}</b>')\n"
    "    return 400 if p == 'fail' else 200\n"
)
NUL = "def handler(p, ctx):\n    print('a\\x00b')\n    return 500, 'c\\x00d'\n"


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(module_daemons, module_dsn, tmp_path_factory.mktemp("log"), ["lg"])
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def lg(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "lg")


async def test_get_shows_the_last_lines_the_last_run_printed(lg: Api) -> None:
    await Handlers(lg).add("noisy", "python", NOISY, maxAttempts=1)
    await Handlers(lg).add("quiet", "python", "def handler(p, ctx):\n    return 'r'\n")
    ok, failed = await lg.add("noisy", ["ok", "fail"])
    [quiet] = await lg.add("quiet", ["x"])
    done = await wait_all_done(lg, [ok, failed, quiet])
    assert done[failed]["code"] == "failed"
    job = (await lg.get_job(failed)).json
    assert job["log"] == "\n".join(f"line {n} <b>fail</b>" for n in range(10, 30)), job
    assert (await lg.get_job(ok)).json["log"] is None  # an ok run keeps none
    assert (await lg.get_job(quiet)).json["log"] is None
    listed = (await lg.request("GET", "/lg/jobs", params={"type": "noisy"})).json
    assert all("log" not in job for job in listed["jobs"])  # a GET of the job alone


async def test_a_nul_in_a_result_or_a_log_is_stored_as_a_replacement(lg: Api) -> None:
    await Handlers(lg).add("nul", "python", NUL, maxAttempts=1)
    [job_id] = await lg.add("nul", ["x"])
    (job,) = (await wait_all_done(lg, [job_id])).values()
    assert (job["code"], job["result"]) == ("error", "c\ufffdd"), job
    assert (await lg.get_job(job_id)).json["log"] == "a\ufffdb"
