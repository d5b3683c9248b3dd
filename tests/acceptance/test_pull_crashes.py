"""Pull workers as real processes that die or stall: a worker killed mid-job
(SIGKILL, no more renews) loses its job to another after the lease; a worker
stopped (SIGSTOP) past its lease and continued gets 409 on renew and complete,
and the result of the worker that took the job over stands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.api import Api, claimed, post_json, pulled_type, wait_done
from harness.daemons import DaemonFactory, add_tenant

# A worker that claims one job, prints it, renews it every 0.2 s until the file
# named by its third argument exists, then renews once more and completes it;
# it prints each reply's status.
WORKER = r"""
import json, os, sys, time, urllib.error, urllib.request
url, token, go, name = sys.argv[1:5]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), method="POST",
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
jobs = []
while not jobs:
    jobs = post("/t/job/slow/claim", {"worker": name, "wait": 5})[1]["jobs"]
job = jobs[0]
print("claimed", job["id"], flush=True)
while not os.path.exists(go):
    status, _ = post(f"/t/job/{job['id']}/renew", {"worker": name, "claim": job["claim"]})
    print("renew", status, flush=True)
    if status != 200:
        break
    time.sleep(0.2)
status, _ = post(f"/t/job/{job['id']}/renew", {"worker": name, "claim": job["claim"]})
print("last renew", status, flush=True)
status, _ = post(f"/t/job/{job['id']}/complete",
                 {"worker": name, "claim": job["claim"], "result": "from " + name})
print("complete", status, flush=True)
"""


class WorkerProcess:
    def __init__(self, url: str, token: str, go: Path, name: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, url, token, str(go), name],
            stdout=subprocess.PIPE,
            text=True,
        )

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    try:
        yield started
    finally:
        for worker in started:
            worker.close()


async def _setup(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> tuple[Api, str, str]:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    # --lease 4: leases that ran out are looked for every second
    api = Api(session, daemons.start(tmp_path, pg_dsn, "--lease", "4").url, "t", token)
    await pulled_type(api, "slow", timeout=2)
    [job_id] = await api.add("slow", ["x"])
    return api, token, job_id


async def _claim_and_complete(api: Api, name: str) -> dict[str, Any]:
    [job] = await claimed(api, "slow", name, wait=1)
    body = {"worker": name, "claim": job["claim"], "result": f"from {name}"}
    reply = await post_json(api, f"/job/{job['id']}/complete", body)
    assert reply.status == 200, reply
    result: dict[str, Any] = job
    return result


async def test_a_killed_workers_job_is_completed_by_another_after_the_lease(
    daemons: DaemonFactory,
    pg_dsn: str,
    tmp_path: Path,
    session: aiohttp.ClientSession,
    workers: list[WorkerProcess],
) -> None:
    api, token, job_id = await _setup(daemons, pg_dsn, tmp_path, session)
    first = WorkerProcess(api.url, token, tmp_path / "never", "first")
    workers.append(first)
    assert first.line() == f"claimed {job_id}"
    assert first.line() == "renew 200"
    first.signal(signal.SIGKILL)  # mid-job: no renew, no complete
    job = await _claim_and_complete(api, "second")
    assert job["id"] == job_id and job["attempts"] == 2
    done = await wait_done(api, job_id)
    assert done["result"] == "from second", done


async def test_a_stopped_worker_continued_past_its_lease_changes_nothing(
    daemons: DaemonFactory,
    pg_dsn: str,
    tmp_path: Path,
    session: aiohttp.ClientSession,
    workers: list[WorkerProcess],
) -> None:
    api, token, job_id = await _setup(daemons, pg_dsn, tmp_path, session)
    go = tmp_path / "go"
    first = WorkerProcess(api.url, token, go, "first")
    workers.append(first)
    assert first.line() == f"claimed {job_id}"
    assert first.line() == "renew 200"
    first.signal(signal.SIGSTOP)  # stalled past its 2 s lease
    await _claim_and_complete(api, "second")
    go.touch()
    first.signal(signal.SIGCONT)
    assert first.proc.wait(timeout=30) == 0
    assert first.proc.stdout is not None
    lines = first.proc.stdout.read().splitlines()
    # renews of before the stop may still be unread; then the 409s
    assert [line for line in lines if line.startswith(("last", "complete"))] == [
        "last renew 409",
        "complete 409",
    ], lines
    done = (await api.get_job(job_id)).json
    assert done["result"] == "from second" and done["attempts"] == 2, done
