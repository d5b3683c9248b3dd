"""A job's log excerpt (docs/api.md): GET of a job shows the last lines its last
run printed, bounded, as text (never markup); a run that printed nothing, none."""

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
    for job_id, payload in ((ok, "ok"), (failed, "fail")):
        job = (await lg.get_job(job_id)).json
        assert job["log"] == "\n".join(f"line {n} <b>{payload}</b>" for n in range(10, 30)), job
    assert (await lg.get_job(quiet)).json["log"] is None
    listed = (await lg.request("GET", "/lg/jobs", params={"type": "noisy"})).json
    assert all("log" not in job for job in listed["jobs"])  # a GET of the job alone
