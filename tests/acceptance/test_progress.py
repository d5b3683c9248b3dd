"""Progress (docs/api.md): python and node handlers' ``ctx.progress``, shell
and wasm ``P:`` lines, a pull worker's renew; GET shows the last report while
the job runs and keeps it once done; bad reports are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from harness.api import (
    Api,
    Handlers,
    assert_error,
    claimed,
    post_json,
    pulled_type,
    until,
    wait_done,
)
from harness.daemons import DaemonFactory, add_tenant

WAITS = """
import os, time
def handler(payload, ctx):
    ctx.progress(0.5, "half way")
    deadline = time.time() + 60
    while not os.path.exists(payload) and time.time() < deadline:
        time.sleep(0.05)
    ctx.progress(1, "done")
    return "ok"
"""
NODE = """
module.exports = async (p, ctx) => {
  ctx.progress(0.25, 'quarter');
  ctx.progress(0.75, 'three quarters');  // within 0.1 s: sent with the result
  return 'ok';
};
"""
SHELL = 'echo "P: 0.3 thirty"; echo "P: nonsense"; echo "S: 200 fine"'


async def _progress(api: Api, job_id: str) -> dict[str, Any] | None:
    job = (await api.get_job(job_id)).json
    progress: dict[str, Any] | None = job.get("progress")
    return progress


async def test_handlers_report_progress_while_running_and_keep_the_last(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp, cwd=open_tmp)
    api = Api(session, daemons.start(open_tmp, pg_dsn).url, "t", token)
    handlers = Handlers(api)
    await handlers.add("waits", "python", WAITS, timeout=120)
    await handlers.add("node", "node", NODE)
    await handlers.add("shell", "shell", SHELL)
    marker = daemons.shared_dir("marks") / "go"
    [waiting] = await api.add("waits", [str(marker)])

    async def half() -> dict[str, Any] | None:
        found = await _progress(api, waiting)
        return found if found and found["message"] == "half way" else None

    shown = await until(half, 30, "the running job's progress")
    assert shown["fraction"] == 0.5 and shown["at"].endswith("Z"), shown
    assert (await api.get_job(waiting)).json["state"] == "running"
    marker.write_text("go")
    done = await wait_done(api, waiting, within=30)
    assert done["progress"]["fraction"] == 1.0 and done["progress"]["message"] == "done", done

    [node] = await api.add("node", ["x"])
    [shell] = await api.add("shell", ["x"])
    node_done = await wait_done(api, node, within=30)
    assert node_done["progress"]["message"] == "three quarters", node_done
    assert node_done["progress"]["fraction"] == 0.75, node_done
    shell_done = await wait_done(api, shell, within=30)
    assert shell_done["result"] == "fine", shell_done
    assert shell_done["progress"]["fraction"] == 0.3, shell_done
    assert shell_done["progress"]["message"] == "thirty", shell_done
    # a job that reports nothing has none
    await handlers.add("quiet", "python", "def handler(p, ctx):\n    return p\n")
    [quiet] = await api.add("quiet", ["y"])
    assert (await wait_done(api, quiet, within=30))["progress"] is None


async def test_a_pull_worker_reports_progress_with_its_renewals(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn).url, "t", token)
    await pulled_type(api, "p", timeout=600)
    [job_id] = await api.add("p", ["x"])
    [job] = await claimed(api, "p", "w", wait=10)
    held = {"worker": "w", "claim": job["claim"]}
    for bad in (
        "x",
        {"fraction": 2},
        {"fraction": "half"},
        {"fraction": True},
        {"fraction": 0.5, "message": 5},
    ):
        reply = await post_json(api, f"/job/{job_id}/renew", {**held, "progress": bad})
        assert_error(reply, 400, "bad_request")
    # a single renew takes its own progress, never a "claims" list's
    odd = {**held, "claims": [{"progress": {"fraction": 0.5}}]}
    assert (await post_json(api, f"/job/{job_id}/renew", odd)).status == 200
    reply = await post_json(
        api, f"/job/{job_id}/renew", {**held, "progress": {"fraction": 0.4, "message": "m" * 500}}
    )
    assert reply.status == 200, reply

    async def reported() -> dict[str, Any] | None:
        return await _progress(api, job_id)

    shown = await until(reported, 30, "the worker's progress")
    assert shown["fraction"] == 0.4 and shown["message"] == "m" * 200, shown
    item = {"id": job_id, "claim": job["claim"], "progress": {"fraction": 0.9}}
    reply = await post_json(api, "/jobs/renew", {"worker": "w", "claims": [item]})
    assert reply.status == 200 and reply.json["results"][0]["status"] == 200, reply

    async def later() -> dict[str, Any] | None:
        found = await _progress(api, job_id)
        return found if found and found["fraction"] == 0.9 else None

    assert (await until(later, 30, "the batch renewal's progress"))["message"] == ""


# a handler that writes progress frames of its own, past its bootstrap's pace
FLOOD = """
from python_frames import frame, write
def handler(payload, ctx):
    for n in range(20000):
        write(frame({"op": "progress", "id": ctx.id, "fraction": 0.5, "message": "x"}))
    return "not stopped"
"""


async def test_a_context_that_floods_progress_frames_is_stopped(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp, cwd=open_tmp)
    api = Api(session, daemons.start(open_tmp, pg_dsn).url, "t", token)
    await Handlers(api).add("flood", "python", FLOOD, maxAttempts=1)
    [job_id] = await api.add("flood", ["x"])
    done = await wait_done(api, job_id, within=60)
    assert done["result"] != "not stopped", done
    assert "progress frames faster than" in (done["result"] or ""), done
