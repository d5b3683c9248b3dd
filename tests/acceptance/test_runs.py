"""Run history and poison jobs (docs/api.md "Runs"): every attempt of a job is
listed with who ran it and how it ended, and a job whose runs keep being lost
(its daemon or worker dies or stalls) ends after its handler's maxAttempts
instead of being put back forever."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from harness.api import Api, Handlers, claimed, pulled_type, until, wait_done
from harness.daemons import DaemonFactory, add_tenant

RETRIED_TWICE_THEN_HANGS_ONCE = """
import os, time
def handler(payload, ctx):
    if ctx.attempt <= 2:
        return 500, f"failed attempt {ctx.attempt}"
    mark = os.path.join(payload, "hung")
    if not os.path.exists(mark):
        open(mark, "w").close()
        time.sleep(120)  # the daemon is killed meanwhile
    return "done at last"
"""


def _runs(job: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(r["reason"], r["code"], r["exitcode"], r["by"]) for r in job["runs"]]


async def test_every_run_is_listed_with_its_cause(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp / "a", cwd=open_tmp)
    marks = daemons.shared_dir("marks")
    first = daemons.start(open_tmp / "a", pg_dsn, "--lease", "3", "--sysid", "41")
    api = Api(session, first.url, "t", token)
    await Handlers(api).add("h", "python", RETRIED_TWICE_THEN_HANGS_ONCE, maxAttempts=5)
    [job_id] = await api.add("h", [str(marks)])
    await until(
        lambda: _true((marks / "hung").exists()), 60, "the third run to start", interval=0.1
    )
    first.kill()  # its lease runs out: the third run is lost
    second = daemons.start(open_tmp / "b", pg_dsn, "--lease", "3", "--sysid", "42")
    job = await wait_done(api.at(second.url), job_id, within=60)
    assert job["code"] == "ok" and job["result"] == "done at last" and job["attempts"] == 4, job
    job = (await api.at(second.url).get_job(job_id)).json
    assert _runs(job) == [
        ("exception", "error", 500, "sysid:41"),
        ("exception", "error", 500, "sysid:41"),
        ("lease-expired", None, None, "sysid:41"),
        ("completed", "ok", 200, "sysid:42"),
    ], job["runs"]
    assert all(r["started"] <= r["ended"] for r in job["runs"]), job["runs"]


async def _true(value: bool) -> bool | None:
    return value or None


async def test_a_job_whose_every_lease_runs_out_ends_after_max_attempts(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn, "--lease", "4").url, "t", token)
    await pulled_type(api, "p", timeout=1, maxAttempts=2)
    [job_id] = await api.add("p", ["poison"])
    for _ in range(2):  # claimed, never renewed nor completed: as a worker killed each time
        await claimed(api, "p", "dies", wait=1)
    job = await wait_done(api, job_id, within=30)
    assert job["code"] == "error" and job["exitcode"] == 500 and job["attempts"] == 2, job
    job = (await api.get_job(job_id)).json
    assert _runs(job) == [("lease-expired", None, None, "worker:dies")] * 2, job["runs"]


async def test_a_context_that_dies_on_every_run_ends_after_max_attempts(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp, cwd=open_tmp)
    api = Api(session, daemons.start(open_tmp, pg_dsn).url, "t", token)
    body = "import os\ndef handler(payload, ctx):\n    os._exit(3)\n"
    await Handlers(api).add("h", "python", body, maxAttempts=2)
    [job_id] = await api.add("h", ["x"])
    job = await wait_done(api, job_id, within=60)
    assert job["code"] == "error" and job["attempts"] == 2, job
    job = (await api.get_job(job_id)).json
    assert [r["reason"] for r in job["runs"]] == ["exception", "exception"], job["runs"]
    assert "died" in job["result"], job


async def test_a_cancel_is_a_run_and_a_waiting_job_has_none(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn).url, "t", token)
    [job_id] = await api.add("nohandler", ["x"], params={"delay": "60"})
    job = await api.wait_job(job_id)
    assert job["runs"] == [], job
    assert (await api.cancel(job_id)).status == 200
    job = (await api.get_job(job_id)).json
    assert _runs(job) == [("cancelled", "failed", 499, None)], job["runs"]
    listed = (await api.jobs()).json["jobs"]
    assert all("runs" not in j for j in listed)  # pages stay small: runs are on GET only
