"""Deadlines (docs/api.md): a job not done by its deadline ends failed, 408,
whatever attempts it had left: waiting, blocked, or running (stopped, its late
result discarded)."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from harness.api import (
    Api,
    Handlers,
    claimed,
    post_json,
    pulled_type,
    until,
    wait_done,
)
from harness.daemons import DaemonFactory, add_tenant, living_in

SLEEPER = """
import os, time
def handler(payload, ctx):
    with open(os.path.join(payload, "home"), "w") as f:
        f.write(os.getcwd())
    time.sleep(120)
    return "too late"
"""


async def test_waiting_blocked_and_running_jobs_end_408_on_time(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp, cwd=open_tmp)
    api = Api(session, daemons.start(open_tmp, pg_dsn).url, "t", token)
    marks = daemons.shared_dir("marks")
    await Handlers(api).add("sleep", "python", SLEEPER, timeout=300)
    began = time.monotonic()
    [waiting] = await api.add("nohandler", ["x"], params={"deadline": "2"})
    [parent] = await api.add("nohandler", ["x"], params={"delay": "3600"})
    [blocked] = await api.add("nohandler", ["x"], params={"after": parent, "deadline": "2"})
    [running] = await api.add("sleep", [str(marks)], params={"deadline": "3"})
    for job_id in (waiting, blocked, running):
        job = await wait_done(api, job_id, within=30)
        assert job["code"] == "failed" and job["exitcode"] == 408, job
    assert time.monotonic() - began < 15  # on time: checked every second
    home = (marks / "home").read_text()
    await until(lambda: _none_if(bool(living_in(home))), 30, "the run past its deadline to stop")
    job = (await api.get_job(running)).json
    assert [r["reason"] for r in job["runs"]] == ["deadline"], job["runs"]
    assert job["result"] != "too late"


async def _none_if(value: bool) -> bool | None:
    return None if value else True


async def test_a_pulled_job_past_its_deadline_is_no_longer_held(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn).url, "t", token)
    await pulled_type(api, "p", timeout=600)
    [job_id] = await api.add("p", ["x"], params={"deadline": "2"})
    [job] = await claimed(api, "p", "w", wait=10)
    assert job["id"] == job_id
    done = await wait_done(api, job_id, within=30)
    assert done["exitcode"] == 408, done
    held = {"worker": "w", "claim": job["claim"]}
    assert (await post_json(api, f"/job/{job_id}/renew", held)).status == 409
    assert (await post_json(api, f"/job/{job_id}/complete", held)).status == 409
    assert (await api.get_job(job_id)).json["exitcode"] == 408


async def test_jobs_no_daemon_runs_end_503_when_their_time_runs_out(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp, cwd=open_tmp)
    api = Api(session, daemons.start(open_tmp, pg_dsn, "--job-ttl", "2").url, "t", token)
    await pulled_type(api, "pulled")
    began = time.monotonic()
    [unhandled] = await api.add("nohandler", ["x"])
    [unclaimed] = await api.add("pulled", ["x"])
    done = {i: await wait_done(api, i, within=30) for i in (unhandled, unclaimed)}
    assert time.monotonic() - began < 15  # swept every quarter of --job-ttl (a second here)
    assert (done[unhandled]["code"], done[unhandled]["exitcode"]) == ("error", 503)
    assert "no handler" in done[unhandled]["result"], done[unhandled]
    assert (done[unclaimed]["code"], done[unclaimed]["exitcode"]) == ("error", 503)
    assert "no worker" in done[unclaimed]["result"], done[unclaimed]
