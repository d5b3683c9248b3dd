"""Stopping a running job (docs/api.md): a cancel ends it with code cancelled,
499, its run's reason cancelled; a daemon-run job's context is killed and its
batch's other jobs run again; a pulled job's renew and complete get 409 with
reason cancelled, and the client library's Worker cancels its task."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import aiohttp

from harness.api import Api, Handlers, claimed, post_json, pulled_type, until, wait_done
from harness.daemons import DaemonFactory, add_tenant, living_in
from queue_daemon.client import Client, Job, Worker

# the first job of a batch notes where it runs, then sleeps; the others end at once
SLEEPER = """
import os, time
def handler(payload, ctx):
    if payload == "quick":
        return "quick"
    with open(os.path.join(payload, "home"), "w") as f:
        f.write(os.getcwd())
    time.sleep(120)
    return "not cancelled"
"""


async def test_a_running_job_is_stopped_and_its_batch_runs_again(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp, cwd=open_tmp)
    api = Api(session, daemons.start(open_tmp, pg_dsn).url, "t", token)
    marks = daemons.shared_dir("marks")
    await Handlers(api).add("sleep", "python", SLEEPER, timeout=300)
    [slow, quick] = await api.add("sleep", [str(marks), "quick"])

    async def started() -> str | None:
        home = marks / "home"
        return home.read_text() if home.exists() and home.read_text() else None

    home = await until(started, 30, "the slow job to start")
    assert (await api.get_job(slow)).json["state"] == "running"
    began = time.monotonic()
    reply = await api.cancel(slow)
    assert reply.status == 200, reply
    assert (reply.json["code"], reply.json["exitcode"]) == ("cancelled", 499), reply
    await until(lambda: _true_if(not living_in(home)), 30, "the cancelled run to stop")
    assert time.monotonic() - began < 10
    job = (await api.get_job(slow)).json
    assert (job["state"], job["code"], job["result"]) == ("done", "cancelled", "cancelled")
    assert [run["reason"] for run in job["runs"]] == ["cancelled"], job["runs"]
    assert job["runs"][0]["by"].startswith("sysid:"), job["runs"]
    other = await wait_done(api, quick, within=30)
    assert (other["code"], other["result"]) == ("ok", "quick"), other
    assert (await api.cancel(slow)).status == 409  # done now
    stats = (await api.stats()).json["types"]["sleep"]
    assert (stats["running"], stats["done_failed"], stats["done_ok"]) == (0, 1, 1), stats


async def _true_if(value: bool) -> bool | None:
    return True if value else None


async def test_a_cancelled_pulled_job_is_no_longer_held_with_the_reason(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn).url, "t", token)
    await pulled_type(api, "p", timeout=600)
    [job_id] = await api.add("p", ["x"])
    [job] = await claimed(api, "p", "w", wait=10)
    assert (await api.cancel(job_id)).status == 200
    held = {"worker": "w", "claim": job["claim"]}
    for action in ("renew", "complete"):
        reply = await post_json(api, f"/job/{job_id}/{action}", held)
        assert reply.status == 409, reply
        assert reply.json["reason"] == "cancelled", reply
    done = (await api.get_job(job_id)).json
    assert (done["code"], done["exitcode"]) == ("cancelled", 499), done
    assert done["runs"][-1]["by"] == "worker:w", done


async def test_the_worker_cancels_the_task_of_a_cancelled_job(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    url = daemons.start(tmp_path, pg_dsn).url
    running, stopped = asyncio.Event(), asyncio.Event()

    async def work(job: Job) -> str:
        running.set()
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "not cancelled"

    async with Client(url, "t", token) as q:
        await q.add_handler("long", "worker", timeout=3)  # renewed every second
        [job_id] = await q.add("long", ["x"])
        worker = Worker(q, "long", work, name="w1", wait=1)
        task = asyncio.create_task(worker.run(handle_signals=False))
        try:
            await asyncio.wait_for(running.wait(), 30)
            await q.cancel(job_id)
            await asyncio.wait_for(stopped.wait(), 10)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)
        assert worker.cancelled == 1 and worker.completed == 0
        assert (await q.get(job_id))["code"] == "cancelled"


async def test_a_cancelled_plain_function_keeps_its_lane_until_it_returns(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    url = daemons.start(tmp_path, pg_dsn).url
    running, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def work(job: Job) -> str:  # a plain function: run in a thread, not stoppable
        ran.append(job.payload)
        if job.payload == "first":
            running.set()
            release.wait(60)
        return f"done {job.payload}"

    async with Client(url, "t", token) as q:
        await q.add_handler("plain", "worker", timeout=3)  # renewed every second
        [first] = await q.add("plain", ["first"])
        worker = Worker(q, "plain", work, name="w1", concurrency=1, wait=1)
        task = asyncio.create_task(worker.run(handle_signals=False))
        try:
            assert await asyncio.to_thread(running.wait, 30)
            [second] = await q.add("plain", ["second"])
            await q.cancel(first)

            async def counted() -> bool | None:
                return True if worker.cancelled == 1 else None

            await until(counted, 30, "the worker to hear of the cancel")
            assert ran == ["first"]  # the lane is still taken: nothing else started
            release.set()
            job = await q.wait(second, timeout=30)
            assert (job["code"], job["result"]) == ("ok", "done second"), job
        finally:
            release.set()
            worker.stop()
            await asyncio.wait_for(task, 30)
        assert (await q.get(first))["code"] == "cancelled"
        assert worker.completed == 1 and worker.lost == 0
