"""Shell handlers: /bin/sh -c in the sandbox, payload on stdin, exit status and S: lines."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult
from queue_daemon.runners.pool import RunnerPool, RunnerSettings
from queue_daemon.runners.shell import MAX_STDOUT

# RLIMIT_NPROC counts every process and thread of the shared run-as uid, including
# other contexts on this machine: the default 64 is too tight for tests that fork.
PROCESSES = 4096


@pytest.fixture
async def pool(work_root: Path) -> AsyncIterator[RunnerPool]:
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    yield pool
    await pool.close()


def exists(path: Path) -> bool:
    return path.exists()


async def run(pool: RunnerPool, body: str, *payloads: str, limit: float = 10) -> list[JobResult]:
    spec = HandlerSpec(
        version="v", client="acme", type="sh", lang="shell", body=body, timeout=limit
    )
    jobs = [JobInput(id=f"id-{i}", payload=p, attempt=1) for i, p in enumerate(payloads)]
    return await pool.run_batch(spec, jobs)


async def test_exit_status(pool: RunnerPool) -> None:
    (ok,) = await run(pool, "true", "x")
    assert (ok.exitcode, ok.result) == (200, None)
    (bad,) = await run(pool, "echo oops >&2; exit 3", "x")
    assert (bad.exitcode, bad.result) == (500, "exit status 3: oops")
    assert bad.log == ["stderr: oops"]
    (killed,) = await run(pool, "kill -9 $$", "x")
    assert (killed.exitcode, killed.result) == (500, "killed by SIGKILL")


async def test_status_lines_and_output(pool: RunnerPool) -> None:
    results = await run(
        pool,
        'read x; echo "log $x"; echo "J: next|$x"; echo "S: 404 no such $x"; exit 1',
        "a",
        "ünï|code\r",
    )
    assert [(r.exitcode, r.result) for r in results] == [
        (404, "no such a"),
        (404, "no such ünï|code"),  # a status line's trailing CR is dropped (CRLF output)
    ]
    assert results[0].log == ["log a"]
    assert results[1].emits == [("next", "ünï|code\r")]
    (plain,) = await run(pool, "echo 'S: 201'", "x")
    assert (plain.exitcode, plain.result) == (201, None)


async def test_payload_on_stdin(pool: RunnerPool) -> None:
    payload = '{"json": [1, 2], "s": "x y"}'
    (result,) = await run(pool, "cat", payload)
    assert result.log == [payload]
    big = "z" * (1 << 20)
    (ignored,) = await run(pool, "echo done", big)  # never reads its stdin
    assert (ignored.exitcode, ignored.log) == (200, ["done"])


async def test_timeout_kills_the_group(pool: RunnerPool) -> None:
    started = time.monotonic()
    fast, slow = await run(
        pool, 'read x; [ "$x" = slow ] && sleep 30; echo hi', "fast", "slow", limit=0.5
    )
    assert time.monotonic() - started < 5
    assert (fast.exitcode, fast.log) == (200, ["hi"])
    assert (slow.exitcode, slow.result) == (504, "timed out after 0.5s")


async def test_background_leftovers_do_not_hold_the_job(pool: RunnerPool) -> None:
    started = time.monotonic()
    (result,) = await run(pool, "sleep 30 & echo started", "x")
    assert result.exitcode == 200 and result.log == ["started"]
    assert time.monotonic() - started < 5


async def test_jobs_run_concurrently_in_a_private_dir(pool: RunnerPool, work_root: Path) -> None:
    started = time.monotonic()
    results = await run(pool, "sleep 0.3; pwd; id -u", *"abcdefgh")
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, (elapsed, results)  # 8 jobs, 4 at a time: ~0.6 s; 2.4 s one by one
    dirs = {r.log[0] for r in results}
    assert len(dirs) == 1
    (home,) = dirs
    assert Path(home).parent.parent == work_root  # in this pool's own d-<id> part
    assert not exists(Path(home))  # removed after the batch
    if os.geteuid() == 0:
        assert {r.log[1] for r in results} != {"0"}


async def test_a_line_cut_at_the_stdout_limit_is_no_follow_on_job(pool: RunnerPool) -> None:
    # whole "y" lines up to 10 bytes before the limit, then a J: line across it:
    # only "J: kid|zzz" of it would fit, and must not become a job with a cut payload
    filler = MAX_STDOUT - 10
    body = f"yes y | head -c {filler}; echo 'J: kid|{'z' * 100}'; echo 'S: 201 done'"
    (result,) = await run(pool, body, "x", limit=60)
    assert result.emits == []
    assert (result.exitcode, result.result) == (200, None), "the S: line was cut off too"
