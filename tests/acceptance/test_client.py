"""The client library and the tenant command line (docs/client.md) against live
daemons: ``Client`` for jobs and handlers, ``Worker`` running the README's
example, worker processes competing for one type, and SIGTERM during a job."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wasmtime

from harness import wat
from harness.api import until
from harness.daemons import DaemonFactory, add_tenant
from queue_daemon.client import BadRequest, Client, Conflict, Job, NotFound, Worker

WORKERS = """
import os, time

def resize(job):
    return f"resized {job.payload}"

def slow(job):
    open(os.path.join(os.environ["MARKS"], job.id), "w").close()
    time.sleep(2)
    return "finished"
"""


@pytest.fixture
def deployment(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path
) -> Iterator[tuple[str, str, Path]]:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path / "data", cwd=tmp_path)
    daemon = daemons.start(tmp_path / "data", pg_dsn)
    (tmp_path / "jobs_mod.py").write_text(WORKERS)
    yield daemon.url, token, tmp_path


def test_the_client_imports_nothing_of_the_daemon() -> None:
    code = (
        "import sys, queue_daemon.client\n"
        "print([m for m in ('asyncpg', 'store', 'journal', 'runners', 'scheduler')"
        " if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


async def test_client_jobs_handlers_and_errors(deployment: tuple[str, str, Path]) -> None:
    url, token, _ = deployment
    async with Client(url, "t", token) as q:
        await q.add_handler("echo", "python", "def handler(p, ctx):\n    return 'echo ' + p\n")
        assert (await q.get_handler("echo"))["lang"] == "python"
        [one] = await q.add("echo", "a")
        many = await q.add("echo", ["b", "c"])
        [obj] = await q.add("echo", {"k": 1})
        keyed = await q.add("echo", ["d"], idempotency_key="k1")
        assert await q.add("echo", ["d"], idempotency_key="k1") == keyed
        done = await q.wait(obj, timeout=30)
        assert done["result"] == 'echo {"k":1}', done
        assert (await q.wait(one, timeout=30))["result"] == "echo a"
        for job_id in many:
            await q.wait(job_id, timeout=30)
        [later] = await q.add("echo", "later", delay=600)
        await q.wait(one)
        with pytest.raises(TimeoutError):
            await q.wait(later, timeout=0.5)
        assert (await q.cancel(later))["exitcode"] == 499
        with pytest.raises(Conflict):
            await q.cancel(later)
        seen = [job["id"] async for job in q.jobs(type="echo")]
        assert set(seen) >= {one, obj, later, *many}
        page = await q.list(type="echo", limit=2)
        assert len(page["jobs"]) == 2 and page["next"]
        assert (await q.stats())["types"]["echo"]["done_ok"] >= 4
        with pytest.raises(NotFound):
            await q.get("nosuchjob-1")
        with pytest.raises(BadRequest):
            await q.add("bad type", "x")
        await q.delete_handler("echo")
        with pytest.raises(NotFound):
            await q.get_handler("echo")


async def test_client_blobs_wasm_handlers_and_inputs(deployment: tuple[str, str, Path]) -> None:
    url, token, _ = deployment
    async with Client(url, "t", token) as q:
        module = await q.put_blob(bytes(wasmtime.wat2wasm(wat.echo())))
        assert module.startswith("sha256:") and await q.get_blob(module) == bytes(
            wasmtime.wat2wasm(wat.echo())
        )
        await q.add_handler("echo", "wasm", module=module, timeout=5)
        job_id = await q.add_input("echo", await q.put_blob(b"S: 201 made\n"))
        job = await q.wait(job_id, timeout=30)
        assert (job["exitcode"], job["result"]) == (201, "made"), job
        with pytest.raises(Conflict):
            await q.delete_blob(module)
        await q.delete_handler("echo")
        await q.delete_blob(module)
        with pytest.raises(NotFound):
            await q.get_blob(module)


async def test_the_readme_worker_runs_jobs_and_their_follow_ons(
    deployment: tuple[str, str, Path],
) -> None:
    url, token, _ = deployment

    async def resize(job: Job) -> str:
        if job.payload == "boom":
            raise ValueError("cannot resize boom")
        job.emit("thumbnail", {"of": job.payload})
        return f"resized {job.payload}"

    async with Client(url, "t", token) as q:
        await q.add_handler("resize", "worker", timeout=30, maxAttempts=1)
        await q.add_handler("thumbnail", "python", "def handler(p, ctx):\n    return p\n")
        ids = await q.add("resize", ["cat.jpg", "dog.jpg", "boom"])
        worker = Worker(q, "resize", resize, name="box-1", concurrency=4, batch=10, wait=1)
        running = asyncio.create_task(worker.run(handle_signals=False))
        jobs = [await q.wait(job_id, timeout=30) for job_id in ids]
        worker.stop()
        await asyncio.wait_for(running, 30)
        assert [j["result"] for j in jobs[:2]] == ["resized cat.jpg", "resized dog.jpg"]
        assert jobs[2]["exitcode"] == 500 and "cannot resize boom" in jobs[2]["result"]
        # the follow-on jobs were journaled with the complete; they reach the store
        # when the daemon ingests them, a moment later

        async def thumbnails() -> list[str] | None:
            found = sorted([j["payload"] async for j in q.jobs(type="thumbnail")])
            return found if len(found) >= 2 else None

        found = await until(thumbnails, 30, "the follow-on jobs in the store")
        assert found == ['{"of":"cat.jpg"}', '{"of":"dog.jpg"}']
        assert worker.completed == 3


async def test_a_worker_from_a_url_runs_a_plain_function_in_threads(
    deployment: tuple[str, str, Path],
) -> None:
    url, token, _ = deployment
    seen: list[tuple[str, int]] = []

    def size(job: Job) -> Any:
        seen.append((job.id, job.attempt))
        value = job.json()
        if value["w"] < 0:
            return 422, "negative width"
        if value["w"] == 0:
            return 404
        if value["w"] == 1:
            return {"a set is not JSON"}
        if value["w"] == 2:
            return asyncio.sleep(0)  # a coroutine, from a plain function
        return str(value["w"] * 2)

    async with Client(url, "t", token) as q:
        await q.add_handler("size", "worker", timeout=30, maxAttempts=1)
        ids = await q.add("size", [{"w": 4}, {"w": -1}, {"w": 0}, {"w": 1}, {"w": 2}])
        worker = Worker(url, "size", size, client="t", token=token, concurrency=8, wait=1)
        running = asyncio.create_task(worker.run(handle_signals=False))
        jobs = [await q.wait(job_id, timeout=30) for job_id in ids]
        worker.stop()
        await asyncio.wait_for(running, 30)
    assert [(j["exitcode"], j["result"]) for j in jobs[:3]] == [
        (200, "8"),
        (422, "negative width"),
        (404, None),
    ]
    assert jobs[3]["exitcode"] == 500 and "not JSON" in jobs[3]["result"], jobs[3]
    assert jobs[4]["exitcode"] == 500 and "async def" in jobs[4]["result"], jobs[4]
    assert sorted(seen) == sorted((job_id, 1) for job_id in ids)
    assert worker.completed == 5 and worker.lost == 0


def _cli(
    tmp_path: Path, url: str, token: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUEUE_URL": url, "QUEUE_CLIENT": "t", "QUEUE_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "queue_daemon", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )


def _worker_process(tmp_path: Path, url: str, token: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "QUEUE_URL": url,
        "QUEUE_CLIENT": "t",
        "QUEUE_TOKEN": token,
        "MARKS": str(tmp_path / "marks"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "queue_daemon", "worker", "run", *args, "--wait", "1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


async def test_the_job_command_line(deployment: tuple[str, str, Path]) -> None:
    url, token, tmp_path = deployment
    async with Client(url, "t", token) as q:
        await q.add_handler("echo", "python", "def handler(p, ctx):\n    return p\n")
    added = _cli(tmp_path, url, token, "job", "add", "echo", "-", stdin="one\ntwo\n")
    assert added.returncode == 0, added.stderr
    ids = json.loads(added.stdout)["ids"]
    waited = _cli(tmp_path, url, token, "job", "wait", ids[1], "--timeout", "30")
    assert json.loads(waited.stdout)["result"] == "two", waited
    got = _cli(tmp_path, url, token, "job", "get", ids[0], "--wait", "10")
    assert json.loads(got.stdout)["state"] == "done"
    listed = _cli(tmp_path, url, token, "job", "list", "--type", "echo")
    assert {j["id"] for j in json.loads(listed.stdout)["jobs"]} == set(ids)
    later = _cli(tmp_path, url, token, "job", "add", "echo", "{}", "--json", "--delay", "600")
    [later_id] = json.loads(later.stdout)["ids"]
    assert (
        json.loads(_cli(tmp_path, url, token, "job", "cancel", later_id).stdout)["code"] == "failed"
    )
    missing = _cli(tmp_path, url, token, "job", "get", "nosuchjob-1")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing
    assert "404" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "broken_mod.py").write_text("def f(job)\n    return 1\n")
    for spec in ("broken_mod:f", "jobs_mod:nothing", "no_such_mod:f", "jobs_mod"):
        bad = _cli(tmp_path, url, token, "worker", "run", spec, "--type", "echo")
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1, (spec, bad.stderr)
        assert "Traceback" not in bad.stderr, bad.stderr
    nowhere = _cli_without_a_url()
    assert nowhere.returncode == 2 and "--url" in nowhere.stderr


async def test_a_type_paused_and_resumed_by_the_library_and_the_command_line(
    deployment: tuple[str, str, Path],
) -> None:
    url, token, tmp_path = deployment
    async with Client(url, "t", token) as q:
        await q.add_handler("napping", "python", "def handler(p, ctx):\n    return p\n")
        assert await q.pause("napping") == {"type": "napping", "paused": True}
        [job_id] = await q.add("napping", ["z"])
        assert (await q.stats())["types"]["napping"]["paused"] is True
        assert await q.resume("napping") == {"type": "napping", "paused": False}
        assert (await q.wait(job_id, timeout=30))["result"] == "z"
        paused = _cli(tmp_path, url, token, "type", "pause", "napping")
        assert json.loads(paused.stdout) == {"type": "napping", "paused": True}, paused
        assert (await q.stats())["types"]["napping"]["paused"] is True
        resumed = _cli(tmp_path, url, token, "type", "resume", "napping")
        assert json.loads(resumed.stdout) == {"type": "napping", "paused": False}, resumed
    bad = _cli(tmp_path, url, token, "type", "pause", "no spaces")
    assert bad.returncode == 1 and "400" in bad.stderr and "Traceback" not in bad.stderr


async def test_failed_jobs_rerun_by_the_library_and_the_command_line(
    deployment: tuple[str, str, Path],
) -> None:
    url, token, tmp_path = deployment
    async with Client(url, "t", token) as q:
        await q.add_handler("mend", "python", "def handler(p, ctx):\n    return 404\n")
        one, two, three = await q.add("mend", ["1", "2", "3"])
        for job_id in (one, two, three):
            assert (await q.wait(job_id, timeout=30))["code"] == "failed"
        await q.add_handler("mend", "python", "def handler(p, ctx):\n    return p\n")
        assert (await q.rerun(one))["id"] == one
        assert (await q.wait(one, timeout=30))["code"] == "ok"
        rerun = _cli(tmp_path, url, token, "job", "rerun", two)
        assert json.loads(rerun.stdout)["id"] == two, rerun
        assert (await q.wait(two, timeout=30))["code"] == "ok"
        bulk = _cli(tmp_path, url, token, "job", "rerun-failed", "--type", "mend")
        assert json.loads(bulk.stdout) == {"rerun": 1}, bulk
        assert (await q.wait(three, timeout=30))["code"] == "ok"
        assert await q.rerun_failed("mend") == 0


def _cli_without_a_url() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "queue_daemon", "job", "get", "x"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")},
        check=False,
    )


async def test_two_worker_processes_share_the_jobs_each_done_once(
    deployment: tuple[str, str, Path], processes: list[subprocess.Popen[str]]
) -> None:
    url, token, tmp_path = deployment
    async with Client(url, "t", token) as q:
        await q.add_handler("resize", "worker", timeout=30)
        ids = await q.add("resize", [f"img{n}" for n in range(300)])
        for name in ("a", "b"):
            processes.append(
                _worker_process(
                    tmp_path, url, token, "jobs_mod:resize", "--type", "resize", "--name", name
                )
            )
        jobs = [await q.wait(job_id, timeout=60) for job_id in ids]
        assert all(j["result"] == f"resized {j['payload']}" for j in jobs)
        for job_id in ids[::10]:
            runs = (await q.get(job_id))["runs"]
            assert len(runs) == 1 and runs[0]["by"] in ("worker:a", "worker:b"), runs
    for proc in processes:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


async def test_sigterm_during_a_job_finishes_it(
    deployment: tuple[str, str, Path], processes: list[subprocess.Popen[str]]
) -> None:
    url, token, tmp_path = deployment
    (tmp_path / "marks").mkdir()
    async with Client(url, "t", token) as q:
        await q.add_handler("slow", "worker", timeout=30)
        [job_id] = await q.add("slow", "x")
        proc = _worker_process(tmp_path, url, token, "jobs_mod:slow", "--type", "slow")
        processes.append(proc)

        async def started() -> bool | None:
            return (tmp_path / "marks" / job_id).exists() or None

        await until(started, 30, "the job to start")
        proc.send_signal(signal.SIGTERM)  # mid-job: it finishes, then the worker exits
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
        job: dict[str, Any] = await q.get(job_id)
        assert job["state"] == "done" and job["result"] == "finished", job


def _readme_example() -> str:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## A client in Python", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_example_runs_as_written(deployment: tuple[str, str, Path]) -> None:
    url, token, _ = deployment
    code = _readme_example()
    assert "Worker(q, " in code
    code = code.replace("http://queue:8080", url).replace("qd_…", token)
    code = code.replace('"acme"', '"t"')
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "'result': 'resized a.jpg'" in done.stdout, done.stdout
